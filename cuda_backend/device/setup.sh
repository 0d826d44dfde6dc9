#!/usr/bin/env bash
# Wheels for the lent GPU machine (Python 3.12, torch 2.11 + triton 3.6, no network there).
# Run once HERE, in the repo root; the `run` call then carries .whl (git-ignored).
set -euo pipefail
cd "$(dirname "$0")/../.."
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
           --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
# executorch (CudaBackend lowering + its anchor kernels), its import-time needs the
# device image lacks (torchao, ruamel.yaml), fla-core (benchmark reference; einops is there),
# and transformers 5.23 (the e2e step's reference; the image has 5.17) with the regex it
# asks for at import (the image's other transformers needs are new enough).
python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${PLATFORMS[@]}" -d .whl executorch==1.5.1 "torchao>=0.18,<0.19" ruamel.yaml fla-core==0.6.0 \
    transformers==5.23.0 "regex>=2025.10.22"
du -sh .whl
