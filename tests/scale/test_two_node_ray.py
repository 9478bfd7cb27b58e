"""The data jobs and Ray Train + DeepSpeed on a real two-node Ray cluster (head + worker node on
127.0.0.1, token auth on), against single-node runs; and the worker node killed mid instance job.

Every job runs as its CLI in a subprocess joining the cluster with ``--ray-address``, as it would on a
real cluster; which node ran which task is read back from Ray's state API. The tests run in file order
and share one cluster: the node-failure test is last because it kills the worker node.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hang import HANG_S  # noqa: E402  (the suite's one hang guard)

from scale_support import DS_ARGS, REPO, base_env, losses, run_cli, tree_bytes, write_corpus

pytestmark = [pytest.mark.ray, pytest.mark.slow]

NUM_SHARDS = 6
INSTANCE_FLAGS = ["--max-seq-length", "32", "--max-predictions-per-seq", "5", "--dupe-factor", "6",
                  "--random-pool-docs", "40", "--seed", "3", "--num-workers", "2"]

REFERENCE = """
import sys
from contracts.common import build_config
from data_jobs import instances_job, shard_job, vocab_job
from data_jobs.config import InstancesConfig, ShardConfig, VocabConfig
corpus, root = sys.argv[1:3]
shard_job.run(build_config(ShardConfig, dict(inputs=[corpus], input_format="bert", output_dir=root + "/docs",
                                             num_shards=%d, num_workers=1)))
vocab_job.run(build_config(VocabConfig, dict(shards_dir=root + "/docs", output_dir=root + "/vocab",
                                             vocab_size=120, min_frequency=1)))
instances_job.run(build_config(InstancesConfig, dict(shards_dir=root + "/docs", vocab_dir=root + "/vocab",
    output_dir=root + "/inst", max_seq_length=32, max_predictions_per_seq=5, dupe_factor=6, random_pool_docs=40,
    seed=3, num_workers=1)))
""" % NUM_SHARDS


# A job's CLI whose Ray tasks are pinned round-robin to the given nodes (hard node affinity): where a
# test checks that a job spans both nodes, placement is forced, not hoped for (under load Ray may run
# every task of a job on one node, reusing a worker lease). The job's own code runs unchanged.
PINNED = r"""
import importlib, itertools, sys, ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
turn = itertools.cycle(sys.argv[2].split(","))
real_remote = ray.remote
class Pinned:
    def __init__(self, fn, opts): self.fn, self.opts = fn, opts
    def options(self, **kw): return Pinned(self.fn, {**self.opts, **kw})
    def remote(self, *args, **kw):
        where = NodeAffinitySchedulingStrategy(next(turn), soft=False)
        return self.fn.options(**self.opts, scheduling_strategy=where).remote(*args, **kw)
ray.remote = lambda *a, **k: (lambda fn: Pinned(real_remote(*a, **k)(fn), {}))
job = importlib.import_module(sys.argv[1])
raise SystemExit(job.main(sys.argv[3:]))
"""


def _pinned(cluster, module_args: list[str]) -> list[str]:
    """``["-m", module, *args]`` as a PINNED run over both of ``cluster``'s nodes."""
    assert module_args[0] == "-m"
    nodes = ",".join(sorted(cluster.node_ids().values()))
    return ["-c", PINNED, module_args[1], nodes, *module_args[2:]]


def _ok(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, f"rc {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus") / "text", files=4, docs_per_file=40)


@pytest.fixture(scope="module")
def single_node(corpus, tmp_path_factory) -> Path:
    """Shard, vocab and instances on a single-node local Ray cluster (1 worker): the reference."""
    root = tmp_path_factory.mktemp("single")
    _ok(run_cli(["-c", REFERENCE, str(corpus), str(root)], base_env(), timeout=HANG_S))
    return root


def _instances_cmd(cluster, docs: Path, vocab: Path, out: Path) -> list[str]:
    return ["-m", "data_jobs.instances_job", "--shards-dir", str(docs), "--vocab-dir", str(vocab),
            "--output-dir", str(out), "--ray-address", cluster.address, *INSTANCE_FLAGS]


def test_shard_job_spans_both_nodes_and_matches_single_node(two_node_cluster, corpus, single_node, tmp_path_factory):
    cluster = two_node_cluster
    before = set(cluster.task_nodes())
    out = tmp_path_factory.mktemp("two") / "docs"
    _ok(run_cli(_pinned(cluster, ["-m", "data_jobs.shard_job", "--input", str(corpus), "--format", "bert",
                                  "--output-dir", str(out), "--num-shards", str(NUM_SHARDS), "--num-workers", "2",
                                  "--ray-address", cluster.address]), cluster.env))
    jobs = cluster.task_nodes(exclude_jobs=before)
    assert len(jobs) == 1, jobs
    assert {node for _, node in next(iter(jobs.values()))} == set(cluster.node_ids().values()), jobs
    ref = single_node / "docs"
    assert tree_bytes(out) == tree_bytes(ref) and len(tree_bytes(ref)) == NUM_SHARDS
    a, b = json.loads((out / "manifest.json").read_text()), json.loads((ref / "manifest.json").read_text())
    assert a["files"] == b["files"] and a["totals"] == b["totals"]


def test_instances_job_spans_both_nodes_and_matches_single_node(two_node_cluster, single_node, tmp_path_factory):
    cluster = two_node_cluster
    before = set(cluster.task_nodes())
    out = tmp_path_factory.mktemp("two") / "inst"
    _ok(run_cli(_pinned(cluster, _instances_cmd(cluster, single_node / "docs", single_node / "vocab", out)),
                cluster.env))
    jobs = cluster.task_nodes(exclude_jobs=before)
    assert len(jobs) == 1, jobs
    nodes = {node for name, node in next(iter(jobs.values())) if name in ("build_pool_part", "process_shard")}
    assert nodes == set(cluster.node_ids().values()), jobs
    ref = tree_bytes(single_node / "inst")
    assert len(ref) >= NUM_SHARDS and tree_bytes(out) == ref


@pytest.mark.deepspeed
def test_ray_train_deepspeed_one_worker_per_node(two_node_cluster, ds_reference, tmp_path):
    """Two Ray Train workers with 1 CPU each on nodes with 1 CPU each: one per node, by construction;
    the state API confirms it. ZeRO-2 over gloo between the two nodes; the losses equal those of
    one ``torchrun --nproc_per_node 2`` launch of the same config."""
    cluster = two_node_cluster
    out = tmp_path / "run"
    _ok(run_cli(["-m", "bert_core.train", "--launcher", "ray", "--ray-address", cluster.address, "--num-workers", "2",
                 "--data-dir", str(ds_reference["data"]), "--output-dir", str(out), *DS_ARGS], cluster.env, timeout=HANG_S))
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3]
    state = json.loads((out / "checkpoints" / "step_00000003" / "trainer_state.json").read_text())
    assert state["world_size"] == 2 and state["zero_stage"] == 2
    workers = cluster.actor_nodes("RayTrainWorker")
    assert len(workers) == 2 and set(workers) == set(cluster.node_ids().values()), workers
    assert losses(out) == losses(ds_reference["run"])


def test_worker_node_killed_mid_instance_job(two_node_cluster, single_node, tmp_path):
    """SIGKILL the worker node (raylet, its workers, agents) once the first shard of the instance job
    is done: the lost task is retried on the head, and the output is byte-identical."""
    cluster = two_node_cluster
    worker_id = cluster.node_ids()["worker_node"]
    out = tmp_path / "inst"
    log = open(tmp_path / "job.log", "w")
    proc = subprocess.Popen([sys.executable, *_instances_cmd(cluster, single_node / "docs", single_node / "vocab", out)],
                            env=cluster.env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + HANG_S
    while time.monotonic() < deadline and proc.poll() is None and not list(out.glob("part-*.done.json")):
        time.sleep(0.05)
    done_at_kill = len(list(out.glob("part-*.done.json")))
    cluster.kill_worker()
    assert proc.wait(timeout=HANG_S) == 0, (tmp_path / "job.log").read_text()[-4000:]
    assert 1 <= done_at_kill < NUM_SHARDS, f"the kill did not land mid-job ({done_at_kill} shards done)"
    deadline = time.monotonic() + HANG_S  # the head declares the node dead after its missed health checks
    while worker_id in cluster.node_ids().values() and time.monotonic() < deadline:
        time.sleep(1)
    assert worker_id not in cluster.node_ids().values()
    assert tree_bytes(out) == tree_bytes(single_node / "inst")
