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

# The Linux checks of metal_backend (emulated kernels, shims, planning, graph); prints "N passed, M failed".
metal-check: install
	$(PY) -m metal_backend.check
