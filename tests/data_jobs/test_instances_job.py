"""The instances job for real on a local Ray cluster: output format, 1-vs-2-worker byte identity,
rerun skipping, repair of a damaged output, bad input, the CLI."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from contracts.common import Status, UserError
from data_jobs.config import InstancesConfig, VocabConfig
from data_jobs.instances import decode_examples
from data_jobs.instances_job import main, run, status
from contracts.schema import Manifest, instances_schema
from data_jobs import vocab_job
from instances_helpers import bert_sample_documents, book_documents, write_documents, write_tiny_vocab

pytestmark = [pytest.mark.ray, pytest.mark.shared_data]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, shared_data, bert_uncased_vocab):
    root = tmp_path_factory.mktemp("inst")
    docs = bert_sample_documents(shared_data) + book_documents(
        shared_data / "corpus" / "gutenberg" / "pg1661_sherlock_holmes.txt", max_chars=150_000, paragraphs_per_doc=25)
    write_documents(root / "shards", docs, num_shards=4)
    vocab_job.run(VocabConfig(output_dir=str(root / "vocab"), vocab_file=str(bert_uncased_vocab)))
    return root


def _cfg(root, out, **kw):
    base = dict(shards_dir=str(root / "shards"), vocab_dir=str(root / "vocab"), output_dir=str(root / out),
                dupe_factor=2, max_seq_length=64, random_pool_docs=64)
    base.update(kw)
    return InstancesConfig(**base)


def _files(d):
    return {p.name: p.read_bytes() for p in sorted(d.glob("part-*.parquet"))}


def test_one_and_two_workers_give_identical_bytes(ray_local, inputs):
    m1 = run(_cfg(inputs, "w1", num_workers=1))
    m2 = run(_cfg(inputs, "w2", num_workers=2))
    f1, f2 = _files(inputs / "w1"), _files(inputs / "w2")
    assert f1 and f1 == f2
    assert m1.stats == m2.stats and m1.files == m2.files and m1.totals == m2.totals
    # format: the schema, names by shard and length bin, rows within their bin, manifest totals
    schema = instances_schema(30522)
    total = 0
    for entry in m1.files:
        t = pq.read_table(inputs / "w1" / entry.name)
        assert t.schema.equals(schema) and t.num_rows == entry.rows
        upper = entry.meta["bin"]
        assert entry.name == f"part-{entry.meta['shard']:05d}-len{upper:04d}.parquet"
        lens = [len(x) for x in t.column("input_ids").to_pylist()]
        assert max(lens) <= upper and min(lens) > upper - 32
        total += t.num_rows
    tot = m1.totals
    assert total == tot["instances"] > 100 and m1.vocab_hash and tot["vocab_size"] == 30522
    assert tot["max_seq_length"] == 64 and tot["sentence_task"] == "nsp" and tot["lowercase"] is True
    assert tot["vocab_file"].endswith("vocab.txt") and tot["max_predictions_per_seq"] == 20
    st = m1.stats
    assert sum(st["length_histogram"].values()) == total == sum(st["predictions_histogram"].values())
    assert set(st["replacement_counts"]) == {"mask", "random", "keep"}
    assert 0 <= st["short_target_doc_fraction"] <= 1 and 0.3 < st["sentence_label_1_fraction"] < 0.75
    text = decode_examples(inputs / "w1", n=3)
    assert len(text) == 3 and all("[CLS]" in t and "{[MASK]|" in t for t in text)


def test_rerun_skips_and_repairs(ray_local, inputs):
    cfg = _cfg(inputs, "rerun", sentence_task="sop", whole_word_masking=True)
    m = run(cfg)
    out = inputs / "rerun"
    before = {p.name: p.stat().st_mtime_ns for p in out.glob("part-*")}
    assert run(cfg) == m  # complete and valid: nothing rewritten
    assert {p.name: p.stat().st_mtime_ns for p in out.glob("part-*")} == before
    # damage one shard's file and lose the manifest: only that shard is made again, same bytes
    victim = m.files[0].name
    good = (out / victim).read_bytes()
    (out / victim).write_bytes(good[:100])
    (out / "manifest.json").unlink()
    (out / ".tmp-part-00000-len0064.parquet.abc").write_bytes(b"left by a killed worker")
    m2 = run(cfg.model_copy(update={"num_workers": 1}))
    assert not list(out.glob(".tmp-*"))
    assert (out / victim).read_bytes() == good and m2.files == m.files
    shard = m.files[0].meta["shard"]
    for name, t in before.items():
        if not name.startswith(f"part-{shard:05d}"):
            assert (out / name).stat().st_mtime_ns == t, name
    assert set(m.stats["sentence_label_counts"]) == {"0", "1"}


def test_bad_inputs(ray_local, inputs, tmp_path, capsys):
    run(_cfg(inputs, "taken", sentence_task="none", dupe_factor=1))
    with pytest.raises(UserError, match="another config"):
        run(_cfg(inputs, "taken", sentence_task="none", dupe_factor=2))
    # same config, but the vocab directory now holds another vocab: an input changed, so the rerun
    # redoes the instances with it (the status says why) instead of keeping the stale ones
    vdir = tmp_path / "vocab"
    vocab_job.run(VocabConfig(output_dir=str(vdir), vocab_file=str(inputs / "vocab" / "vocab.txt")))
    cfg = _cfg(inputs, "v", vocab_dir=str(vdir), sentence_task="none", dupe_factor=1)
    old = run(cfg)
    new_vocab = vocab_job.run(VocabConfig(output_dir=str(vdir), vocab_file=str(write_tiny_vocab(tmp_path / "t.txt", ["x"]))))
    assert status(cfg) == Status("absent", "inputs changed: vocab dataset", status(cfg).inputs)
    redone = run(cfg)
    assert redone.vocab_hash == new_vocab.vocab_hash != old.vocab_hash and status(cfg).done
    # a shard file damaged in place (same size): the worker's one-line error reaches the caller
    bad_shards = tmp_path / "bad_shards"
    shutil.copytree(inputs / "shards", bad_shards)
    victim = bad_shards / "shard-00001.parquet"
    victim.write_bytes(b"\0" * victim.stat().st_size)
    with pytest.raises(UserError, match="shard-00001.parquet: cannot read document shard"):
        run(_cfg(inputs, "bad", shards_dir=str(bad_shards)))
    assert not (inputs / "bad" / "manifest.json").exists()
    # CLI: one line, exit 2, for a missing shards dir, an invalid option and a non-documents dataset
    capsys.readouterr()
    args = ["--vocab-dir", str(inputs / "vocab"), "--output-dir", str(tmp_path / "o")]
    assert main(["--shards-dir", str(tmp_path / "missing")] + args) == 2
    assert main(["--shards-dir", str(inputs / "shards"), "--max-seq-length", "7"] + args) == 2
    assert main(["--shards-dir", str(inputs / "shards"), "--masked-lm-prob", "1.5"] + args) == 2
    assert main(["--shards-dir", str(inputs / "vocab")] + args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 4 and all(e.startswith("bertflow: error:") for e in err)
    assert "not found" in err[0] and "max_seq_length" in err[1] and "masked_lm_prob" in err[2]
    assert "expected document shards" in err[3]


def test_cli_config_file_and_module_entry(ray_local, inputs, tmp_path):
    cfg_file = tmp_path / "inst.yaml"
    cfg_file.write_text(f"shards_dir: {inputs / 'shards'}\nvocab_dir: {inputs / 'vocab'}\n"
                        f"output_dir: {tmp_path / 'out'}\nmax_seq_length: 32\ndupe_factor: 1\n")
    assert main(["--config", str(cfg_file), "--sentence-task", "none", "--num-workers", "2"]) == 0
    m = Manifest.read(tmp_path / "out")
    assert m.config["sentence_task"] == "none" and m.config["max_seq_length"] == 32
    assert m.stats["sentence_label_counts"] == {"-1": m.totals["instances"]}
    res = subprocess.run([sys.executable, "-m", "data_jobs.instances_job", "--help"], capture_output=True, text=True)
    assert res.returncode == 0 and "--shards-dir" in res.stdout
    json.loads((tmp_path / "out" / "manifest.json").read_text())


def test_changed_input_is_remade_and_old_parts_removed(ray_local, inputs, tmp_path, shared_data):
    shards = tmp_path / "shards"
    docs = bert_sample_documents(shared_data)
    write_documents(shards, docs * 3, num_shards=4)
    cfg = _cfg(inputs, "changing", shards_dir=str(shards), dupe_factor=1)
    first = run(cfg)
    assert {f.meta["shard"] for f in first.files} == {0, 1, 2, 3}
    shutil.rmtree(shards)
    write_documents(shards, docs, num_shards=2)  # same path and config, other content
    second = run(cfg)
    out = inputs / "changing"
    assert second.totals["input_hash"] != first.totals["input_hash"] and second.totals["shards"] == 2
    assert sorted(p.name for p in out.glob("part-*.parquet")) == [f.name for f in second.files]
    assert not list(out.glob("part-0000[23]*"))


@pytest.mark.slow
def test_real_pipeline_shard_vocab_instances(ray_local, shared_data, tmp_path):
    """The three jobs chained as a user runs them: the shard job's real output feeds a trained vocab,
    and both feed the instances job (catches any drift between the jobs' contracts)."""
    from data_jobs import shard_job
    from data_jobs.config import ShardConfig

    corpus = shared_data / "corpus"
    shard_job.run(ShardConfig(inputs=[str(corpus / "bert_sample" / "sample_text.txt")], input_format="bert",
                              output_dir=str(tmp_path / "docs"), num_shards=3))
    shard_job.run(ShardConfig(inputs=[str(corpus / "wikipedia_mlperf" / "wiki_00")], input_format="wikiextractor",
                              output_dir=str(tmp_path / "wiki"), num_shards=3))
    vocab_job.run(VocabConfig(shards_dir=str(tmp_path / "wiki"), output_dir=str(tmp_path / "vocab"), vocab_size=3000))
    m = run(InstancesConfig(shards_dir=str(tmp_path / "wiki"), vocab_dir=str(tmp_path / "vocab"),
                            output_dir=str(tmp_path / "inst"), dupe_factor=1, max_seq_length=128))
    assert m.totals["instances"] > 500 and m.totals["vocab_size"] <= 3000
    assert m.vocab_hash == Manifest.read(tmp_path / "vocab").vocab_hash
    assert 0.45 < m.stats["sentence_label_1_fraction"] < 0.6
    small = run(InstancesConfig(shards_dir=str(tmp_path / "docs"), vocab_dir=str(tmp_path / "vocab"),
                                output_dir=str(tmp_path / "inst_small"), dupe_factor=2, max_seq_length=64))
    assert small.totals["documents"] == 3 and "{[MASK]|" in decode_examples(tmp_path / "inst_small", 1)[0]


def test_local_engine_gives_the_bytes_of_the_ray_engine(ray_local, inputs):
    """No Ray address: local processes (in-process for 1 worker); any engine, any count, same bytes."""
    m_ray = run(_cfg(inputs, "e-ray", num_workers=2, engine="ray"))
    for workers in (1, 2):
        m = run(_cfg(inputs, f"e-local{workers}", num_workers=workers, engine="local"))
        assert _files(inputs / f"e-local{workers}") == _files(inputs / "e-ray")
        assert m.files == m_ray.files and m.totals == m_ray.totals and m.stats == m_ray.stats
    # The CLI runs no other thread: its pool process is forked from it (here Ray's threads made it a
    # fork server's); the driver itself is the second worker.
    flags = ["--shards-dir", str(inputs / "shards"), "--vocab-dir", str(inputs / "vocab"), "--output-dir",
             str(inputs / "e-cli"), "--dupe-factor", "2", "--max-seq-length", "64", "--random-pool-docs", "64",
             "--engine", "local", "--num-workers", "2"]
    done = subprocess.run([sys.executable, "-m", "data_jobs.instances_job", *flags], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert _files(inputs / "e-cli") == _files(inputs / "e-ray")
