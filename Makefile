# The two commands of the README: `make demo` (set up + main job on the built-in tiny model)
# and `make test` (set up + `make lint` + the whole test suite).
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
WORK ?= work/demo

.PHONY: install install-vllm demo lint test test-fast clean

$(VENV)/.installed: pyproject.toml constraints/quant.txt scripts/install.sh
	QWENQUANT_VENV=$(VENV) scripts/install.sh
	touch $@

install: $(VENV)/.installed

install-vllm: install
	scripts/install-vllm.sh

demo: install
	scripts/install-vllm.sh --if-possible
	$(VENV)/bin/qwenquant demo --work $(WORK)

# The rules README and docs/DEVELOPING.md state, checked: ruff check (with RUF100: no unused `noqa`) and ruff
# format --check, mypy over src
# (pyproject's [tool.mypy]: every module, none exempt), and the house tests (the layer
# order, no import cycles, module and function sizes).
HOUSE_TESTS := tests/unit/test_layers.py tests/unit/test_import_cycles.py tests/unit/test_sizes.py

lint: install
	$(VENV)/bin/ruff check src tests benchmarks scripts
	# ruff format --check: the whole tree is formatted (one commit of its own)
	$(VENV)/bin/ruff format --check src tests benchmarks scripts
	$(VENV)/bin/mypy
	$(PY) -m pytest -q $(HOUSE_TESTS)

test: lint
	scripts/install-vllm.sh --if-possible
	$(PY) -m pytest tests

test-fast: lint
	$(PY) -m pytest tests -m "not slow"

clean:
	rm -rf work
