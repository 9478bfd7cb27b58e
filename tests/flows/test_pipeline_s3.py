"""The whole demo pipeline with ``--output-root s3://...`` on a real S3-compatible server (moto's on
127.0.0.1), under Prefect's test harness: every stage's output is an object-store prefix (documents,
vocab, instances, the training run, the Hugging Face export, the held-out evaluation, the reports), the
command is README's as written, the numbers equal a run of the same config on local disk, a rerun skips
every stage, and nothing lands on local disk but scratch that is gone afterwards. Then GLUE fine-tunes
the export the store holds (task data local), its results on the store."""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from contracts.schema import MANIFEST_NAME, Manifest
from contracts.storage import location
from hang import HANG_S  # noqa: E402  (the suite's one hang guard)

pytestmark = [pytest.mark.prefect]

REPO = Path(__file__).resolve().parents[2]
BUCKET = "bertflow-demo"


def _readme_command() -> list[str]:
    line = next(x.strip() for x in (REPO / "README.md").read_text().splitlines() if "flows.demo --output-root s3://" in x)
    return shlex.split(line)


def test_the_demo_on_s3_equals_the_demo_on_disk_and_reruns_as_done(harness, s3_server, tmp_path, monkeypatch, capsys):
    from flows import demo
    from flows.config import demo_config, make_plan
    from flows.stages import DataStage, EvalStage, ExportStage, TrainStage

    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setenv("BERTFLOW_SCRATCH", str(scratch))
    monkeypatch.chdir(tmp_path)
    if BUCKET not in [b["Name"] for b in s3_server.client().list_buckets()["Buckets"]]:
        s3_server.client().create_bucket(Bucket=BUCKET)
    argv = _readme_command()
    assert argv[:3] == [".venv/bin/python", "-m", "flows.demo"], argv
    args = demo._parser().parse_args(argv[3:])
    root = args.output_root
    assert root.startswith(f"s3://{BUCKET}/")

    import torch
    from fresh import FRESH_TORCH_THREADS

    assert torch.get_num_threads() == FRESH_TORCH_THREADS  # as in the local run's fresh process below
    assert demo.main(argv[3:]) == 0
    out = capsys.readouterr().out
    plan = make_plan(demo_config(root, max_steps=args.max_steps))
    for d in [plan.shard.output_dir, plan.vocab.output_dir, *(i.output_dir for i in plan.instances.values()),
              plan.heldout.output_dir]:
        assert location(d).exists(MANIFEST_NAME), d
    run = plan.train["phase1"].output_dir
    assert any(m.name.endswith("/COMPLETE") for m in location(run).list("checkpoints/"))
    assert {"config.json", "model.safetensors", "vocab.txt"} <= {m.name for m in location(str(plan.export_dir)).list()}
    remote = json.loads(location(plan.evals["intrinsic"].output_dir).read("results.json"))
    reports = {m.name for m in location(str(plan.report_dir)).list()}
    assert {"loss_curve.png", "summary.md", "summary.json"} <= reports
    assert f"{plan.report_dir}/summary.md" in out
    # nothing on local disk: no stray directory named after the URI; on scratch only the node's copies
    # of what it read (the checkpoints the evaluation scored, the vocab training checked), no staging left
    assert sorted(p.name for p in tmp_path.iterdir()) == ["scratch"]
    # (the vocab twice: kept by the instances workers, fetched by training; both named by content)
    assert {p.name.rsplit("-", 1)[0] for p in scratch.iterdir()} == {"bertflow-model", "bertflow-vocab", "bertflow-kept"}

    # the same config on local disk, in a process of its own: the same datasets, weights and held-out
    # numbers (this process ran other tests before: tests/conftest.py gives torch a fresh process's thread
    # count after each test, and an in-process evaluation gives it back itself, evaluation.runner
    # ._threads_kept; with another count the weights here would differ by float sums)
    local_cfg = demo_config(str(tmp_path / "local"), max_steps=args.max_steps)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    proc = subprocess.run([sys.executable, "-m", "flows.demo", "--output-root", str(tmp_path / "local"),
                           "--max-steps", str(args.max_steps)], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=HANG_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    local_plan = make_plan(local_cfg)
    local = json.loads((Path(local_plan.evals["intrinsic"].output_dir) / "results.json").read_text())
    pairs = [(plan.shard, local_plan.shard), (plan.vocab, local_plan.vocab), (plan.heldout, local_plan.heldout),
             *zip(plan.instances.values(), local_plan.instances.values())]
    for a, b in pairs:  # every dataset: the same files, byte for byte (by the manifests' SHA-256)
        assert Manifest.read(a.output_dir).identity() == Manifest.read(b.output_dir).identity(), b.output_dir
    assert location(str(plan.export_dir)).read("model.safetensors") == \
        (Path(local_plan.export_dir) / "model.safetensors").read_bytes()
    strip = ("checkpoint",)
    assert [{k: v for k, v in p.items() if k not in strip} for p in remote["curve"]] == \
        [{k: v for k, v in p.items() if k not in strip} for p in local["curve"]]

    # a rerun: every stage reports done from the store
    stages = [DataStage("shard", plan.shard), DataStage("vocab", plan.vocab),
              *(DataStage("instances", i) for i in [*plan.instances.values(), plan.heldout]),
              TrainStage("phase1", plan.train["phase1"]), ExportStage(run, str(plan.export_dir)),
              EvalStage("intrinsic", plan.evals["intrinsic"])]
    assert [s.status().state for s in stages] == ["done"] * len(stages)
    assert demo.main(argv[3:]) == 0

    # GLUE on the export the store holds (a Hugging Face directory read from this node's copy), the task
    # data local, the results on the store; the intrinsic evaluation is done already and not redone
    from flows.config import PipelineConfig
    from flows.pipeline import evaluate

    from tiny_tasks import write_tiny_sst2

    write_tiny_sst2(tmp_path / "glue", noun="module")
    data = demo_config(root, max_steps=args.max_steps).model_dump(mode="json")
    data["evaluation"]["glue"] = {"tasks": ["SST-2"], "learning_rates": [1e-3], "seeds": [1], "epochs": 1,
                                  "batch_size": 16, "max_seq_length": 16, "use_ray": False, "show_progress": False,
                                  "write_test_predictions": False}
    glue_cfg = PipelineConfig.model_validate({**data, "evaluation": {**data["evaluation"], "glue": {
        **data["evaluation"]["glue"], "glue_dir": str(tmp_path / "glue")}}})
    glue_plan = make_plan(glue_cfg)
    assert glue_plan.evals["intrinsic"].output_dir == plan.evals["intrinsic"].output_dir
    results = evaluate(glue_cfg)
    assert results["glue"]["model_path"] == str(plan.export_dir) and results["glue"]["tasks"]["SST-2"]["seeds"] == [1]
    assert json.loads(location(glue_plan.evals["glue"].output_dir).read("results.json")) == results["glue"]
    assert str(scratch) not in json.dumps(results["glue"])
