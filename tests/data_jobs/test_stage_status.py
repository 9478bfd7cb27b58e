"""Each data stage's own status (the answer the CLI and the flows both act on): an input edited in place
is redone with the reason said in one line, downstream too; the same dataset addressed relatively,
absolutely or copied elsewhere is recognised as done; run fields never enter a config hash."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from data_jobs import instances_job, shard_job, vocab_job
from data_jobs.config import InstancesConfig, ShardConfig, VocabConfig
from contracts.schema import Manifest
from flows.cli import main as bertflow
from shard_fixtures import BERT_TEXT

pytestmark = pytest.mark.ray


def _stage_lines(err: str) -> list[str]:
    return [line.split(": /")[0] for line in err.splitlines() if line.startswith("stage ")]


def test_config_hash_ignores_where_and_how_widely_a_job_runs():
    a = ShardConfig(inputs=["a.txt"], output_dir="x", num_workers=1)
    b = ShardConfig(inputs=["/elsewhere/a.txt"], output_dir="/y", num_workers=8, ray_address="auto", overwrite=True)
    assert a.config_hash() == b.config_hash()
    assert a.config_hash() != a.model_copy(update={"num_shards": 3}).config_hash()
    i = InstancesConfig(shards_dir="d", vocab_dir="v", output_dir="o")
    assert i.config_hash() == InstancesConfig(shards_dir="/abs/d", vocab_dir="v2", output_dir="p", num_workers=5).config_hash()


def test_edited_corpus_is_redone_through_the_cli_with_its_reason(ray_local, tmp_path, capsys):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_bytes(BERT_TEXT.encode())
    (corpus / "b.txt").write_text("".join(f"Document {i} is here. It has {i} words.\n\n" for i in range(60)))
    docs, vocab, inst = tmp_path / "docs", tmp_path / "vocab", tmp_path / "inst"
    commands = [
        ["data", "shard", "--input", str(corpus), "--output-dir", str(docs), "--num-shards", "2"],
        ["data", "vocab", "--shards-dir", str(docs), "--output-dir", str(vocab), "--vocab-size", "120",
         "--min-frequency", "1"],
        ["data", "instances", "--shards-dir", str(docs), "--vocab-dir", str(vocab), "--output-dir", str(inst),
         "--max-seq-length", "32", "--max-predictions-per-seq", "4", "--dupe-factor", "1"],
    ]

    def run_all() -> list[str]:
        capsys.readouterr()
        for argv in commands:
            assert bertflow(argv) == 0, argv
        return _stage_lines(capsys.readouterr().err)

    assert run_all() == []  # a first run has nothing to explain
    first = {d: Manifest.read(d) for d in (docs, vocab, inst)}
    assert run_all() == ["stage shard: skipped (complete)", "stage vocab: skipped (complete)",
                         "stage instances: skipped (complete)"]
    # Edit one file in place (same size: only its content tells).
    b = corpus / "b.txt"
    size = b.stat().st_size
    b.write_text(b.read_text().replace("Document 7 is", "Document 7 IS"))
    assert b.stat().st_size == size
    assert run_all() == ["stage shard: running (inputs changed: 1 file)",
                         "stage vocab: running (inputs changed: documents dataset)",
                         "stage instances: running (inputs changed: documents dataset)"]
    assert Manifest.read(docs).identity() != first[docs].identity()
    assert Manifest.read(inst).totals["input_hash"] != first[inst].totals["input_hash"]


def test_same_dataset_relative_absolute_or_copied_is_done(ray_local, tmp_path, monkeypatch):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("".join(f"Sentence {i} of the text. And one more.\n\n" for i in range(40)))
    docs = tmp_path / "out" / "docs"
    shard = ShardConfig(inputs=[str(corpus)], output_dir=str(docs), num_shards=2, num_workers=1)
    shard_job.run(shard)
    vocab = vocab_job.run(VocabConfig(shards_dir=str(docs), output_dir=str(tmp_path / "vocab"), vocab_size=100,
                                      min_frequency=1))
    icfg = InstancesConfig(shards_dir=str(docs), vocab_dir=str(tmp_path / "vocab"), output_dir=str(tmp_path / "inst"),
                           max_seq_length=32, max_predictions_per_seq=4, dupe_factor=1, num_workers=1)
    instances_job.run(icfg)
    monkeypatch.chdir(tmp_path)
    copy = tmp_path / "elsewhere" / "docs"
    shutil.copytree(docs, copy)
    shutil.copytree(corpus, tmp_path / "corpus-copy")
    for shards_dir in ("out/docs", str(docs.resolve()), str(copy)):
        assert instances_job.status(icfg.model_copy(update={"shards_dir": shards_dir, "num_workers": 2})).done
        vcfg = VocabConfig(shards_dir=shards_dir, output_dir=str(tmp_path / "vocab"), vocab_size=100, min_frequency=1)
        assert vocab_job.status(vcfg).done and vocab.config_hash == vcfg.config_hash()
    # The corpus copied elsewhere is the same input: its shards are done.
    assert shard_job.status(shard.model_copy(update={"inputs": ["corpus-copy"], "num_workers": 3})).done
    # A file added to the copy is not.
    (tmp_path / "corpus-copy" / "b.txt").write_text("New text here.\n")
    moved = shard_job.status(shard.model_copy(update={"inputs": ["corpus-copy"]}))
    assert moved.state == "absent" and moved.reason == "inputs changed: 1 file"
    assert Path(docs / "manifest.json").is_file()
