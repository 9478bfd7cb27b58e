"""A data job's object store failing under it, on a real S3-compatible server of the test's own (moto's
server on 127.0.0.1, in its own process): stalled (SIGSTOP) mid-run and continued, the job waits it out
and makes the bytes of an undisturbed local run; gone mid-run, the job stops with one line naming the
store, a non-zero exit and no manifest (nothing that looks finished)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from contracts.schema import MANIFEST_NAME
from data_jobs import vocab_job
from data_jobs.config import InstancesConfig, VocabConfig
from data_jobs.instances_job import run
from hang import HANG_S
from instances_helpers import write_documents, write_tiny_vocab
from s3_server import S3Server

REPO = Path(__file__).resolve().parents[2]
WORDS = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa".split()


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    import random

    rng = random.Random(3)
    docs = [[" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))) + " ." for _ in range(rng.randint(2, 9))]
            for _ in range(60)]
    root = tmp_path_factory.mktemp("faults")
    write_documents(root / "shards", docs, num_shards=4)
    vocab_job.run(VocabConfig(output_dir=str(root / "vocab"), vocab_file=str(write_tiny_vocab(root / "w.txt", WORDS + ["."]))))
    return root


@pytest.fixture
def server(tmp_path):
    pytest.importorskip("moto")
    s = S3Server(tmp_path).start()
    try:
        yield s
    finally:
        s.resume()  # a test that failed while the server was stopped must not leave it frozen
        s.stop()


FLAGS = ["--max-seq-length", "32", "--max-predictions-per-seq", "5", "--dupe-factor", "2", "--random-pool-docs", "16",
         "--engine", "local", "--num-workers", "1"]


def _start(inputs, server, uri: str) -> subprocess.Popen:
    env = {**os.environ, **server.env(), "PYTHONPATH": str(REPO), "BERTFLOW_STORE_RETRY_S": "5"}
    argv = [sys.executable, "-m", "data_jobs.instances_job", "--shards-dir", str(inputs / "shards"),
            "--vocab-dir", str(inputs / "vocab"), "--output-dir", uri, *FLAGS]
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _names_once_started(server, bucket: str, proc: subprocess.Popen) -> list[str]:
    """The job's objects as soon as it has written its first one (its lease): the moment to strike."""
    client, deadline = server.client(), time.monotonic() + HANG_S
    while time.monotonic() < deadline and proc.poll() is None:
        names = [o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix="inst/").get("Contents", [])]
        if names:
            return names
        time.sleep(0.01)
    raise AssertionError(f"the job wrote nothing (rc {proc.poll()}): {proc.communicate()[1][-2000:] if proc.poll() is not None else ''}")


def test_a_stalled_store_is_waited_out_and_the_bytes_are_a_local_runs(inputs, server):
    bucket = server.new_bucket()
    proc = _start(inputs, server, f"s3://{bucket}/inst")
    seen = _names_once_started(server, bucket, proc)
    server.pause()
    time.sleep(2)  # every request the job makes now waits
    server.resume()
    out, err = proc.communicate(timeout=HANG_S)
    assert proc.returncode == 0, err[-3000:]
    assert f"inst/{MANIFEST_NAME}" not in seen  # the stall came before the job had finished
    local_dir = inputs / "inst-local"
    run(InstancesConfig(shards_dir=str(inputs / "shards"), vocab_dir=str(inputs / "vocab"), output_dir=str(local_dir),
                        max_seq_length=32, max_predictions_per_seq=5, dupe_factor=2, random_pool_docs=16,
                        engine="local", num_workers=1))
    client = server.client()
    remote = {o["Key"][5:]: client.get_object(Bucket=bucket, Key=o["Key"])["Body"].read()
              for o in client.list_objects_v2(Bucket=bucket, Prefix="inst/")["Contents"]}
    assert sorted(remote) == sorted(p.name for p in local_dir.iterdir())  # no lease or scratch left behind
    for name, data in remote.items():
        if name.endswith(".parquet"):
            assert data == (local_dir / name).read_bytes(), name
    assert json.loads(remote[MANIFEST_NAME])["files"] == json.loads((local_dir / MANIFEST_NAME).read_text())["files"]


def test_a_store_gone_mid_run_stops_the_job_in_one_line(inputs, server):
    bucket = server.new_bucket()
    uri = f"s3://{bucket}/inst"
    proc = _start(inputs, server, uri)
    seen = _names_once_started(server, bucket, proc)
    server.stop()
    out, err = proc.communicate(timeout=HANG_S)
    assert f"inst/{MANIFEST_NAME}" not in seen
    lines = err.strip().splitlines()
    if proc.returncode == 0:  # it had uploaded everything before the server went: nothing to test
        pytest.fail(f"the job finished before the store went away; seen {seen}")
    assert proc.returncode == 2 and "Traceback" not in err, err[-3000:]
    assert lines[-1].startswith(f"bertflow: error: {uri}") and "cannot reach the store's endpoint" in lines[-1], lines[-3:]


def test_the_retry_bound_is_checked(monkeypatch):
    from contracts.common import UserError
    from contracts.storage import location

    monkeypatch.setenv("BERTFLOW_STORE_RETRY_S", "soon")
    with pytest.raises(UserError, match="^BERTFLOW_STORE_RETRY_S='soon': expected seconds between 0 and 86400$"):
        location("s3://bucket/x").head("a")
