# Two targets a newcomer runs on a fresh machine: `make demo` and `make test`.
# Each creates .venv if it is missing and installs the project into it.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Keep DeepSpeed's JIT-built ops between runs (the first build takes tens of seconds), one folder per
# checkout: two checkouts' virtualenvs hold DeepSpeed's sources at different paths, so a shared folder
# is rebuilt by each in turn, and a build killed mid-way leaves a lock that hangs every later run.
export TORCH_EXTENSIONS_DIR ?= $(CURDIR)/$(VENV)/torch_extensions
export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS ?= 90
export PREFECT_SERVER_ANALYTICS_ENABLED ?= false
export TOKENIZERS_PARALLELISM ?= false
export RAY_USAGE_STATS_ENABLED ?= 0
export HF_HUB_OFFLINE ?= 1

.PHONY: demo test test-fast fuzz bench bench-data install clean system-deps

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch is pinned to the CPU wheel (pyproject.toml); any other spec pulls a multi-GB CUDA build.
	$(BIN)/python -m pip install -q "torch==2.13.0"
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m flows.demo

test: $(STAMP) system-deps
	$(BIN)/python -m pytest -q

# Debian's headless chromium for the Prefect UI test: installed where this runs as root with apt-get
# (CI, containers); elsewhere the UI test skips and says why. Never fails the target.
system-deps:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 \
	  || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
	       && echo "make: installing Debian's chromium for the UI test (apt-get)" \
	       && apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } \
	  || echo "make: chromium not installed and not installable here (needs root and apt-get); the UI test will skip"

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow"

# The generator-based hostile tests (issue 24) with many examples (the suite runs them short and seeded):
# BERTFLOW_FUZZ_EXAMPLES per property (default 2000); interesting cases are kept in .hypothesis/ between runs.
FUZZ_TESTS := tests/contracts/test_fuzz_config.py tests/data_jobs/test_fuzz_readers.py tests/data_jobs/test_fuzz_formats.py tests/data_jobs/test_fuzz_shard.py tests/evaluation/test_fuzz_eval_readers.py tests/contracts/test_fuzz_records.py tests/contracts/test_fuzz_records_s3.py
fuzz: $(STAMP)
	BERTFLOW_FUZZ=long $(BIN)/python -m pytest -q -p no:cacheprovider $(FUZZ_TESTS)

bench: $(STAMP) $(ORIGINAL_VENV)/.installed
	for f in bench/bench_*.py; do $(BIN)/python $$f || exit 1; done

# Google's original create_pretraining_data.py, in its own virtualenv (never imported by bertflow).
ORIGINAL_VENV ?= /tmp/bert-original
$(ORIGINAL_VENV)/.installed:
	test -x $(ORIGINAL_VENV)/bin/python || $(PY) -m venv $(ORIGINAL_VENV)
	$(ORIGINAL_VENV)/bin/python -m pip install -q --no-deps bert-tensorflow==1.0.4
	touch $@

# Data preparation against the original script and bare tokenizers, side by side (~15-30 min).
bench-data: $(STAMP) $(ORIGINAL_VENV)/.installed
	$(BIN)/python bench/bench_data_prep.py --original-venv $(ORIGINAL_VENV)

clean:
	rm -rf $(VENV) runs .pytest_cache
