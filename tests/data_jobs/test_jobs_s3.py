"""The data jobs writing to ``s3://`` on a real S3-compatible server (moto's server on 127.0.0.1, no
mock of the client): the same bytes as a run into a local directory, a rerun skipped as complete,
someone else's objects refused in one line and left untouched."""
from __future__ import annotations

import json
import random

import pyarrow.parquet as pq
import pytest

from contracts.common import UserError
from contracts.schema import MANIFEST_NAME, Manifest
from contracts.storage import location
from data_jobs import vocab_job
from data_jobs.config import InstancesConfig, ShardConfig, VocabConfig
from data_jobs.instances_job import main, run, status
from instances_helpers import write_documents, write_tiny_vocab

WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa "
         "quebec romeo sierra tango uniform victor whiskey xray yankee zulu").split()


def _documents(n: int = 24, seed: int = 0) -> list[list[str]]:
    rng = random.Random(seed)
    return [[" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))) + " ."
             for _ in range(rng.randint(2, 9))] for _ in range(n)]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """Three tiny document shards and a 32-token vocab, local (the jobs' inputs)."""
    root = tmp_path_factory.mktemp("jobs_s3")
    write_documents(root / "shards", _documents(), num_shards=3)
    vocab_job.run(VocabConfig(output_dir=str(root / "vocab"),
                              vocab_file=str(write_tiny_vocab(root / "words.txt", WORDS + ["."]))))
    return root


def _inst(inputs, out: str, **kw) -> InstancesConfig:
    base = dict(shards_dir=str(inputs / "shards"), vocab_dir=str(inputs / "vocab"), output_dir=out,
                max_seq_length=32, max_predictions_per_seq=5, dupe_factor=2, random_pool_docs=16, engine="local")
    return InstancesConfig(**{**base, **kw})


def _without_location(manifest: dict) -> dict:
    """A manifest less the fields that say where and how widely the job ran (output_dir, num_workers)."""
    run_fields = InstancesConfig.run_fields
    return {**manifest, "config": {k: v for k, v in manifest["config"].items() if k not in run_fields}}


def _without_worker(record: dict) -> dict:
    return {k: v for k, v in record.items() if k != "worker"}  # diagnostics: the worker's RSS and CPU time


def test_instances_on_s3_are_the_bytes_of_a_local_run(inputs, s3_env):
    local_dir = inputs / "inst-local"
    local = run(_inst(inputs, str(local_dir), num_workers=1))
    uri = s3_env + "/runs/inst"
    remote = run(_inst(inputs, uri, num_workers=2))
    loc = location(uri)
    objects = loc.list()
    assert sorted(m.name for m in objects) == sorted(p.name for p in local_dir.iterdir())  # no lock, no scratch left
    for m in objects:
        data, here = loc.read(m.name), (local_dir / m.name).read_bytes()
        if m.name == MANIFEST_NAME:
            assert _without_location(json.loads(data)) == _without_location(json.loads(here))
        elif m.name.endswith(".done.json"):
            assert _without_worker(json.loads(data)) == _without_worker(json.loads(here))
        else:
            assert data == here, m.name  # every part file, byte for byte
    assert remote.files == local.files and remote.totals == local.totals and remote.stats == local.stats
    assert Manifest.read(uri) == remote and remote.config["output_dir"] == uri
    # every entry says how its file is cut into row groups: a reader plans its blocks without the footers
    for entry in local.files:
        md = pq.read_metadata(local_dir / entry.name)
        assert entry.meta["row_groups"] == [md.row_group(g).num_rows for g in range(md.num_row_groups)]
        assert sum(entry.meta["row_groups"]) == entry.rows > 0
    # a rerun finds it complete and writes nothing
    before = {m.name: m.etag for m in loc.list()}
    assert status(_inst(inputs, uri), deep=True).done
    assert run(_inst(inputs, uri, num_workers=2)) == remote
    assert {m.name: m.etag for m in loc.list()} == before


@pytest.mark.ray
def test_ray_workers_upload_the_same_bytes(inputs, s3_env, tmp_path):
    """The CLI on a local Ray cluster it starts itself (its workers inherit the AWS_* variables): the
    part files each Ray worker uploads are those of a local run."""
    import os
    import subprocess
    import sys

    local_dir = tmp_path / "local"
    run(_inst(inputs, str(local_dir), num_workers=1))
    uri = s3_env + "/ray"
    flags = ["--shards-dir", str(inputs / "shards"), "--vocab-dir", str(inputs / "vocab"), "--output-dir", uri,
             "--max-seq-length", "32", "--max-predictions-per-seq", "5", "--dupe-factor", "2",
             "--random-pool-docs", "16", "--engine", "ray", "--num-workers", "2"]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    done = subprocess.run([sys.executable, "-m", "data_jobs.instances_job", *flags], capture_output=True, text=True,
                          env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    loc = location(uri)
    parts = [m.name for m in loc.list() if m.name.endswith(".parquet")]
    assert parts == sorted(p.name for p in local_dir.glob("*.parquet"))
    assert all(loc.read(n) == (local_dir / n).read_bytes() for n in parts)


def test_a_lost_object_is_made_again_with_the_same_bytes(inputs, s3_env):
    uri = s3_env + "/inst"
    cfg = _inst(inputs, uri, num_workers=1, sentence_task="sop")
    first = run(cfg)
    loc = location(uri)
    victim = first.files[0].name
    good = loc.read(victim)
    others = {m.name: m.etag for m in loc.list() if not m.name.startswith(victim[:10]) and m.name != MANIFEST_NAME}
    loc.delete(victim)
    assert status(cfg).state == "partial"
    assert run(cfg) == first
    assert loc.read(victim) == good
    assert {n: e for n, e in ((m.name, m.etag) for m in loc.list()) if n in others} == others  # only its shard redone


def test_someone_elses_prefix_is_refused_and_untouched(inputs, s3_env, capsys):
    uri = s3_env + "/shared"
    loc = location(uri)
    loc.write("notes.txt", b"the user's own notes\n")
    before = [(m.name, m.etag) for m in loc.list()]
    flags = ["--shards-dir", str(inputs / "shards"), "--vocab-dir", str(inputs / "vocab"), "--max-seq-length", "32",
             "--dupe-factor", "1", "--engine", "local", "--num-workers", "1"]
    capsys.readouterr()
    assert main(flags + ["--output-dir", uri]) == 2
    assert main(flags + ["--output-dir", "s3://bertflow-no-such-bucket/inst"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2, err
    assert err[0] == (f"bertflow: error: {uri}: not empty and holds files this job did not write (notes.txt); "
                      "use a new output dir")
    assert err[1].startswith("bertflow: error: s3://bertflow-no-such-bucket/inst") and "bucket not found" in err[1]
    assert [(m.name, m.etag) for m in loc.list()] == before


def _upload_dir(local_dir, uri: str) -> str:
    loc = location(uri)
    for p in sorted(local_dir.iterdir()):
        loc.upload(p.name, p)
    return uri


def test_vocab_from_shards_on_s3_to_s3_is_the_vocab_of_a_local_run(inputs, s3_env):
    shards_uri = s3_env + "/docs"
    _upload_dir(inputs / "shards", shards_uri)  # the documents dataset, manifest included, on the store
    base = dict(vocab_size=100, min_frequency=1)
    local = vocab_job.run(VocabConfig(shards_dir=str(inputs / "shards"), output_dir=str(inputs / "vocab-local"), **base))
    uri = s3_env + "/vocab"
    cfg = VocabConfig(shards_dir=shards_uri, output_dir=uri, **base)
    remote = vocab_job.run(cfg)
    loc = location(uri)
    assert sorted(m.name for m in loc.list()) == ["manifest.json", "vocab.txt"]
    assert loc.read("vocab.txt") == (inputs / "vocab-local" / "vocab.txt").read_bytes()
    assert remote.vocab_hash == local.vocab_hash and remote.files == local.files
    assert remote.totals == {**local.totals, "vocab_file": uri + "/vocab.txt"}  # the same source_hash too
    assert {**remote.config, "shards_dir": None, "output_dir": None} == {**local.config, "shards_dir": None,
                                                                          "output_dir": None}
    assert Manifest.read(uri) == remote
    before = {m.name: m.etag for m in loc.list()}
    assert vocab_job.status(cfg, deep=True).done
    assert vocab_job.run(cfg) == remote and {m.name: m.etag for m in loc.list()} == before
    # an adopted vocab.txt goes to the store the same way
    adopted = vocab_job.run(VocabConfig(vocab_file=str(inputs / "words.txt"), output_dir=s3_env + "/adopted"))
    assert location(s3_env + "/adopted").read("vocab.txt") == (inputs / "words.txt").read_bytes()
    assert adopted.vocab_hash == Manifest.read(inputs / "vocab").vocab_hash


def test_vocab_refuses_a_changed_shard_on_s3_and_someone_elses_prefix(inputs, s3_env, capsys):
    shards_uri = s3_env + "/docs"
    _upload_dir(inputs / "shards", shards_uri)
    location(shards_uri).write("shard-00001.parquet", b"not the shard the manifest vouches for")
    capsys.readouterr()
    assert vocab_job.main(["--shards-dir", shards_uri, "--output-dir", s3_env + "/v", "--vocab-size", "100"]) == 2
    taken = location(s3_env + "/taken")
    taken.write("vocab.txt", b"someone's own vocab\n")
    before = [(m.name, m.etag) for m in taken.list()]
    assert vocab_job.main(["--vocab-file", str(inputs / "words.txt"), "--output-dir", s3_env + "/taken"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2, err
    assert err[0] == (f"bertflow: error: {shards_uri}/shard-00001.parquet: changed since its manifest was written "
                      "(size or checksum)")
    assert err[1].startswith(f"bertflow: error: {s3_env}/taken: not empty and holds files this job did not write "
                             "(vocab.txt)")
    assert [(m.name, m.etag) for m in taken.list()] == before
    assert location(s3_env + "/v").list() == []  # nothing left behind by the refused run


def _write_corpus(d, n: int = 30) -> None:
    """Two files in BERT format (sentence per line, blank line between documents), with exact copies
    across them for the corpus-wide dedup."""
    d.mkdir(parents=True, exist_ok=True)
    docs = ["\n".join(sents) for sents in _documents(n, seed=1)]
    (d / "a.txt").write_text("\n\n".join(docs[: n // 2]) + "\n", encoding="utf-8")
    (d / "b.txt").write_text("\n\n".join(docs[n // 2:] + docs[:3]) + "\n", encoding="utf-8")


def test_shards_on_s3_are_the_bytes_of_a_local_run(tmp_path, s3_env, capsys):
    from data_jobs import shard_job

    _write_corpus(tmp_path / "corpus")
    base = dict(inputs=[str(tmp_path / "corpus")], input_format="bert", num_shards=3, engine="local")
    local = shard_job.run(ShardConfig(output_dir=str(tmp_path / "docs"), num_workers=1, **base))
    uri = s3_env + "/docs"
    cfg = ShardConfig(output_dir=uri, num_workers=2, **base)
    remote = shard_job.run(cfg)
    loc = location(uri)
    names = sorted(m.name for m in loc.list())
    assert names == sorted(p.name for p in (tmp_path / "docs").iterdir())  # no .work, no lock left
    for name in names:
        if name != MANIFEST_NAME:
            assert loc.read(name) == (tmp_path / "docs" / name).read_bytes(), name
    assert local.totals["dropped"] == {"duplicate": 3}
    assert remote.files == local.files and remote.totals == local.totals and remote.stats == local.stats
    assert _without_location(json.loads(loc.read(MANIFEST_NAME))) == _without_location(local.model_dump(mode="json"))
    before = {m.name: m.etag for m in loc.list()}
    assert shard_job.status(cfg, deep=True).done
    assert shard_job.run(cfg) == remote and {m.name: m.etag for m in loc.list()} == before
    # a lost shard is made again, byte for byte
    good = loc.read("shard-00001.parquet")
    loc.delete("shard-00001.parquet")
    assert shard_job.status(cfg).state == "partial"
    assert shard_job.run(cfg) == remote and loc.read("shard-00001.parquet") == good
    # someone else's prefix: one line, untouched
    taken = location(s3_env + "/taken")
    taken.write("part-00000.parquet", b"another tool's output")
    before = [(m.name, m.etag) for m in taken.list()]
    capsys.readouterr()
    assert shard_job.main(["--input", str(tmp_path / "corpus"), "--output-dir", s3_env + "/taken"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"bertflow: error: {s3_env}/taken: not empty and not a bertflow documents dataset; "
                   "use a new output dir"]
    assert [(m.name, m.etag) for m in taken.list()] == before


def test_shard_inputs_from_an_s3_prefix_or_glob_give_the_local_shards(tmp_path, s3_env):
    from data_jobs import shard_job

    _write_corpus(tmp_path / "corpus")
    (tmp_path / "corpus" / "c.bin").write_bytes(bytes(range(256)) * 8)  # binary: left out by the glob
    _upload_dir(tmp_path / "corpus", s3_env + "/raw/corpus")
    base = dict(input_format="bert", num_shards=2, engine="local", num_workers=2)
    local = shard_job.run(ShardConfig(inputs=[str(tmp_path / "corpus" / "*.txt")], output_dir=str(tmp_path / "docs"),
                                      **base))
    from_glob = shard_job.run(ShardConfig(inputs=[s3_env + "/raw/corpus/*.txt"], output_dir=str(tmp_path / "g"), **base))
    assert shard_job.status(ShardConfig(inputs=[s3_env + "/raw/corpus/*.txt"], output_dir=str(tmp_path / "g"),
                                        **base)).done
    for name in ("shard-00000.parquet", "shard-00001.parquet"):
        assert (tmp_path / "g" / name).read_bytes() == (tmp_path / "docs" / name).read_bytes()
    assert from_glob.files == local.files and from_glob.totals == local.totals
    assert from_glob.stats["inputs_hash"] == local.stats["inputs_hash"]  # same names, sizes and checksums
    # a whole prefix, into s3: the .bin object is read too (and skipped as binary, counted)
    both = shard_job.run(ShardConfig(inputs=[s3_env + "/raw/corpus"], output_dir=s3_env + "/docs", **base))
    assert both.totals["documents_kept"] == local.totals["documents_kept"] and both.totals["files_read"] == 2
    assert sum(both.totals["files_skipped"].values()) == 1
    with pytest.raises(UserError, match="no objects match this pattern"):
        shard_job.run(ShardConfig(inputs=[s3_env + "/raw/*.gz"], output_dir=str(tmp_path / "x"), **base))


def test_a_submitted_jobs_config_lies_beside_its_s3_output(inputs, s3_env, capsys):
    """A Ray Job's node may share no file system with the flow that submits it: for an ``s3://`` output,
    the stage writes the job's ``--config`` beside the output on the same store, and the job's CLI
    reads it from there (flows.stages.DataStage -> flows.ray_jobs.submit_or_attach -> the job)."""
    from flows.ray_jobs import job_config_path, write_job_config

    uri = s3_env + "/runs/inst-job"
    cfg_uri = job_config_path(uri + "/")
    assert cfg_uri == s3_env + "/runs/.inst-job.job.yaml"
    assert job_config_path(str(inputs / "inst")) == str(inputs / ".inst.job.yaml")
    write_job_config(_inst(inputs, uri, num_workers=1), cfg_uri)
    assert main(["--config", cfg_uri]) == 0
    made = Manifest.read(uri)
    assert made.config["output_dir"] == uri and sum(f.rows for f in made.files) > 0
    assert status(_inst(inputs, uri, num_workers=1)).state == "done"  # the same config, read back
    capsys.readouterr()
    assert main(["--config", s3_env + "/runs/.nothing.job.yaml"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"bertflow: error: {s3_env}/runs/.nothing.job.yaml: config file not found"]
