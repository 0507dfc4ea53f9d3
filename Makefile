# The two commands of the README: `make demo` (set up + main job on the built-in tiny model)
# and `make test` (set up + ruff + the whole test suite).
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

lint: install
	$(VENV)/bin/ruff check src tests benchmarks scripts

test: lint
	scripts/install-vllm.sh --if-possible
	$(PY) -m pytest tests

test-fast: lint
	$(PY) -m pytest tests -m "not slow"

clean:
	rm -rf work
