"""Shared fixtures. Tests needing ../shared/data skip with a clear reason where it is absent."""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("BERTFLOW_SHARED_DATA", REPO.parent / "shared" / "data"))

# Quiet, offline, deterministic defaults for every test process and the processes it starts.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
if "BERTFLOW_LOADER_CACHE" not in os.environ:  # the loader's decoded copies: not in ~/.cache
    os.environ["BERTFLOW_LOADER_CACHE"] = tempfile.mkdtemp(prefix="bertflow-loader-cache-")
    atexit.register(shutil.rmtree, os.environ["BERTFLOW_LOADER_CACHE"], True)

# Prefect sets up its logging once, on first import, bound to the sys.stderr of that moment. Import it here,
# while pytest collects (its session-long capture), not first inside a test whose capsys stream is closed
# after that test: every later flow's log line would then fail on a closed file.
import prefect.main  # noqa: E402,F401

# torch's thread count as a fresh process has it. A test that calls an evaluation job function directly
# pins torch to the job's threads_per_task; left so, every later test in this process would compute with
# other float sums than the same code in a fresh process (the s3 demo then differed from the local one).
import torch  # noqa: E402
from fresh import FRESH_TORCH_THREADS  # noqa: E402


@pytest.fixture(autouse=True)
def _torch_threads_restored():
    yield
    if torch.get_num_threads() != FRESH_TORCH_THREADS:
        torch.set_num_threads(FRESH_TORCH_THREADS)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """Path of ../shared/data; skips the test where it is absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"needs the real data in {SHARED_DATA} (absent on this machine)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def bert_uncased_vocab(shared_data: Path) -> Path:
    return shared_data / "vocab" / "bert-base-uncased-vocab.txt"


@pytest.fixture(scope="session")
def ray_local():
    """One real local Ray cluster (2 CPUs, no dashboard) shared by the whole session."""
    ray = pytest.importorskip("ray")
    if not ray.is_initialized():
        ray.init(
            address="local",
            num_cpus=2,
            include_dashboard=False,
            log_to_driver=False,
            runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "false", "RAYON_NUM_THREADS": "1"}},
        )
    yield ray
    # left running for the session; shut down at exit


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """One real S3-compatible server (moto's server mode) on 127.0.0.1 for the session."""
    pytest.importorskip("moto")
    from s3_server import S3Server

    server = S3Server(tmp_path_factory.mktemp("s3")).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_env(s3_server, monkeypatch):
    """This process pointed at the test server (AWS_* variables, as a user sets them), and a fresh bucket:
    yields ``s3://<bucket>``."""
    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    return f"s3://{s3_server.new_bucket()}"


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    """Node-local scratch for what goes to or comes from an object store: a fresh folder of this test."""
    path = tmp_path / "scratch"
    path.mkdir()
    monkeypatch.setenv("BERTFLOW_SCRATCH", str(path))
    return path
