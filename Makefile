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

# External components the suite runs for real (Kafka comes from deploy/kafka via the fixtures;
# Prometheus and Chromium from Debian packages). Installed when missing, as root.
test-deps:
	@if [ "$$(id -u)" = 0 ] || command -v sudo >/dev/null; then bash deploy/install-test-deps.sh; \
	else echo "not root: Prometheus/Chromium tests skip locally if the packages are missing"; fi

test: lint test-deps
	$(BIN)/pytest

bench: $(STAMP)
	$(BIN)/python -m benchmarks.run

bench-quick: $(STAMP)
	$(BIN)/python -m benchmarks.run --quick

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
