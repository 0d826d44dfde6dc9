#!/usr/bin/env bash
# The unchanged Metal kernels on an NVIDIA GPU, in one device call (about 5 minutes): the CUDA port
# (cuda_port.cu + include/metal_stdlib) built with nvcc, the conformance rows against the fp64 reference,
# a short list of them under compute-sanitizer memcheck and racecheck, and relative timings.
#   run(command="cd .gdn-carry/metal && bash metal_backend/device/run_on_device.sh", carry=[".gdn-carry"])
# from a copy holding gdn_export/, metal_backend/ and, to skip the build there, the build/metal_emulation/
# that cuda_port.py fills here. BASELINE_KERNEL=<a .metal file> times that revision of the kernels too.
# Needs python3 with PyTorch (CUDA), nvcc and compute-sanitizer; logs go to $OUT (default build/metal_device).
set -uo pipefail
OUT=${OUT:-build/metal_device}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/device.txt"
python3 -c "import torch; print('torch', torch.__version__)" | tee -a "$OUT/device.txt"
status=0

timeout 120 python3 -c "from metal_backend.device import cuda_port; print('built', cuda_port.library()._name)" \
    2>&1 | tee "$OUT/build.log" || exit 1

timeout 180 python3 -m metal_backend.device.conformance_rows --selection all > "$OUT/rows.log" 2>&1 || status=1
grep -v "^PASS" "$OUT/rows.log" | tail -20

# Only our kernels are instrumented; without the caching allocator every tensor is its own
# allocation, so memcheck sees an access past a tensor's end.
filter=()
compute-sanitizer --help 2>/dev/null | grep -q -- "--kernel-name" && filter=(--kernel-name kns=gdn_cuda)
for tool in memcheck racecheck; do
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 150 compute-sanitizer --tool "$tool" "${filter[@]}" --error-exitcode 9 \
      python3 -m metal_backend.device.conformance_rows --selection sanitizer --seed 1 > "$OUT/$tool.log" 2>&1 \
      || status=1
  echo "== $tool (${filter[*]:-all kernels})"
  grep -E "^(FAIL|conformance rows)|SUMMARY|rror" "$OUT/$tool.log" | tail -6
done

timeout 60 python3 -m metal_backend.device.conformance_rows --timing --seed 1 2>&1 | tee "$OUT/timing.log" || status=1
if [ -n "${BASELINE_KERNEL:-}" ]; then
  GDN_CUDA_PORT_KERNEL=$BASELINE_KERNEL timeout 120 python3 -m metal_backend.device.conformance_rows --timing \
      --seed 1 2>&1 | tee -a "$OUT/timing.log" || status=1
fi
exit $status
