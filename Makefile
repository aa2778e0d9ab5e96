# The two set-up commands of the README are `make demo` and `make test`; both create the
# virtual environment themselves from pyproject.toml.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench bench-quick clean test-deps

include deploy/kafka/kafka.mk
include deploy/postgres/postgres.mk

$(STAMP): pyproject.toml $(wildcard streamfilter/engine/*.c streamfilter/privacy/*.c streamfilter/runtime/store/*.c)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	$(BIN)/python -m compileall -q streamfilter  # the bytecode a wheel install compiles
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/streamfilter demo

lint: $(STAMP)
	$(BIN)/ruff check streamfilter tests benchmarks
	$(BIN)/ruff format --check streamfilter tests benchmarks
	$(BIN)/mypy streamfilter benchmarks

# External components the suite runs for real (Kafka comes from deploy/kafka via the fixtures;
# Prometheus and Chromium from Debian packages). Installed when missing, as root.
test-deps:
	@if [ "$$(id -u)" = 0 ] || command -v sudo >/dev/null; then bash deploy/install-test-deps.sh; \
	else echo "not root: Prometheus/Chromium tests skip locally if the packages are missing"; fi

# one worker per core (pytest-xdist); each worker starts its own Kafka and PostgreSQL
test: lint test-deps
	$(BIN)/pytest -n auto

# The suite writes benchmarks/results.{json,md} (README "Benchmarks"); each entry is the median of
# >= 5 runs next to its baseline. The Kafka entry starts its own broker the way the tests do
# (deploy/kafka, free ports) unless KAFKA_BOOTSTRAP names one; `make bench` fails without one.
bench: $(STAMP)
	$(BIN)/python -m pip install -q -e '.[dev,bench]'
	$(BIN)/python -m benchmarks.run

# CI smoke, under a minute (tests/system/test_bench_quick.py runs it in CI on the session's broker
# and holds it to 60 s): small sizes, fewer runs, results-quick.{json,md} (not committed); the
# Kafka entry is skipped when no broker can be started here.
bench-quick: $(STAMP)
	$(BIN)/python -m benchmarks.run --quick

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
