"""Fixtures of the scale-out tests: one real two-node Ray cluster on 127.0.0.1, shared by tests/scale."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # scale_support, beside this file

from scale_support import TALLY, RayCluster  # noqa: E402


@pytest.fixture(scope="package")
def two_node_cluster(tmp_path_factory):
    """A head and a worker node (1 CPU each, resources ``head`` / ``worker_node``), token auth on.

    Each node has its own temp dir and ports, so the local Ray clusters other tests start with
    ``ray.init(address="local")`` are not disturbed; teardown kills exactly this cluster's processes.
    """
    pytest.importorskip("ray")
    cluster = RayCluster(tmp_path_factory.mktemp("ray2"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def pytest_terminal_summary(terminalreporter):
    """The bad-input battery's tally: how many cases an entry point handled as it should."""
    total = sum(TALLY.values())
    if total:
        terminalreporter.write_line(
            f"bad-input battery: {TALLY['passed']} of {total} cases pass "
            f"({TALLY['failed']} fail, {TALLY['skipped']} skipped)"
        )
