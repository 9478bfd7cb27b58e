"""Fixtures of the scale-out tests: one real two-node Ray cluster on 127.0.0.1 per module that asks for it."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # scale_support, beside this file

from scale_support import RayCluster  # noqa: E402


@pytest.fixture(scope="module")
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
