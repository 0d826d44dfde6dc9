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
	$(PY) -m gdn_export.demo

test: install
	$(PY) -m pytest -q tests

clean:
	rm -rf $(VENV) build *.egg-info

# The Linux checks of metal_backend (emulated kernels, shims, planning, graph); prints "N passed, M failed".
metal-check: install
	$(PY) -m metal_backend.check

# ExecuTorch's CUDA backend runtime (and its matching lowering) from ExecuTorch's source at the
# pinned revision, into build/cuda_runtime/: EXECUTORCH_SRC=DIR builds from a source folder,
# EXECUTORCH_MIRROR=GIT_DIR makes build/executorch-src from a git mirror, and with neither the
# revision is cloned. Needs a C++ compiler and the CUDA toolkit's headers (see cuda_backend/README.md).
cuda-runtime: install
	$(PY) -m cuda_backend.executorch_runtime build $(if $(EXECUTORCH_SRC),--executorch-src $(EXECUTORCH_SRC)) \
		$(if $(EXECUTORCH_MIRROR),--mirror $(EXECUTORCH_MIRROR))
