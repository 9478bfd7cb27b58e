"""Continual pretraining (flows.continual), really run: snapshots of real English text (the interpreter's
own help topics, so no shared data is needed), real shard/vocab/instances jobs, real training from the
promoted model's weights, held-out scoring of both models, the gate, the registry, the promoted export at
a stable path, and the Prefect flow under the test harness (state names and artifacts).

Sizes are tiny (tens of steps): the assertions are about what the flow guarantees (order, lineage,
records, what a rejected or failed firing leaves), and the gate's decision is checked against the rule
applied to the metrics the firing recorded, never against a number remembered from a run.
"""
from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from contracts.common import UserError
from flows.continual import ContinualConfig, Firings, fire, main, root_of, snapshots_in
from flows.gate import decide
from flows.registry import Registry
from hang import HANG_S

REPO = Path(__file__).resolve().parents[2]

GOOD = ("2026-11-01", "2026-11-08", "2026-11-15")
DUPES, FOREIGN, SHUFFLED = "2026-11-22", "2026-11-29", "2026-12-06"


def _write(d: Path, docs: list[tuple[str, str]]) -> None:
    d.mkdir(parents=True, exist_ok=True)
    (d / "part.jsonl").write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in docs), encoding="utf-8")


def make_snapshots(root: Path, names=GOOD, junk: bool = True) -> Path:
    """Three snapshots of distinct help topics; a mass-duplicated one (the first snapshot's documents,
    each five times under new ids); one in a script the vocab cannot read; one of the second and third
    snapshots' documents with each document's words shuffled."""
    from pydoc_data.topics import topics

    keys = sorted(topics)
    for i, name in enumerate(names):
        _write(root / name, [(k, topics[k]) for k in keys[i::3]])
    if junk:
        _write(root / DUPES, [(f"{k}-{n}", topics[k]) for k in keys[0::3] for n in range(5)])
        rng, alpha = random.Random(0), "абвгдежзийклмнопрстуфхцчшщыэюя"

        def sentence() -> str:
            return " ".join("".join(rng.choice(alpha) for _ in range(rng.randint(2, 9))) for _ in range(8)) + "."

        _write(root / FOREIGN, [(f"ru-{i}", " ".join(sentence() for _ in range(5))) for i in range(40)])
        shuffled = []
        for k in keys[1::3] + keys[2::3]:
            words = topics[k].split()
            rng.shuffle(words)
            shuffled.append((f"shuffled-{k}", " ".join(words)))
        _write(root / SHUFFLED, shuffled)
    return root


def config(source: Path, out: Path, **over) -> ContinualConfig:
    steps = {"model": "tiny", "micro_batch_size": 16, "log_every": 5, "tensorboard": False, "max_seq_length": 64}
    data = {
        "source": str(source), "output_root": str(out),
        "shard": {"input_format": "jsonl", "id_column": "id", "num_shards": 4, "num_workers": 1, "engine": "local"},
        "vocab": {"vocab_size": 1500, "min_frequency": 2},
        "instances": {"max_seq_length": 64, "max_predictions_per_seq": 10, "dupe_factor": 1, "num_workers": 1,
                      "engine": "local"},
        "train": {**steps, "max_steps": 20, "save_every": 20, "lr": 5e-4},
        "first_train": {**steps, "max_steps": 40, "save_every": 40, "lr": 1e-3},
        "intrinsic": {"batch_size": 32, "max_batches": 2, "use_ray": False, "show_progress": False},
        **over,
    }
    return ContinualConfig.model_validate(data)


@pytest.fixture(scope="module")
def fired(tmp_path_factory, harness):
    """Every snapshot decided by one firing of the Prefect flow, then a second firing with nothing new."""
    from flows.continual import _flow

    from tiny_tasks import write_tiny_sst2

    tmp = tmp_path_factory.mktemp("continual")
    source = make_snapshots(tmp / "corpus")
    glue = {"glue_dir": str(write_tiny_sst2(tmp / "glue")), "tasks": ["SST-2"], "learning_rates": [1e-3],
            "seeds": [1], "epochs": 1, "batch_size": 16, "max_seq_length": 16, "use_ray": False,
            "show_progress": False, "write_test_predictions": False}
    cfg = config(source, tmp / "out", downstream=glue)
    state = _flow()(cfg, return_state=True)
    again = _flow()(cfg, return_state=True)
    return {"cfg": cfg, "state": state, "again": again, "root": Path(root_of(cfg)), "source": source}


def _records(fired) -> dict[str, dict]:
    firings = Firings(fired["root"])
    return {s: firings.read(s) for s in snapshots_in(str(fired["source"]))[0]}


def test_every_snapshot_is_decided_in_order_and_junk_is_rejected_with_its_counts(fired):
    recs = _records(fired)
    assert list(recs) == [*GOOD, DUPES, FOREIGN, SHUFFLED] and all(recs.values())
    assert recs[GOOD[0]]["decision"] == "promote" and recs[GOOD[0]]["parent"] is None
    dupes = recs[DUPES]
    assert dupes["decision"] == "reject" and dupes["model"] is None
    # Nothing dropped silently: read = kept + every reason, and the reason quotes those counts.
    assert dupes["documents_read"] == dupes["documents_kept"] + sum(dupes["dropped"].values())
    assert dupes["dropped"].get("seen_earlier", 0) > 0 and f"of {dupes['documents_read']} documents" in dupes["reason"]
    assert recs[FOREIGN]["decision"] == "reject" and "[UNK]" in recs[FOREIGN]["reason"]
    assert recs[SHUFFLED]["decision"] == "reject" and "word order" in recs[SHUFFLED]["reason"]
    assert not list((fired["root"] / "runs").glob(f"{DUPES}-*")), "a rejected snapshot was trained on"
    # The run's state in the UI names the outcome of the last snapshot decided.
    assert fired["state"].is_completed() and fired["state"].name == "Rejected"


def test_the_gate_decision_is_the_rule_applied_to_the_recorded_metrics(fired):
    """Held-out losses of both models on the same sets, and a downstream task fine-tuned from both at the
    same seed; the decision is the configured rule applied to them (downstream/SST-2 checked by default)."""
    recs, gate = _records(fired), fired["cfg"].gate
    for snap in GOOD[1:]:
        rec = recs[snap]
        cand, prom = rec["losses"]["candidate"], rec["losses"]["promoted"]
        assert set(cand) == set(prom) and snap in cand and GOOD[0] in cand  # both models, same held-out sets
        old = [s for s in cand if s != snap]
        metrics = {who: {"heldout_loss_new": ls[snap], "heldout_loss_old": sum(ls[s] for s in old) / len(old),
                         "downstream/SST-2": rec["metrics"][who]["downstream/SST-2"]}
                   for who, ls in (("candidate", cand), ("promoted", prom))}
        assert all(0 <= m["downstream/SST-2"] <= 100 for m in metrics.values())
        rule = gate.model_copy(update={"downstream": ["downstream/SST-2"]})
        assert decide(metrics["candidate"], metrics["promoted"], rule).decision == rec["decision"]
        assert [c["metric"] for c in rec["gate"]["checks"]] == ["heldout_loss_new", "heldout_loss_old",
                                                                "downstream/SST-2"]


def test_registry_lineage_and_the_promoted_export_at_a_stable_path(fired):
    import hashlib

    recs = _records(fired)
    reg = Registry(str(fired["root"] / "registry"))
    entries = {e.id: e for e in reg.list()}
    assert len(entries) == 3  # one per trained snapshot; rejected ones register nothing
    for snap in GOOD:
        e = entries[recs[snap]["model"]]
        assert e.gate.decision == recs[snap]["decision"] and e.parent == recs[snap]["parent"]
        assert e.snapshots[-1] == snap
        if e.parent:  # continued from the model promoted at the time, on its snapshots plus this one
            assert e.snapshots == [*entries[e.parent].snapshots, snap]
            assert json.loads((Path(e.info["run_dir"]) / "train_config.json").read_text())["config"]["init_from"] == entries[e.parent].export
    promoted = reg.promoted()
    last_promoted = [s for s in GOOD if recs[s]["decision"] == "promote"][-1]
    assert promoted.id == recs[last_promoted]["model"]
    digest = lambda p: hashlib.sha256(p.read_bytes()).hexdigest()
    stable = fired["root"] / "promoted"
    assert digest(stable / "model.safetensors") == digest(Path(promoted.export) / "model.safetensors")
    assert (stable / "vocab.txt").read_bytes() == (Path(promoted.export) / "vocab.txt").read_bytes()


def test_a_firing_with_no_new_snapshot_does_nothing_and_says_so(fired):
    again = fired["again"]
    assert again.is_completed() and again.name == "No new data"
    before = {p: p.stat().st_mtime_ns for p in fired["root"].rglob("*") if p.is_file()}
    lines = []
    assert fire(fired["cfg"], log=lines.append) == {"new": [], "decided": []}
    assert "new: none (nothing to do)" in lines[-1]
    assert {p: p.stat().st_mtime_ns for p in fired["root"].rglob("*") if p.is_file()} == before


def test_gate_tables_and_registry_are_prefect_artifacts(fired):
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    run_id = fired["state"].state_details.flow_run_id
    with get_client(sync_client=True) as client:
        arts = client.read_artifacts(artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[run_id])))
    gates = [a.data for a in arts if a.key == "bertflow-gate"]
    assert len(gates) == 6 and any("| held-out snapshot |" in g for g in gates)
    assert any(a.key == "bertflow-registry" and "(promoted)" in a.data for a in arts)
    report = (fired["root"] / "continual" / "reports" / f"{GOOD[1]}.md").read_text()
    assert report in gates


def test_a_continued_run_trains_on_the_new_snapshot_plus_a_replay_of_earlier_ones(fired):
    from contracts.schema import Manifest

    recs = _records(fired)
    rec = recs[GOOD[2]]
    mix = Manifest.read(rec["data_dir"], kind="instances")
    sources = mix.totals["sources"]
    parent_snaps = Registry(str(fired["root"] / "registry")).get(rec["parent"]).snapshots
    assert [s["dir"] for s in sources] == [rec["train_instances"]] + [recs[s]["train_instances"] for s in parent_snaps]
    assert [s["weight"] for s in sources] == [1.0] + [fired["cfg"].replay] * len(parent_snaps)
    assert sources[0]["rows_taken"] == sources[0]["rows_in"]  # every new instance, and a sample of the rest
    assert all(0 < s["rows_taken"] < s["rows_in"] for s in sources[1:])
    assert sum(s["rows_taken"] for s in sources) == mix.totals["instances"]


def test_a_failed_firing_leaves_the_promoted_model_and_the_next_resumes(tmp_path, fired):
    """...and the whole run is a pure function of (snapshots, config, seed): the candidate of the second
    snapshot, trained in another tree by a firing that failed and was fired again, is the one the module's
    single firing trained, byte for byte."""
    from flows.continual import _direct
    from flows.stages import ExportStage, TrainStage

    source = make_snapshots(tmp_path / "corpus", names=GOOD[:2], junk=False)
    heard = tmp_path / "notified.jsonl"
    hook = [sys.executable, "-c", f"import sys; open({str(heard)!r}, 'a').write(sys.stdin.read() + chr(10))"]
    cfg = config(source, tmp_path / "out", notify=hook)
    seen = []

    def failing(stage):
        if isinstance(stage, ExportStage) and GOOD[1] in stage.run_dir:
            raise RuntimeError("node lost")
        return _direct(stage)

    with pytest.raises(RuntimeError, match="node lost"):
        fire(cfg, failing, log=lambda line: None)
    reg = Registry(str(tmp_path / "out" / "registry"))
    first = reg.promoted()
    assert first.snapshots == [GOOD[0]] and Firings(root_of(cfg)).read(GOOD[1]) is None

    def watching(stage):
        if isinstance(stage, TrainStage):
            seen.append(stage.status().state)
        return _direct(stage)

    result = fire(cfg, watching, log=lambda line: None)
    assert [r["snapshot"] for r in result["decided"]] == [GOOD[1]]
    assert seen == ["done"]  # the candidate trained by the failed firing is not trained again
    assert reg.get(result["decided"][0]["model"]).parent == first.id
    told = [json.loads(line) for line in heard.read_text().splitlines()]
    assert [(t["snapshot"], t["decision"]) for t in told] == [
        (GOOD[0], "promote"), (GOOD[1], "failed"), (GOOD[1], result["decided"][0]["decision"])]
    assert "node lost" in told[1]["reason"]
    assert told[2]["seconds"]["train"] < told[2]["seconds"]["firing"]
    here = Path(result["decided"][0]["export"]) / "model.safetensors"
    there = Path(_records(fired)[GOOD[1]]["export"]) / "model.safetensors"
    assert here.read_bytes() == there.read_bytes()
    # A manual rollback (or forced promotion) is followed by promoted/ at the next firing, new data or not.
    second = reg.get(result["decided"][0]["model"])
    if reg.promoted_id() == second.id:
        reg.rollback(reason="test")
    else:
        reg.promote(second.id, force=True, reason="test")
    assert fire(cfg, log=lambda line: None)["new"] == []
    stable = (tmp_path / "out" / "promoted" / "model.safetensors").read_bytes()
    assert stable == (Path(reg.promoted().export) / "model.safetensors").read_bytes()


def test_files_landing_in_one_flat_folder_are_a_snapshot_per_firing(tmp_path):
    """layout new_files: each firing takes the files no firing has taken as one snapshot (named in firing
    order), continues the promoted model on them, and records them; a firing with no new file does
    nothing; a file replaced with more text is taken again and its earlier documents count as seen."""
    from pydoc_data.topics import topics

    keys = sorted(topics)
    flat = tmp_path / "landing"
    flat.mkdir()

    def land(name: str, ks: list[str]) -> None:
        (flat / name).write_text("".join(json.dumps({"id": k, "text": topics[k]}) + "\n" for k in ks), encoding="utf-8")

    land("a.jsonl", keys[0::4])
    land("b.jsonl", keys[1::4])
    (flat / "old").mkdir()  # sub-folders and hidden files are not part of a flat folder
    (flat / "old" / "x.jsonl").write_text("{}\n")
    (flat / ".partial").write_text("uploading")
    steps = {"max_steps": 8, "save_every": 8}
    cfg = config(flat, tmp_path / "out", layout="new_files",
                 train={**config(flat, tmp_path / "x").train.model_dump(), **steps},
                 first_train={**config(flat, tmp_path / "x").first_train.model_dump(), **steps})
    lines: list[str] = []
    first = fire(cfg, log=lines.append)
    [rec1] = first["decided"]
    assert rec1["snapshot"].startswith("00001-") and rec1["decision"] == "promote"  # nothing promoted yet
    assert [f[0] for f in rec1["files"]] == ["a.jsonl", "b.jsonl"]
    assert any("ignored" in ln and ".partial" in ln and "old" in ln for ln in lines)
    assert fire(cfg, log=lines.append) == {"new": [], "decided": []} and "new: none (nothing to do)" in lines[-1]

    land("c.jsonl", keys[2::4])
    land("a.jsonl", keys[0::4] + keys[3::4])  # replaced: the same name with more text
    dry = fire(cfg, dry_run=True, log=lines.append)
    [name] = dry["new"]
    assert name.startswith("00002-") and "new files under" in lines[-1] and ": 2;" in lines[-1]
    [rec2] = fire(cfg, log=lines.append)["decided"]
    assert rec2["snapshot"] == name and [f[0] for f in rec2["files"]] == ["a.jsonl", "c.jsonl"]
    assert rec2["parent"] == rec1["model"]  # continued from the promoted model
    assert rec2["documents_read"] == len(keys[0::4]) + len(keys[3::4]) + len(keys[2::4])  # a.jsonl whole, c.jsonl
    assert rec2["dropped"]["seen_earlier"] >= len(keys[0::4])  # a.jsonl's first documents (and equal texts)
    assert rec2["documents_kept"] + sum(rec2["dropped"].values()) == rec2["documents_read"]  # none lost
    assert set(rec2["losses"]["candidate"]) == {rec1["snapshot"], name}  # scored on both snapshots' held-out
    assert [r["snapshot"] for r in Firings(root_of(cfg)).all()] == [rec1["snapshot"], name]


def test_two_firings_never_run_at_once(tmp_path):
    """A firing holds the writer lock of <output_root>/continual: a second one (another process, as a
    second schedule tick or a person's manual run would be) gets one line and exit 2, before any work."""
    source = make_snapshots(tmp_path / "corpus", names=GOOD[:1], junk=False)
    cfg = config(source, tmp_path / "out")
    path = tmp_path / "continual.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    with Firings(root_of(cfg)).lock():
        proc = subprocess.run([sys.executable, "-m", "flows.continual", "--config", str(path), "--no-prefect"],
                              capture_output=True, text=True, cwd=REPO, timeout=HANG_S)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("bertflow: error: ") and "lock" in proc.stderr
    assert not (tmp_path / "out" / "documents").exists()  # refused before any work


def test_output_inside_source_local_or_on_a_store():
    from flows.continual import inside

    assert inside("s3://b/corpus", "s3://b/corpus/") and inside("s3://b/corpus/out/x", "s3://b/corpus")
    assert not inside("s3://b/corpus-2", "s3://b/corpus") and not inside("s3://b/out", "s3://b/corpus")
    assert not inside("s3://b/corpus/out", "/local/corpus") and not inside("/b/corpus/out", "s3://b/corpus")
    assert inside("/data/corpus/out", "/data/corpus") and not inside("/data/corpus-2", "/data/corpus")


def test_hostile_sources_and_records(tmp_path, capsys):
    source = make_snapshots(tmp_path / "corpus", names=GOOD[:1], junk=False)
    (source / "notes.txt").write_text("mine")
    (source / "bad name!").mkdir()
    lines = []
    assert fire(config(source, tmp_path / "out"), dry_run=True, log=lines.append)["new"] == [GOOD[0]]
    assert "ignored" in lines[0] and "notes.txt" in lines[0] and "bad name!" in lines[0]
    with pytest.raises(UserError, match="inside source"):
        fire(config(source, source / "out"), log=lines.append)
    with pytest.raises(UserError, match="inside source"):  # on an object store too, refused before any listing
        fire(config("s3://bucket/corpus/", "s3://bucket/corpus/out"), log=lines.append)
    with pytest.raises(UserError, match="not found"):
        fire(config(tmp_path / "missing", tmp_path / "out"), log=lines.append)
    firings = Firings(tmp_path / "out")
    firings.write(GOOD[0], {"snapshot": GOOD[0], "decision": "keep"})
    path = tmp_path / "out" / "continual" / "firings" / f"{GOOD[0]}.json"
    path.write_text(path.read_text().replace("keep", "promote"))
    with pytest.raises(UserError, match="edited or corrupt"):
        fire(config(source, tmp_path / "out"), log=lines.append)


def test_cli_dry_run_and_config_errors(tmp_path, capsys):
    source = make_snapshots(tmp_path / "corpus", names=GOOD[:2], junk=False)
    cfg = tmp_path / "continual.yaml"
    cfg.write_text(yaml.safe_dump(config(source, tmp_path / "out").model_dump(mode="json")))
    assert main(["--config", str(cfg), "--dry-run"]) == 0
    assert f"new: {GOOD[0]}, {GOOD[1]}" in capsys.readouterr().out
    bad = tmp_path / "typo.yaml"
    bad.write_text(cfg.read_text().replace("replay:", "replya:"))
    assert main(["--config", str(bad), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("bertflow: error: ") and "replya" in err
    shutil.rmtree(source)
    assert main(["--config", str(cfg), "--dry-run"]) == 2
    assert "not found" in capsys.readouterr().err


def _commands_after(text: str, marker: str) -> list[str]:
    start = text.index("```bash", text.index(marker)) + 7
    return [c.strip() for c in text[start:text.index("```", start)].splitlines() if c.strip()]


@pytest.mark.slow
@pytest.mark.prefect
def test_documented_commands_run_as_written(shared_data, tmp_path):
    """docs/continual.md's "Try it" block, run as written (bash, bertflow on PATH) from a directory beside
    a cut-short ../shared/data, with recipes/ as in the repository; the temporary Prefect API as a user
    without PREFECT_API_URL gets."""
    import os

    commands = _commands_after((REPO / "docs" / "continual.md").read_text(), "## Try it")
    assert any("bertflow continual --config recipes/continual.yaml" == c for c in commands)
    work = tmp_path / "work"
    work.mkdir()
    (work / "recipes").symlink_to(REPO / "recipes")
    wiki = tmp_path / "shared" / "data" / "corpus" / "wikipedia_mlperf"
    wiki.mkdir(parents=True)
    for name in ("wiki_00", "wiki_01"):  # the first articles of each, whole
        lines, out = (shared_data / "corpus" / "wikipedia_mlperf" / name).read_text().splitlines(True), []
        for line in lines:
            out.append(line)
            if len(out) > 400 and line.strip() == "</doc>":
                break
        (wiki / name).write_text("".join(out))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    outputs = []
    for cmd in commands:
        proc = subprocess.run(["bash", "-c", cmd], cwd=work, env=env, capture_output=True, text=True, timeout=HANG_S)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, f"{cmd}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
        outputs.append(proc.stdout + proc.stderr)
    assert "new: 2026-12-01, 2026-12-08" in outputs[commands.index("bertflow continual --config recipes/continual.yaml --dry-run")]
    firings = Firings(work / "runs" / "continual")
    first, second = firings.read("2026-12-01"), firings.read("2026-12-08")
    assert first["decision"] == "promote" and second["decision"] in ("promote", "keep") and second["parent"] == first["model"]
    assert "2026-12-08" in outputs[-3] and "| held-out snapshot |" in outputs[-2]  # models list; the report
    assert "new: none (nothing to do)" in outputs[-1]


def test_source_registry_and_outputs_on_an_object_store(s3_env, scratch, tmp_path):
    """Snapshots under an s3:// prefix, every output and the registry on the store (a real S3-compatible
    server): the same decisions, records and lineage as on local disk, the promoted export on the store."""
    from contracts.storage import location

    local = make_snapshots(tmp_path / "corpus", names=GOOD[:2], junk=False)
    store = location(f"{s3_env}/corpus")
    for f in sorted(local.rglob("*.jsonl")):
        store.upload(str(f.relative_to(local)), f)
    cfg = config(f"{s3_env}/corpus", f"{s3_env}/runs")
    result = fire(cfg, log=lambda line: None)
    assert [r["snapshot"] for r in result["decided"]] == list(GOOD[:2])
    firings = Firings(root_of(cfg))
    first, second = firings.read(GOOD[0]), firings.read(GOOD[1])
    assert first["decision"] == "promote" and second["parent"] == first["model"]
    reg = Registry(f"{s3_env}/runs/registry")
    assert reg.get(second["model"]).export.startswith(f"{s3_env}/runs/export/")
    promoted = location(f"{s3_env}/runs/promoted")
    assert promoted.read("model.safetensors") == location(reg.promoted().export).read("model.safetensors")
    assert fire(cfg, log=lambda line: None) == {"new": [], "decided": []}


def test_word_order_tells_running_text_from_shuffled_words(tmp_path):
    """The word-order statistic on real text (the help topics, sharded by the real job) and on the same
    documents with their words shuffled: far apart, on either side of the default threshold."""
    import random as rnd

    from data_jobs.config import ShardConfig
    from data_jobs.shard_job import run
    from flows.continual import Quality
    from flows.snapshot_checks import word_order
    from pydoc_data.topics import topics

    keys = sorted(topics)
    plain = [(k, topics[k]) for k in keys]
    rng = rnd.Random(1)
    shuffled = [(k, " ".join(rng.sample(t.split(), len(t.split())))) for k, t in plain]
    scores = {}
    for name, docs in (("plain", plain), ("shuffled", shuffled)):
        _write(tmp_path / name, docs)
        out = tmp_path / f"docs-{name}"
        m = run(ShardConfig(inputs=[str(tmp_path / name)], output_dir=str(out), input_format="jsonl",
                            id_column="id", num_shards=2, num_workers=1, engine="local"))
        scores[name], words = word_order(str(out), m)
        assert words >= 10_000
    threshold = Quality().min_word_order
    assert scores["shuffled"] < threshold < scores["plain"] and scores["plain"] > 5 * scores["shuffled"], scores
