# The two set-up commands of the README are `make demo` and `make test`; both create the
# virtual environment themselves from pyproject.toml.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench bench-quick clean test-deps

include deploy/kafka/kafka.mk

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/streamfilter demo

lint: $(STAMP)
	$(BIN)/ruff check streamfilter tests benchmarks
	$(BIN)/ruff format --check streamfilter tests benchmarks
	$(BIN)/mypy streamfilter

test: lint
	$(BIN)/pytest

bench: $(STAMP)
	$(BIN)/python -m benchmarks.run

bench-quick: $(STAMP)
	$(BIN)/python -m benchmarks.run --quick

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
