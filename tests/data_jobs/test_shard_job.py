"""The shard job run for real on a local Ray cluster: determinism across worker counts, corpus-wide
dedup, the manifest's accounting, reruns, and the output-directory guard."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from contracts.schema import DOCUMENTS_SCHEMA, Manifest
from data_jobs import shard_tasks
from data_jobs.inspect import main as inspect_main
from data_jobs.readers import ReadStats, read_documents
from data_jobs.shard_job import main as shard_main
from data_jobs.shard_job import run
from data_jobs.shard_tasks import shard_of
from shard_fixtures import BERT_TEXT, cfg, compress, write_corpus

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def corpus(tmp_path) -> Path:
    d = tmp_path / "in"
    paths = write_corpus(d)
    (d / "more").mkdir()
    compress(paths["jsonl"], "gz").rename(d / "more" / "web2.jsonl.gz")
    pq.write_table(pa.table({"text": ["Parquet text one. Two.", "Parquet text three."]}), paths["parquet"])
    (d / "copy.txt").write_bytes(BERT_TEXT.encode())  # 3 documents duplicating sample.txt's, another file
    (d / "gen.txt").write_text(
        "".join(f"Generated document {i}. Its number is {i * 31 % 97}.\n\n" for i in range(150))
        + "Generated document 3. Its number is 93.\n",  # repeats gen.txt#3 inside the same file
        encoding="utf-8",
    )
    return d


def shards_of(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.glob("shard-*.parquet"))}


def rows_of(out: Path) -> list[tuple[int, dict]]:
    return [(int(p.stem[-5:]), r) for p in sorted(out.glob("shard-*.parquet")) for r in pq.read_table(p).to_pylist()]


@pytest.mark.ray
def test_one_and_two_workers_give_identical_shards_and_exact_dedup(ray_local, corpus, tmp_path):
    m1 = run(cfg([corpus], tmp_path / "w1", num_shards=3, num_workers=1))
    m2 = run(cfg([corpus], tmp_path / "w2", num_shards=3, num_workers=2))
    s1, s2 = shards_of(tmp_path / "w1"), shards_of(tmp_path / "w2")
    assert list(s1) == ["shard-00000.parquet", "shard-00001.parquet", "shard-00002.parquet"]
    assert s1 == s2
    assert m1.files == m2.files and m1.totals == m2.totals and m1.config_hash == m2.config_hash
    # No Ray: local processes give the same bytes (the engine is not part of the config hash).
    m3 = run(cfg([corpus], tmp_path / "w3", num_shards=3, num_workers=2, engine="local"))
    assert shards_of(tmp_path / "w3") == s1 and m3.files == m1.files and m3.config_hash == m1.config_hash

    # Expected result computed independently, in one process: keep the smallest doc_id per content.
    all_docs = list(read_documents(cfg([corpus]), ReadStats()))
    by_content: dict[tuple, str] = {}
    for d in all_docs:
        key = tuple(d.sentences)
        by_content[key] = min(by_content.get(key, d.doc_id), d.doc_id)
    rows = rows_of(tmp_path / "w1")
    got_ids = [r["doc_id"] for _, r in rows]
    assert sorted(got_ids) == sorted(set(by_content.values()))
    assert "copy.txt#0" in got_ids and "sample.txt#0" not in got_ids
    for shard, r in rows:
        assert shard == shard_of(r["doc_id"], 3)
    for name in s1:
        ids = pq.read_table(tmp_path / "w1" / name).column("doc_id").to_pylist()
        assert ids == sorted(ids)
        assert pq.read_schema(tmp_path / "w1" / name).remove_metadata().equals(DOCUMENTS_SCHEMA)

    t = m1.totals
    assert t["documents_read"] == len(all_docs) + 3 == t["documents_kept"] + sum(t["dropped"].values())
    # copy.txt repeats 3 documents, gen.txt one of its own, web2.jsonl.gz 2; the fixture dump has 3 non-articles.
    assert t["dropped"] == {"duplicate": 6, "redirect": 1, "disambiguation": 1, "not_article": 1}
    assert len(all_docs) - len(by_content) == 6
    assert t["documents_kept"] == sum(f.rows for f in m1.files) == len(rows)
    assert t["sentences"] == sum(len(r["sentences"]) for _, r in rows)
    assert m1.kind == "documents" and not Manifest.read(tmp_path / "w1").verify_files(tmp_path / "w1")
    assert not (tmp_path / "w1" / ".work").exists()


@pytest.mark.ray
def test_no_dedup_keeps_duplicates_but_not_repeated_ids(ray_local, corpus, tmp_path):
    m = run(cfg([corpus], tmp_path / "out", num_shards=2, dedup=False))
    assert "duplicate" not in m.totals["dropped"]
    ids = [r["doc_id"] for _, r in rows_of(tmp_path / "out")]
    assert "copy.txt#0" in ids and "sample.txt#0" in ids and len(ids) == len(set(ids))


@pytest.mark.ray
def test_rerun_skips_finished_work_and_repairs_a_damaged_shard(ray_local, corpus, tmp_path):
    out = tmp_path / "out"
    first = run(cfg([corpus], out, num_shards=3))
    before = {p.name: p.stat().st_mtime_ns for p in out.glob("*")}
    assert run(cfg([corpus], out, num_shards=3, num_workers=1)) == first
    assert {p.name: p.stat().st_mtime_ns for p in out.glob("*")} == before

    good = (out / "shard-00001.parquet").read_bytes()
    (out / "shard-00001.parquet").write_bytes(b"garbage")
    again = run(cfg([corpus], out, num_shards=3))
    assert (out / "shard-00001.parquet").read_bytes() == good and again.files == first.files
    for name in ("shard-00000.parquet", "shard-00002.parquet"):
        assert (out / name).stat().st_mtime_ns == before[name]  # intact shards were not rewritten

    # A run killed before its manifest: leftovers are cleaned and the same bytes come back.
    shards = shards_of(out)
    (out / "manifest.json").unlink()
    (out / ".tmp-shard-00001.parquet.abc").write_bytes(b"half")
    assert run(cfg([corpus], out, num_shards=3)).files == first.files
    assert shards_of(out) == shards and not list(out.glob(".tmp-*"))


@pytest.mark.ray
def test_other_configs_output_dir_is_refused_unless_overwrite(ray_local, corpus, tmp_path, capsys):
    out = tmp_path / "out"
    run(cfg([corpus], out, num_shards=3))
    capsys.readouterr()
    args = ["--input", str(corpus), "--output-dir", str(out), "--num-shards", "2"]
    assert shard_main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds another config's data" in err[0] and "--overwrite" in err[0]
    assert shard_main(args + ["--overwrite"]) == 0
    assert sorted(shards_of(out)) == ["shard-00000.parquet", "shard-00001.parquet"]
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("precious")
    assert shard_main(["--input", str(corpus), "--output-dir", str(tmp_path / "mine")]) == 2
    assert "not empty and not a bertflow documents dataset" in capsys.readouterr().err


@pytest.mark.ray
def test_bad_inputs_are_counted_in_the_manifest_and_reported(ray_local, tmp_path, capsys):
    d = tmp_path / "in"
    d.mkdir()
    (d / "good.txt").write_bytes(BERT_TEXT.encode())
    (d / "empty.txt").write_bytes(b"")
    (d / "bad.txt").write_bytes(b"Fine.\n\nBroken \xff here.\n\nFine too.\n")
    (d / "web.jsonl").write_text('{"text": "Ok."}\n{oops\n')
    config_file = tmp_path / "shard.yaml"
    config_file.write_text(f"inputs: ['{d}']\noutput_dir: '{tmp_path / 'out'}'\nnum_shards: 2\n")
    assert shard_main(["--config", str(config_file), "--num-workers", "2"]) == 0
    t = Manifest.read(tmp_path / "out").totals
    assert t["files_skipped"] == {"empty": 1}
    assert t["dropped"] == {"bad_json": 1, "invalid_utf8": 1}
    assert t["documents_read"] == t["documents_kept"] + 2 == 3 + 2 + 1 + 2
    err = capsys.readouterr().err
    assert "dropped documents: bad_json=1, invalid_utf8=1" in err and "bad.txt: invalid UTF-8" in err

    assert shard_main(["--config", str(config_file), "--on-bad-input", "fail", "--output-dir", str(tmp_path / "o2")]) == 2
    assert capsys.readouterr().err.startswith("bertflow: error: ")


@pytest.mark.ray
@pytest.mark.shared_data
def test_real_corpora_and_inspect(ray_local, shared_data, tmp_path, capsys):
    corpus = shared_data / "corpus"
    inputs = [corpus / "wikipedia_mlperf/wiki_00", corpus / "bert_sample", corpus / "gutenberg/pg11_alice_in_wonderland.txt"]
    m = run(cfg(inputs, tmp_path / "out", num_shards=4))
    assert m.totals["documents_kept"] == 37 + 3 + 1 and m.totals["dropped"] == {}
    assert m.stats["shard_rows"]["min"] >= 1
    assert inspect_main([str(tmp_path / "out"), "-n", "2", "--verify"]) == 0
    out = capsys.readouterr().out
    assert "documents dataset" in out and "documents_kept: 41" in out and "files checksums and rows: ok" in out


def test_module_entry_point_runs_as_a_script(tmp_path):
    """`python -m data_jobs.shard_job` (what `ray job submit -- python -m ...` runs): --help and a user error."""
    ok = subprocess.run([sys.executable, "-m", "data_jobs.shard_job", "--help"], cwd=REPO, capture_output=True, text=True)
    assert ok.returncode == 0 and "--num-shards" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "data_jobs.shard_job", "--output-dir", str(tmp_path)],
                         cwd=REPO, capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        "bertflow: error: command line: invalid config: inputs: Field required"
    ]


@pytest.mark.ray
@pytest.mark.shared_data
def test_inspect_decodes_instances_made_from_our_shards(ray_local, shared_data, bert_uncased_vocab, tmp_path, capsys):
    """shard -> vocab (adopted) -> instances, then `inspect` prints the instances module's decoding."""
    from data_jobs.config import InstancesConfig, VocabConfig
    from data_jobs.instances_job import run as run_instances
    from data_jobs.vocab_job import run as run_vocab

    # One shard: shard_read.read_documents once failed on table.take([]) (an empty row list), reported.
    run(cfg([shared_data / "corpus/bert_sample"], tmp_path / "docs", num_shards=1))
    run_vocab(VocabConfig(output_dir=str(tmp_path / "vocab"), vocab_file=str(bert_uncased_vocab)))
    run_instances(InstancesConfig(shards_dir=str(tmp_path / "docs"), vocab_dir=str(tmp_path / "vocab"),
                                  output_dir=str(tmp_path / "inst"), max_seq_length=64, dupe_factor=1))
    capsys.readouterr()
    assert inspect_main([str(tmp_path / "inst"), "-n", "2"]) == 0
    out = capsys.readouterr().out
    assert "instances dataset" in out and "first 2 instances:" in out
    assert "[CLS]" in out and "[MASK]" in out


def test_steps_without_ray_give_the_same_bytes_however_often_buckets_flush(corpus, tmp_path, monkeypatch):
    """The pure steps, called directly: tiny flushes (many bucket files per shard) change nothing."""
    from data_jobs.readers import expand_inputs

    def steps(out: Path, tasks: int) -> dict[str, bytes]:
        config = cfg([corpus], out, num_shards=3)
        units = expand_inputs(config)
        work = str(out / ".work")
        for t in range(tasks):
            shard_tasks.partition_units(units[t::tasks], config, t, work)
        for k in range(3):
            shard_tasks.find_duplicates(k, work)
        for s in range(3):
            shard_tasks.merge_shard(s, config, work, "key")
        return shards_of(out)

    reference = steps(tmp_path / "a", 1)
    monkeypatch.setattr(shard_tasks, "FLUSH_BYTES", 50)
    assert steps(tmp_path / "b", 3) == reference
    assert len(list((tmp_path / "b" / ".work" / "parts" / "00000").glob("*.parquet"))) > 10
