"""Fixtures for the flow tests: one Prefect test harness and one real Prefect server per session.
Everything that starts processes stops exactly those."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from flowtest_support import BIN, free_port, stop, wait_http


@pytest.fixture(scope="session")
def corpus_file(shared_data: Path) -> Path:
    return shared_data / "corpus" / "bert_sample" / "sample_text.txt"


@pytest.fixture(scope="session")
def harness():
    """One ephemeral Prefect API for the session (each start costs about 9 s)."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        from prefect.settings import PREFECT_API_URL

        yield PREFECT_API_URL.value()


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory):
    """A real ``prefect server start`` on 127.0.0.1 and a free port, with its own home and database."""
    home = tmp_path_factory.mktemp("prefect_home")
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = {
        **os.environ,
        "PREFECT_HOME": str(home),
        "PREFECT_API_URL": api,
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_UI_API_URL": api,
        "PREFECT_LOGGING_LEVEL": "INFO",
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    env.pop("PREFECT_PROFILES_PATH", None)
    log = home / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
            env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
    try:
        wait_http(f"{api}/health", proc, 120, log)
        yield {"api": api, "ui": f"http://127.0.0.1:{port}", "env": env, "home": home}
    finally:
        stop(proc)
