# gdn-export: the two first-screen commands are `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed

.PHONY: install demo test clean metal-check cuda-runtime

install: $(INSTALLED)

$(INSTALLED): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -e '.[test]'
	$(PY) -m runtime_ops.build
	touch $(INSTALLED)

demo: install
	$(PY) examples/demo.py

test: install
	$(PY) -m pytest -q tests

clean:
	rm -rf $(VENV) build *.egg-info

# The Linux checks of metal_backend (emulated kernels, shims, planning, graph); prints "N passed, M failed",
# then the stricter compilers by name (metal_backend/strict_check.py). Those need clang
# (apt-get install -y clang) and ExecuTorch's Metal runtime headers: EXECUTORCH_SOURCE_DIR=<a checkout>,
# or EXECUTORCH_GIT_DIR=<a git directory holding strict_check.EXECUTORCH_COMMIT> (the default: this
# workplace's mirror, when present). `make test` needs neither.
EXECUTORCH_GIT_DIR ?= $(wildcard /work/.mirror/pytorch+executorch/repo)
metal-check: install
	EXECUTORCH_GIT_DIR="$(EXECUTORCH_GIT_DIR)" $(PY) -m metal_backend.check

# ExecuTorch's CUDA backend runtime (and its matching lowering) from ExecuTorch's source at the
# pinned revision, into build/cuda_runtime/: EXECUTORCH_SRC=DIR builds from a source folder,
# EXECUTORCH_MIRROR=GIT_DIR makes build/executorch-src from a git mirror, and with neither the
# revision is cloned. Needs a C++ compiler and the CUDA toolkit's headers (see cuda_backend/README.md).
cuda-runtime: install
	$(PY) -m cuda_backend.executorch_runtime build $(if $(EXECUTORCH_SRC),--executorch-src $(EXECUTORCH_SRC)) \
		$(if $(EXECUTORCH_MIRROR),--mirror $(EXECUTORCH_MIRROR))
