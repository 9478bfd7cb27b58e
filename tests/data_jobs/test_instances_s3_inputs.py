"""The instances job reading its inputs (documents and vocab datasets) from ``s3://`` on a real
S3-compatible server (moto's server on 127.0.0.1): each worker fetches the shard it reads to node-local
scratch and checks it against the manifest, so no node shares a file system with another. The same
bytes as a run over local inputs, with the output local or on the store, with local processes or Ray
workers; a changed shard object is refused in one line."""
from __future__ import annotations

import json

import pytest

from contracts.schema import MANIFEST_NAME, Manifest
from contracts.storage import location
from data_jobs.config import InstancesConfig
from data_jobs.instances_job import main, run, status
from data_jobs.tokenization import load_vocab_dir
from test_jobs_s3 import inputs  # noqa: F401 - a fixture: the same tiny corpus and vocab
from test_jobs_s3 import _upload_dir as _upload


def _cfg(shards: str, vocab: str, out: str, **kw) -> InstancesConfig:
    base = dict(shards_dir=shards, vocab_dir=vocab, output_dir=out, max_seq_length=32, max_predictions_per_seq=5,
                dupe_factor=2, random_pool_docs=16, engine="local", whole_word_masking=True)
    return InstancesConfig(**{**base, **kw})


def _parts(where) -> dict[str, bytes]:
    loc = location(str(where))
    return {m.name: loc.read(m.name) for m in loc.list() if m.name.endswith(".parquet")}


def test_inputs_on_s3_give_the_bytes_of_local_inputs(inputs, s3_env, tmp_path, monkeypatch):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setenv("BERTFLOW_SCRATCH", str(scratch))
    shards = _upload(inputs / "shards", s3_env + "/docs")
    vocab = _upload(inputs / "vocab", s3_env + "/vocab")
    info = load_vocab_dir(vocab)
    assert info.vocab_file == vocab + "/vocab.txt" and info.vocab_hash == load_vocab_dir(inputs / "vocab").vocab_hash
    here = run(_cfg(str(inputs / "shards"), str(inputs / "vocab"), str(tmp_path / "here"), num_workers=1))
    kw = dict(num_workers=2)
    local_out = run(_cfg(shards, vocab, str(tmp_path / "from-s3"), **kw))
    remote_out = run(_cfg(shards, vocab, s3_env + "/inst", **kw))
    expected = _parts(tmp_path / "here")
    assert expected and _parts(tmp_path / "from-s3") == expected and _parts(s3_env + "/inst") == expected
    assert local_out.files == here.files == remote_out.files and local_out.stats == here.stats
    assert local_out.totals == {**here.totals, "vocab_file": vocab + "/vocab.txt"}  # the same input hash too
    assert status(_cfg(shards, vocab, s3_env + "/inst", **kw)).done  # a rerun would be skipped
    # every fetched shard removed; the vocab kept once, named by its checksum, for the node's next shards
    assert [p.name[:14] for p in scratch.iterdir()] == ["bertflow-kept-"]


def test_ray_workers_fetch_the_shards_they_read(inputs, s3_env, tmp_path):
    """The CLI on a local Ray cluster it starts itself (its workers inherit the AWS_* variables and
    $BERTFLOW_SCRATCH): inputs and output on the store, the part files those of local inputs."""
    import os
    import subprocess
    import sys

    shards = _upload(inputs / "shards", s3_env + "/docs")
    vocab = _upload(inputs / "vocab", s3_env + "/vocab")
    run(_cfg(str(inputs / "shards"), str(inputs / "vocab"), str(tmp_path / "here"), num_workers=1))
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    flags = ["--shards-dir", shards, "--vocab-dir", vocab, "--output-dir", s3_env + "/ray", "--max-seq-length", "32",
             "--max-predictions-per-seq", "5", "--dupe-factor", "2", "--random-pool-docs", "16",
             "--whole-word-masking", "--engine", "ray", "--num-workers", "2"]
    env = {**{k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}, "BERTFLOW_SCRATCH": str(scratch)}
    done = subprocess.run([sys.executable, "-m", "data_jobs.instances_job", *flags], capture_output=True, text=True,
                          env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    expected = _parts(tmp_path / "here")
    assert expected and _parts(s3_env + "/ray") == expected
    assert [p.name[:14] for p in scratch.iterdir()] == ["bertflow-kept-"]


def test_a_changed_shard_object_is_refused_in_one_line(inputs, s3_env, tmp_path, capsys):
    shards = _upload(inputs / "shards", s3_env + "/docs")
    vocab = _upload(inputs / "vocab", s3_env + "/vocab")
    manifest = json.loads(location(shards).read(MANIFEST_NAME))
    victim = manifest["files"][1]
    original = location(shards).read(victim["name"])
    # the same size, other bytes: the listing cannot see it, the worker's checksum must
    location(shards).write(victim["name"], bytes(reversed(original)))
    flags = ["--shards-dir", shards, "--vocab-dir", vocab, "--max-seq-length", "32", "--dupe-factor", "1",
             "--engine", "local", "--num-workers", "1"]
    capsys.readouterr()
    assert main(flags + ["--output-dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (f"bertflow: error: {shards}/{victim['name']}: changed since its manifest was written "
                       "(size or checksum)"), err
    assert not (tmp_path / "out" / MANIFEST_NAME).exists()
    location(shards).write(victim["name"], original)
    location(vocab).write("vocab.txt", b"[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nalpha\n")
    assert main(flags + ["--output-dir", str(tmp_path / "out2")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == f"bertflow: error: {vocab}/vocab.txt: changed since its manifest was written (size or checksum)"
    assert Manifest.read(shards).files[1].name == victim["name"]


def test_the_vocab_is_kept_once_per_node_so_workers_reuse_their_tokenizer(inputs, s3_env, tmp_path, monkeypatch):
    """Each shard task used to fetch the vocab to a fresh temporary path, so the tokenizer (and its chunk-id
    cache) cached by path was rebuilt for every shard: on s3 the job took 1.58x the local wall time
    (bench/results/bench_instances_s3_2026-12-04_0600.txt), 0.95x once kept (..._0610.txt)."""
    from contracts.common import UserError, sha256_file
    from data_jobs.job_output import kept_copy

    monkeypatch.setenv("BERTFLOW_SCRATCH", str(tmp_path))
    uri = _upload(inputs / "vocab", s3_env + "/vocab-kept")
    local = inputs / "vocab" / "vocab.txt"
    expect = (local.stat().st_size, sha256_file(local))
    first = kept_copy(f"{uri}/vocab.txt", expect)
    assert first.read_bytes() == local.read_bytes() and kept_copy(f"{uri}/vocab.txt", expect) == first
    first.write_bytes(b"cut")  # a damaged copy (another size) is fetched again
    assert kept_copy(f"{uri}/vocab.txt", expect).read_bytes() == local.read_bytes()
    location(uri).write("vocab.txt", b"[PAD]\nchanged\n")  # a changed object is refused, never kept
    first.unlink()
    with pytest.raises(UserError, match="changed since its manifest was written"):
        kept_copy(f"{uri}/vocab.txt", expect)
    assert not first.exists()
