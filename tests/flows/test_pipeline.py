"""The whole pipeline flow on a small real corpus under Prefect's test harness: outputs, artifacts,
a stage failing once and succeeding on its retry, a rerun skipping every stage, a training run
killed with SIGKILL and resumed from its last checkpoint, and (last) a corpus file edited in place
making the rerun redo every stage, each saying why."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from flowtest_support import flow_logs, tiny_config
from hang import HANG_S  # noqa: E402  (the suite's one hang guard)

pytestmark = [pytest.mark.prefect, pytest.mark.slow, pytest.mark.shared_data, pytest.mark.ray]

STAGES = ("shard", "vocab", "instances", "train:phase1", "train:phase2", "export", "eval:intrinsic")


_flow_logs = flow_logs  # flowtest_support: drained, then every page


def _all_run_ids(flow_run_id) -> list:
    """The run and its subflow runs (stage flows)."""
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

    with get_client(sync_client=True) as client:
        children = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[flow_run_id]))
        )
    return [flow_run_id] + [c.id for c in children]


@pytest.fixture(scope="module")
def first_run(harness, tmp_path_factory, corpus_file):
    from flows.pipeline import pretraining_pipeline
    from flows.tasks import FAULT_ENV

    root = tmp_path_factory.mktemp("pipeline")
    corpus = root / "corpus" / corpus_file.name  # a copy: the last test edits it
    corpus.parent.mkdir()
    corpus.write_bytes(corpus_file.read_bytes())
    cfg = tiny_config(root, corpus, two_phases=True)
    os.environ[FAULT_ENV] = "vocab"  # the vocab stage fails once with a transient error
    try:
        t0 = time.monotonic()
        state = pretraining_pipeline(cfg, return_state=True)
        seconds = time.monotonic() - t0
    finally:
        os.environ.pop(FAULT_ENV)
    return {"cfg": cfg, "state": state, "root": root, "seconds": seconds}


def test_pipeline_produces_every_output(first_run):
    from contracts.schema import Manifest
    from flows.config import make_plan

    assert first_run["state"].is_completed(), first_run["state"]
    result = first_run["state"].result()
    plan = make_plan(first_run["cfg"])
    for cfg, kind in ((plan.shard, "documents"), (plan.vocab, "vocab"), (plan.instances["phase1"], "instances")):
        m = Manifest.read(cfg.output_dir)
        assert m.kind == kind and m.config_hash == cfg.config_hash()
        assert not m.verify_files(cfg.output_dir)
    docs = Manifest.read(plan.shard.output_dir)
    assert sum(f.rows for f in docs.files) == 37  # wiki_00 holds 37 articles
    rec = result["train"]["phases"]["phase1"]
    ckpt = Path(rec["last_checkpoint"])
    assert ckpt.name == "step_00000006" and (ckpt / "COMPLETE").is_file()
    steps = [json.loads(l)["step"] for l in Path(rec["metrics_file"]).read_text().splitlines()]
    assert steps[-1] == 6
    # Phase 2 trained on seq-64 instances, starting from phase 1's weights; its model is exported.
    rec2 = result["train"]["phases"]["phase2"]
    assert Path(rec2["last_checkpoint"]).name == "step_00000003"
    saved = json.loads((Path(rec2["run_dir"]) / "train_config.json").read_text())["config"]
    assert saved["init_from"] == rec["run_dir"] and saved["data_dir"] == plan.instances["phase2"].output_dir
    assert Manifest.read(plan.instances["phase2"].output_dir).config["max_seq_length"] == 64
    assert Path(result["train"]["export_dir"]).name == Path(rec2["run_dir"]).name
    assert (Path(result["train"]["export_dir"]) / "config.json").is_file()
    intrinsic = result["eval"]["intrinsic"]
    assert intrinsic and (Path(plan.evals["intrinsic"].output_dir) / "results.json").is_file()
    png = Path(result["train"]["loss_curve"])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = Path(result["summary"]).read_text()
    assert rec2["last_checkpoint"] in summary and rec2["metrics_file"] in summary


def test_failed_stage_retried_once(first_run):
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    marker = list(Path(first_run["root"], "vocab").glob(".fault-injected-vocab-*"))
    assert marker, "the injected fault did not fire"
    ids = _all_run_ids(first_run["state"].state_details.flow_run_id)
    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=ids)))
    data_runs = [r for r in runs if r.name.startswith("data-job")]
    assert sorted(r.run_count for r in data_runs)[-1] == 2  # vocab: failed, retried
    assert all(r.state.is_completed() for r in data_runs)
    logs = "\n".join(m for i in ids for m in _flow_logs(i))
    assert "injected transient fault in stage vocab" in logs


def test_artifacts_published(first_run):
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    ids = _all_run_ids(first_run["state"].state_details.flow_run_id)
    with get_client(sync_client=True) as client:
        arts = client.read_artifacts(artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=ids)))
    kinds = {a.key: a.type for a in arts}
    assert kinds == {
        "bertflow-data-stats": "table", "bertflow-train-metrics": "table", "bertflow-loss-curve": "image",
        "bertflow-eval-results": "table", "bertflow-summary": "markdown",
    }
    stats = json.loads(next(a.data for a in arts if a.key == "bertflow-data-stats"))
    assert {row["stage"] for row in stats} >= {"documents", "vocab", "instances:phase1", "instances:heldout"}
    # The top-level run itself holds every table and the loss curve, not only the summary (issue 10).
    top = first_run["state"].state_details.flow_run_id
    assert {a.key for a in arts if a.flow_run_id == top} == set(kinds)


def test_rerun_skips_every_stage(first_run):
    from flows.config import make_plan
    from flows.pipeline import pretraining_pipeline

    plan = make_plan(first_run["cfg"])
    watched = [Path(plan.shard.output_dir) / "manifest.json", Path(plan.vocab.output_dir) / "manifest.json",
               Path(plan.train["phase1"].output_dir) / "metrics.jsonl"]
    before = [p.stat().st_mtime_ns for p in watched]
    state = pretraining_pipeline(first_run["cfg"], return_state=True)
    assert state.is_completed()
    assert [p.stat().st_mtime_ns for p in watched] == before
    logs = "\n".join(m for i in _all_run_ids(state.state_details.flow_run_id) for m in _flow_logs(i))
    for stage in STAGES:
        assert f"stage {stage}: skipped (complete)" in logs, stage


def test_killed_training_resumes(first_run, harness, tmp_path):
    """SIGKILL the training stage mid-run (a separate process), then run it again: it continues from
    the last checkpoint instead of starting over or refusing the existing run directory."""
    from flows.config import PipelineConfig, make_plan
    from flows.pipeline import pretrain

    data = first_run["cfg"].model_dump(mode="json")
    data["phases"] = data["phases"][:1]
    data["phases"][0]["train"].update(max_steps=60, save_every=3, log_every=1)
    cfg = PipelineConfig.model_validate(data)  # same data stages (skipped), a new run dir
    run_dir = Path(make_plan(cfg).train["phase1"].output_dir)
    cfg_file = tmp_path / "cfg.yaml"
    cfg_file.write_text(yaml.safe_dump(data))
    env = {**os.environ, "PREFECT_API_URL": harness}
    proc = subprocess.Popen([sys.executable, "-m", "flows.pipeline", "--config", str(cfg_file), "--stage", "train"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + HANG_S
        while not list((run_dir / "checkpoints").glob("step_*/COMPLETE")):
            assert proc.poll() is None, "training process ended before its first checkpoint"
            assert time.monotonic() < deadline, "no checkpoint after 120 s"
            time.sleep(0.01)  # the next checkpoint is a few steps away: notice this one quickly
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    killed_at = max(int(p.parent.name.split("_")[1]) for p in (run_dir / "checkpoints").glob("step_*/COMPLETE"))
    from bert_core.train import status

    assert killed_at < 60 and status(make_plan(cfg).train["phase1"]).state == "partial"
    result = pretrain(cfg)
    rec = result["phases"]["phase1"]
    assert rec["resumed"] is True
    assert Path(rec["last_checkpoint"]).name == "step_00000060"
    steps = [json.loads(l)["step"] for l in Path(rec["metrics_file"]).read_text().splitlines() if l.strip()]
    assert steps[-1] == 60 and killed_at in steps


def test_evaluate_any_checkpoint(first_run):
    """The evaluate flow alone, on an earlier checkpoint: results land beside the pipeline's own."""
    from flows.config import make_plan
    from flows.pipeline import evaluate

    plan = make_plan(first_run["cfg"])
    ckpt = Path(plan.train["phase1"].output_dir) / "checkpoints" / "step_00000004"
    assert ckpt.is_dir()
    own = Path(plan.evals["intrinsic"].output_dir) / "results.json"
    before = own.read_bytes()
    results = evaluate(first_run["cfg"], model_path=str(ckpt))
    assert results["intrinsic"]
    outs = list(own.parent.parent.glob(own.parent.name + "-model-*/results.json"))
    assert len(outs) == 1 and outs[0].read_bytes() != before
    assert own.read_bytes() == before


def test_edited_corpus_redoes_every_stage(first_run):
    """Runs last: edits the (copied) corpus in place; the rerun redoes shard and everything downstream,
    each stage logging why, instead of silently reusing stale shards."""
    from contracts.schema import Manifest
    from flows.config import make_plan
    from flows.pipeline import pretraining_pipeline

    plan = make_plan(first_run["cfg"])
    docs_before = Manifest.read(plan.shard.output_dir).identity()
    ckpt_before = (Path(plan.train["phase2"].output_dir) / "checkpoints" / "step_00000003" / "COMPLETE").read_bytes()
    corpus = Path(first_run["cfg"].shard.inputs[0])
    text = corpus.read_text(encoding="utf-8")
    corpus.write_text(text.replace(" the ", " our ", 5), encoding="utf-8")  # same size, other content
    state = pretraining_pipeline(first_run["cfg"], return_state=True)
    assert state.is_completed()
    logs = "\n".join(m for i in _all_run_ids(state.state_details.flow_run_id) for m in _flow_logs(i))
    # What each stage names as changed (the vocab may or may not come out different, so the instances
    # and the evaluation may name more inputs than these).
    expected = {
        "shard": ["1 file"], "vocab": ["documents dataset"], "instances": ["documents"],
        "train:phase1": ["data_dir"], "train:phase2": ["data_dir", "init_from"], "export": ["checkpoint"],
        "eval:intrinsic": ["model_path"],
    }
    lines = [l for l in logs.splitlines() if l.startswith("stage ")]
    for stage, names in expected.items():
        said = [l for l in lines if l.startswith(f"stage {stage}: running (inputs changed: ")]
        assert said and all(n in said[0] for n in names), (stage, lines)
    assert Manifest.read(plan.shard.output_dir).identity() != docs_before
    ckpt = Path(plan.train["phase2"].output_dir) / "checkpoints" / "step_00000003" / "COMPLETE"
    assert ckpt.read_bytes() != ckpt_before
