# `make demo` and `make test` each bootstrap .venv with the system python3 if it is missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test unit lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[test,otel]'
	touch $@ $(VENV)/.installed

demo: $(VENV)/.installed
	$(BIN)/tether demo

# Two pytest processes (pytest-xdist): run one at a time, the process tests (which start Python processes and wait on
# them) keep about one core busy. `pytest` alone runs the suite, or a test, in one process.
test: $(VENV)/.installed-test lint
	$(BIN)/python -m pytest -q -n 2 --dist worksteal

unit: $(VENV)/.installed-test
	$(BIN)/python -m pytest -q tests/unit

lint: $(VENV)/.installed-test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

bench: $(VENV)/.installed-test
	$(BIN)/python bench/commit_throughput.py
	$(BIN)/python bench/tasks.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
