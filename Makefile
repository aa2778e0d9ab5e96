# The two set-up commands of the README are `make demo` and `make test`; both create the
# virtual environment themselves from pyproject.toml.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench bench-quick clean test-deps mutants sanitize

include deploy/kafka/kafka.mk
include deploy/postgres/postgres.mk

# PYTHONWARNINGS: setuptools' editable build prints a notice on import precedence (the package
# sits at the repository root, as intended); a fresh install prints nothing but real problems
$(STAMP): pyproject.toml setup.py $(wildcard streamfilter/*/*.c streamfilter/_native/*.h)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	PYTHONWARNINGS="ignore:Editable installation" $(BIN)/python -m pip install -q -e '.[dev]'
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

# Mutation check of the privacy core (tests/support/mutants.py): each mutant (admission, rounding, σ
# calibration, continual-counting noise, odometer, conversions) must be killed by its named test;
# a survivor fails. A few minutes on 2 cores, so a target of its own that .ci/run calls.
mutants: $(STAMP)
	$(BIN)/python -m tests.support.mutants

# The suite writes benchmarks/results.{json,md} (docs/performance.md); each entry is the median of
# >= 5 runs next to its baseline. The Kafka entry starts its own broker the way the tests do
# (deploy/kafka, free ports) unless KAFKA_BOOTSTRAP names one; `make bench` fails without one.
bench: $(STAMP)
	PYTHONWARNINGS="ignore:Editable installation" $(BIN)/python -m pip install -q -e '.[dev,bench]'
	$(BIN)/python -m benchmarks.run

# CI smoke, under a minute (tests/system/test_bench_quick.py runs it in CI on the session's broker
# and holds it to 60 s): small sizes, fewer runs, results-quick.{json,md} (not committed); the
# Kafka entry is skipped when no broker can be started here.
bench-quick: $(STAMP)
	$(BIN)/python -m benchmarks.run --quick

# The native extensions built with AddressSanitizer + UndefinedBehaviorSanitizer (into
# build/sanitize, next to a copy of the package: the installed build is left alone), then their
# tests and a short hypothesis fuzz of the scanner against the reference, every extension forced
# (STREAMFILTER_IMPL=native) and every allocation through malloc (PYTHONMALLOC) so that ASan sees
# it. FUZZ_EXAMPLES sets the fuzz's batches (1000).
SANITIZE_DIR := build/sanitize
SANITIZE_FLAGS := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g -O1
SANITIZE_ENV := PYTHONPATH=$(SANITIZE_DIR)/lib STREAMFILTER_IMPL=native PYTHONMALLOC=malloc \
	LD_PRELOAD=$$($(CC) -print-file-name=libasan.so) ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 \
	UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
NATIVE_TESTS := tests/_native tests/engine/test_native_scanner.py tests/engine/test_ingest.py \
	tests/engine/test_lines.py tests/engine/test_packed_ids.py tests/engine/test_user_codes.py \
	tests/engine/test_pair_set.py tests/engine/test_cell_table.py tests/engine/test_partitions.py \
	tests/privacy/test_filter.py

sanitize: $(STAMP)
	rm -rf $(SANITIZE_DIR) && mkdir -p $(SANITIZE_DIR)/lib
	cp -r streamfilter $(SANITIZE_DIR)/lib/
	find $(SANITIZE_DIR)/lib -name '*.so' -delete
	$(BIN)/python -m pip install -q "setuptools>=77"  # the version pyproject.toml builds with
	STREAMFILTER_CFLAGS="$(SANITIZE_FLAGS)" $(BIN)/python setup.py -q build_ext \
		--build-lib $(SANITIZE_DIR)/lib --build-temp $(SANITIZE_DIR)/tmp
	$(SANITIZE_ENV) $(BIN)/python -m pytest -q -p no:cacheprovider $(NATIVE_TESTS)
	$(SANITIZE_ENV) $(BIN)/python tests/system/fuzz_scanner.py

clean:
	rm -rf $(VENV) build .pytest_cache .mypy_cache .ruff_cache
