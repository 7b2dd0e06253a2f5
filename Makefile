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

# Three pytest processes (pytest-xdist) on the 2 cores CI has: most process tests wait on the processes they start
# (an idle tether up is measured for 35 s), so a third keeps both cores busy. Measured on this 2-core machine, one
# sitting: -n 2 took 567 s (the browser tests skipped), -n 3 480 s (with them). `pytest` alone runs the suite, or a
# test, in one process.
test: $(VENV)/.installed-test lint
	$(BIN)/python -m pytest -q -n 3 --dist worksteal

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
