"""A corpus read as a sequence of snapshots (issue 25): the shard job given the documents datasets of
earlier snapshots (``earlier``) keeps no document one of them holds — by the same text or the same doc_id
(``seen_by``) — and counts each under ``seen_earlier``, so read = kept + every dropped reason; the
manifest's lineage names every snapshot; the result does not depend on the worker count; an earlier
dataset that changed makes the snapshot's status stale; one that is not a documents dataset is one line."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from contracts.common import UserError
from contracts.schema import Manifest
from data_jobs.config import ShardConfig
from data_jobs.shard_job import main, run, status

TEXT = {
    "a": "The river rose in the spring. Boats stayed in the harbour for a week.",
    "b": "A lamp burned in the window. Nobody came to the door that night.",
    "c": "Snow fell on the hills. The sheep were brought down to the farm.",
    "d": "The market opened at dawn. Fish and bread were sold by noon.",
}


def _jsonl(path: Path, docs: list[tuple[str, str]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in docs), encoding="utf-8")
    return path


def _cfg(inputs: Path, out: Path, **kw) -> ShardConfig:
    base = dict(inputs=[str(inputs)], output_dir=str(out), input_format="jsonl", id_column="id", num_shards=3,
                num_workers=1, engine="local")
    return ShardConfig(**{**base, **kw})


@pytest.fixture
def snapshots(tmp_path) -> dict[str, Path]:
    """Snapshot 1: a, b, c. Snapshot 2: b's text again under another id, c's id with new text, d, and a
    document twice (the same id and text: an ordinary duplicate, not an earlier snapshot's)."""
    first = _jsonl(tmp_path / "corpus" / "2026-12-01" / "part.jsonl", [(k, TEXT[k]) for k in "abc"])
    second = _jsonl(tmp_path / "corpus" / "2026-12-02" / "part.jsonl",
                    [("b2", TEXT["b"]), ("c", "The hills were green again. " + TEXT["d"]), ("d", TEXT["d"]),
                     ("e", TEXT["a"] + " It was the first week of May."), ("e", TEXT["a"] + " It was the first week of May.")])
    one = run(_cfg(first, tmp_path / "docs-1", snapshot="2026-12-01"))
    assert one.totals["documents_kept"] == 3 and one.stats["lineage"]["snapshots"] == ["2026-12-01"]
    return {"first": first, "second": second, "docs1": tmp_path / "docs-1", "tmp": tmp_path}


def _ids(out: Path) -> list[str]:
    import pyarrow.parquet as pq

    return sorted(i for f in sorted(out.glob("shard-*.parquet")) for i in pq.read_table(f).column("doc_id").to_pylist())


@pytest.mark.parametrize("seen_by, gone", [("content", "b2"), ("id", "c")])
def test_a_document_an_earlier_snapshot_holds_is_not_kept_again_and_is_counted(snapshots, seen_by, gone):
    s = snapshots
    out = s["tmp"] / f"docs-2-{seen_by}"
    m = run(_cfg(s["second"], out, earlier=[str(s["docs1"])], seen_by=seen_by, snapshot="2026-12-02"))
    ids = _ids(out)  # doc_id: the file's name under its input root, then the id column's value
    assert f"part.jsonl#{gone}" not in ids and len(ids) == 3 and ids.count("part.jsonl#e") == 1
    t = m.totals
    assert t["dropped"].get("seen_earlier") == 1 and t["dropped"].get("duplicate") == 1
    assert t["documents_read"] == 5 == t["documents_kept"] + sum(t["dropped"].values())  # conservation
    lin = m.stats["lineage"]
    assert lin["snapshots"] == ["2026-12-01", "2026-12-02"] and lin["seen_by"] == seen_by
    assert lin["earlier"] == [{"snapshot": "2026-12-01", "identity": Manifest.read(s["docs1"]).identity(),
                               "documents": 3}]
    assert status(_cfg(s["second"], out, earlier=[str(s["docs1"])], seen_by=seen_by, snapshot="2026-12-02")).done


def test_the_same_bytes_whatever_the_worker_count_and_a_third_snapshot_names_all(snapshots):
    s = snapshots
    cfg = dict(earlier=[str(s["docs1"])], snapshot="2026-12-02")
    one = run(_cfg(s["second"], s["tmp"] / "w1", **cfg))
    two = run(_cfg(s["second"], s["tmp"] / "w2", num_workers=2, **cfg))
    assert [(f.name, f.sha256) for f in one.files] == [(f.name, f.sha256) for f in two.files]
    third = _jsonl(s["tmp"] / "corpus" / "2026-12-03" / "part.jsonl", [("f", TEXT["d"]), ("g", TEXT["c"])])
    m = run(_cfg(third, s["tmp"] / "docs-3", earlier=[str(s["docs1"]), str(s["tmp"] / "w1")], snapshot="2026-12-03"))
    assert m.stats["lineage"]["snapshots"] == ["2026-12-01", "2026-12-02", "2026-12-03"]
    assert m.totals["documents_kept"] == 0 and m.totals["dropped"] == {"seen_earlier": 2}  # c in 1, d in 2


def test_a_changed_earlier_snapshot_makes_the_later_one_stale(snapshots):
    s = snapshots
    cfg = _cfg(s["second"], s["tmp"] / "docs-2", earlier=[str(s["docs1"])])
    run(cfg)
    assert status(cfg).done
    _jsonl(s["first"], [(k, TEXT[k]) for k in "abcd"])  # snapshot 1 re-read with one more document
    run(_cfg(s["first"], s["docs1"], snapshot="2026-12-01"))
    state = status(cfg)
    assert state.state == "absent" and "inputs changed" in state.reason


def test_an_earlier_path_that_is_no_documents_dataset_is_one_line(snapshots, capsys):
    s = snapshots
    args = ["--inputs", str(s["second"]), "--input-format", "jsonl", "--id-column", "id", "--engine", "local",
            "--output-dir", str(s["tmp"] / "x")]
    assert main(args + ["--earlier", str(s["tmp"] / "nothing")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("bertflow: error: earlier: ") and "nothing" in err[0], err
    assert not (s["tmp"] / "x").exists()


def test_options_at_their_defaults_leave_hashes_and_names_as_before(tmp_path):
    """Adding earlier/seen_by/snapshot (and max_input_files) changed no existing dataset's config hash or
    pipeline directory."""
    from flows.config import demo_config, make_plan

    cfg = _cfg(tmp_path / "in.jsonl", tmp_path / "out")
    data = cfg.model_dump(mode="json", exclude=set(cfg.run_fields | cfg.input_fields))
    for k in ("seen_by", "snapshot", "max_input_files"):
        data.pop(k)
    from contracts.common import stable_hash

    assert cfg.config_hash() == stable_hash(data)
    assert cfg.model_copy(update={"seen_by": "id"}).config_hash() != cfg.config_hash()
    plan = make_plan(demo_config(str(tmp_path / "demo")))
    assert Path(plan.shard.output_dir).name == Path(make_plan(demo_config(str(tmp_path / "demo"))).shard.output_dir).name


def test_the_documented_snapshot_commands_run_as_written(tmp_path, monkeypatch, capsys):
    """docs/data-shard.md's two commands, verbatim, in a directory holding two dated corpus folders."""
    import shlex

    from flows.cli import main as cli

    doc = (Path(__file__).resolve().parents[2] / "docs" / "data-shard.md").read_text(encoding="utf-8")
    block = doc[doc.index("## Snapshots"):]
    block = block[block.index("```bash") + 7:block.index("```", block.index("```bash") + 7)]
    cmds = [c for c in block.strip().splitlines() if c.strip()]
    assert len(cmds) == 2 and all(c.startswith("bertflow data shard ") for c in cmds)
    one = "\n\n".join(TEXT[k].replace(". ", ".\n") for k in "abc") + "\n"
    two = "\n\n".join(TEXT[k].replace(". ", ".\n") for k in "bd") + "\n"  # b again: seen earlier
    (tmp_path / "corpus" / "2026-12-01").mkdir(parents=True)
    (tmp_path / "corpus" / "2026-12-02").mkdir(parents=True)
    (tmp_path / "corpus" / "2026-12-01" / "crawl.txt").write_text(one, encoding="utf-8")
    (tmp_path / "corpus" / "2026-12-02" / "crawl.txt").write_text(two, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    for cmd in cmds:
        assert cli(shlex.split(cmd)[1:]) == 0, capsys.readouterr().err
    m = Manifest.read(tmp_path / "runs" / "docs-2026-12-02")
    assert m.totals["documents_kept"] == 1 and m.totals["dropped"] == {"seen_earlier": 1}
    assert m.stats["lineage"]["snapshots"] == ["2026-12-01", "2026-12-02"]


def test_an_earlier_snapshot_on_an_object_store(snapshots, s3_env, scratch):
    """The earlier dataset as an s3:// prefix (its files fetched and checked against its manifest): the
    same shards and counts as with the local earlier dataset."""
    s = snapshots
    run(_cfg(s["first"], s3_env + "/docs-1", snapshot="2026-12-01"))
    local = run(_cfg(s["second"], s["tmp"] / "from-local", earlier=[str(s["docs1"])], snapshot="2026-12-02"))
    remote = run(_cfg(s["second"], s["tmp"] / "from-s3", earlier=[s3_env + "/docs-1"], snapshot="2026-12-02"))
    assert [(f.name, f.sha256) for f in remote.files] == [(f.name, f.sha256) for f in local.files]
    assert remote.totals == local.totals and remote.totals["dropped"]["seen_earlier"] == 1
