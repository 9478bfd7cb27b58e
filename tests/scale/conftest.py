"""Fixtures of the scale-out tests: one real two-node Ray cluster on 127.0.0.1, shared by tests/scale."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # scale_support, beside this file

from hostile_check import SECONDS, TALLY  # noqa: E402
from scale_support import DS_ARGS, REPO, RayCluster, base_env, free_port, run_cli  # noqa: E402
from hang import HANG_S  # noqa: E402  (the suite's one hang guard)


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


@pytest.fixture(scope="package")
def ds_reference(tmp_path_factory) -> dict:
    """One ``torchrun --nproc_per_node 2`` DeepSpeed ZeRO-2 run on a small instances dataset: the
    single-launcher reference the two-node launches (torchrun, Ray Train) are compared with."""
    sys.path.insert(0, str(REPO / "tests" / "bert_core"))
    from train_helpers import write_dataset

    root = tmp_path_factory.mktemp("dsref")
    data = write_dataset(root / "data", n=64, vocab_size=100, max_seq=32)
    proc = run_cli(["-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
                    "--master_port", str(free_port()), "-m", "bert_core.train", "--launcher", "torchrun",
                    "--data-dir", str(data), "--output-dir", str(root / "run"), *DS_ARGS], base_env(), timeout=HANG_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {"data": data, "run": root / "run"}


def pytest_terminal_summary(terminalreporter):
    """The hostile battery's one tally (tests/scale/test_hostile.py): cases that passed every check of
    hostile_check.verify, of all that ran, and how many went through each entry point."""
    ran = {e: sum(t.values()) for e, t in TALLY.items()}
    total = sum(ran.values())
    if total:
        passed = sum(t["passed"] for t in TALLY.values())
        failed = sum(t["failed"] for t in TALLY.values())
        skipped = sum(t["skipped"] for t in TALLY.values())
        per_entry = ", ".join(f"{e} {n}" for e, n in ran.items())
        extra = "".join(f", {n} {what}" for n, what in ((failed, "fail"), (skipped, "skipped")) if n)
        terminalreporter.write_line(f"hostile battery: {passed} of {total} cases pass ({per_entry}){extra}")
    if SECONDS:
        slow = sorted(SECONDS.items(), key=lambda kv: -kv[1])[:5]
        terminalreporter.write_line(
            f"hostile battery: {len(SECONDS)} case processes, {sum(SECONDS.values()):.0f} s in all; slowest: "
            + ", ".join(f"{n} {s:.1f} s" for n, s in slow))
