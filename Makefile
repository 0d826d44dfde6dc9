# gdn-export: the two first-screen commands are `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed

.PHONY: install demo test clean metal-check

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
