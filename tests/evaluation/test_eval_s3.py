"""Evaluation with its model and its outputs on an object store (a real S3-compatible server, moto's on
127.0.0.1): a run or checkpoint at ``s3://`` is read from a node-local copy each job fetches and checks
(bert_core.remote_run.cached_checkpoint), and results go to an ``s3://`` output prefix under the same
Stage contract as a local directory: the same numbers as a local evaluation, a rerun is done, a user's
object is refused and left, a damaged object is one line naming it."""
from __future__ import annotations

import json

import pytest

from bert_core.identity import identity
from bert_core.remote_run import cached_checkpoint
from contracts.storage import location
from evaluation.cli import main as eval_main
from evaluation.config import IntrinsicConfig
from evaluation.runner import evaluate, status

BODY = b"# my own report\n"


def _upload_run(run_dir, uri: str) -> None:
    loc = location(uri)
    for f in sorted(p for p in run_dir.rglob("*") if p.is_file() and not p.name.startswith(".")):
        loc.upload(f.relative_to(run_dir).as_posix(), f)


def _cfg(model: str, held_out, out: str) -> IntrinsicConfig:
    return IntrinsicConfig(model_path=model, instances_dir=str(held_out), output_dir=out, batch_size=16,
                           use_ray=False, show_progress=False)


def _numbers(results: dict) -> list[tuple]:
    return [(p["step"], p["mlm_loss"], p["mlm_acc"], p["nsp_acc"], p["mlm_count"]) for p in results["curve"]]


def test_intrinsic_of_a_run_on_s3_into_s3_equals_the_local_evaluation(pretrain_run, s3_env, scratch, tmp_path):
    run_dir, held_out = pretrain_run
    run_uri, out_uri, held_uri = s3_env + "/runs/r1", s3_env + "/eval/intrinsic", s3_env + "/held-out"
    _upload_run(run_dir, run_uri)
    _upload_run(held_out, held_uri)
    assert identity(held_uri) == identity(held_out)  # a dataset on the store is known by its manifest
    local = evaluate("intrinsic", _cfg(str(run_dir), held_out, str(tmp_path / "local")))
    cfg = _cfg(run_uri, held_uri, out_uri)
    assert not status("intrinsic", cfg).done
    remote = evaluate("intrinsic", cfg)
    assert _numbers(remote) == _numbers(local) and [p["step"] for p in remote["curve"]] == [0, 40]
    # the results name where things are: the checkpoints' URIs, the output prefix; never the scratch copy
    assert [p["checkpoint"] for p in remote["curve"]] == [f"{run_uri}/checkpoints/step_{s:08d}" for s in (0, 40)]
    assert str(scratch) not in json.dumps(remote)
    out = location(out_uri)
    assert json.loads(out.read("results.json")) == remote
    assert "| 40 |" in out.read("report.md").decode() and out.head("curve.png").size > 1000
    assert status("intrinsic", cfg).done  # a rerun is skipped, read from the store
    assert evaluate("intrinsic", cfg) == remote
    # the scratch output is gone; the node's copies of the two checkpoints stay, shared by later jobs
    assert sorted(p.name.split("-")[1] for p in scratch.iterdir()) == ["model", "model"]


def test_a_users_object_in_an_s3_output_prefix_is_refused_and_left(pretrain_run, s3_env, scratch, capsys):
    run_dir, held_out = pretrain_run
    out = location(s3_env + "/eval")
    out.write("report.md", BODY)
    argv = ["intrinsic", "--model", str(run_dir), "--instances-dir", str(held_out), "--output-dir",
            s3_env + "/eval", "--no-ray", "--no-progress"]
    assert eval_main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("bertflow: error: ") and "report.md" in err[0], err
    assert out.read("report.md") == BODY and [m.name for m in out.list()] == ["report.md"]


def test_models_on_s3_that_are_no_checkpoint_or_are_damaged_are_one_line(pretrain_run, s3_env, scratch,
                                                                         tmp_path, capsys):
    run_dir, held_out = pretrain_run
    run_uri = s3_env + "/runs/r2"
    _upload_run(run_dir, run_uri)

    def err_of(model: str, out: str) -> str:
        argv = ["intrinsic", "--model", model, "--instances-dir", str(held_out), "--output-dir", out,
                "--no-ray", "--no-progress", "--latest-only"]
        assert eval_main(argv) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("bertflow: error: "), lines
        return lines[0]

    assert err_of(s3_env + "/runs/none", str(tmp_path / "e1")).endswith(f"{s3_env}/runs/none: holds no complete checkpoint")
    ckpt = f"{run_uri}/checkpoints/step_00000040"
    loc = location(ckpt)
    loc.write("engine/model.pt", b"x" * loc.head("engine/model.pt").size)
    assert err_of(run_uri, str(tmp_path / "e2")).endswith(
        f"{ckpt}/engine/model.pt: changed since the checkpoint's COMPLETE was written (size or checksum)")
    assert not (tmp_path / "e2" / "results.json").exists()
    assert not list(scratch.glob("bertflow-model-*"))  # nothing half-fetched is kept


def test_the_node_local_copy_is_shared_checked_and_fetched_again_when_damaged(pretrain_run, s3_env, scratch):
    run_dir, _ = pretrain_run
    uri = s3_env + "/runs/r3"
    _upload_run(run_dir, uri)
    first = cached_checkpoint(uri)
    assert first.name == "step_00000040" and (first / "COMPLETE").is_file()
    stamp = (first / "engine/model.pt").stat().st_mtime_ns
    assert cached_checkpoint(uri + "/") == first and (first / "engine/model.pt").stat().st_mtime_ns == stamp
    (first / "engine/model.pt").write_bytes(b"short")  # a damaged copy: fetched again, whole
    again = cached_checkpoint(uri)
    assert again == first and (again / "engine/model.pt").read_bytes() == (
        run_dir / "checkpoints/step_00000040/engine/model.pt").read_bytes()
    assert cached_checkpoint(f"{uri}/checkpoints/step_00000000").name == "step_00000000"
    assert not list(scratch.glob("bertflow-fetch-*"))


def test_pipeline_eval_of_an_s3_model_without_a_checkpoint_is_refused_before_any_flow(s3_env, tmp_path):
    from contracts.common import UserError
    from flows.config import demo_config
    from flows.pipeline import preflight

    with pytest.raises(UserError, match=rf"^--model-path: {s3_env}/none holds no complete bertflow checkpoint and "
                                        "no Hugging Face directory \\(config.json\\)$"):
        preflight(demo_config(str(tmp_path / "demo")), "eval", s3_env + "/none")


@pytest.mark.parametrize("kind, argv, line", [
    ("glue", ["--glue-dir", "{s3}/glue", "--tasks", "RTE", "--output-dir", "{tmp}/g"], "{s3}/glue/RTE: not found"),
    ("glue", ["--glue-dir", "{tmp}", "--save-models", "best", "--output-dir", "{s3}/g"],
     "save_models: fine-tuned models are kept in a local output_dir, not {s3}/g"),
])
def test_what_is_refused_on_a_store_is_said_in_one_line(kind, argv, line, s3_env, tmp_path, capsys):
    fill = {"s3": s3_env, "tmp": str(tmp_path)}
    args = [kind, "--model", str(tmp_path), "--no-ray"] + [a.format(**fill) for a in argv]
    assert eval_main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("bertflow: error: " + line.format(**fill)), err
    assert not list(location(s3_env).list())  # nothing written on the store


def test_the_documented_object_store_command_runs_as_written(pretrain_run, s3_server, scratch, monkeypatch, capsys):
    """docs/evaluation.md's command, verbatim, against the test server (bucket named as in the docs)."""
    import shlex
    from pathlib import Path

    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    doc = (Path(__file__).resolve().parents[2] / "docs" / "evaluation.md").read_text()
    cmd = next(line.strip() for line in doc.splitlines() if "--model s3://bertflow-docs/" in line)
    argv = shlex.split(cmd)
    assert argv[:2] == ["bertflow", "eval"]
    bucket = "bertflow-docs"
    if bucket not in [b["Name"] for b in s3_server.client().list_buckets()["Buckets"]]:
        s3_server.client().create_bucket(Bucket=bucket)
    run_dir, held_out = pretrain_run
    _upload_run(run_dir, f"s3://{bucket}/runs/mini")
    _upload_run(held_out, f"s3://{bucket}/heldout")
    assert eval_main(argv[2:]) == 0
    assert "| 40 |" in capsys.readouterr().out
    assert json.loads(location(f"s3://{bucket}/eval/intrinsic").read("results.json"))["curve"][-1]["step"] == 40


def _head(src, dest, lines: int) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(src, encoding="utf-8") as fh:
        dest.write_text("".join(next(fh) for _ in range(lines)), encoding="utf-8")


def _upload_tree(local_dir, uri: str) -> None:
    loc = location(uri)
    for f in sorted(p for p in local_dir.rglob("*") if p.is_file()):
        loc.upload(f.relative_to(local_dir).as_posix(), f)


@pytest.mark.shared_data
def test_glue_squad_and_ner_with_every_input_on_s3_equal_the_local_runs(tiny_hf, shared_data, s3_env, scratch,
                                                                        tmp_path):
    """Task data (a GLUE directory, a SQuAD file, a CoNLL directory), the vocab and a Hugging Face model
    directory all given as URIs: each node reads its copy (contracts.views); the numbers equal the same
    evaluation of the local files, the results name the URIs, and a rerun is done."""
    from evaluation.config import GlueConfig, NerConfig, SquadConfig

    data = tmp_path / "data"
    for name, n in (("train.tsv", 41), ("dev.tsv", 33), ("test.tsv", 21)):
        _head(shared_data / "glue/SST-2" / name, data / "glue/SST-2" / name, n)
    for name, n in (("train.txt", 2010), ("valid.txt", 490)):
        _head(shared_data / "conll2003" / name, data / "conll" / name, n)
    squad = json.loads((shared_data / "squad/v1.1/dev-v1.1.json").read_text(encoding="utf-8"))
    squad["data"] = [dict(a, paragraphs=a["paragraphs"][:3]) for a in squad["data"][:2]]
    (data / "squad.json").write_text(json.dumps(squad), encoding="utf-8")
    _upload_tree(data, f"{s3_env}/data")
    _upload_tree(tiny_hf, f"{s3_env}/hf")
    assert identity(f"{s3_env}/hf") == identity(tiny_hf)  # a model directory by its content, wherever it is
    quick = dict(seeds=[1], batch_size=16, eval_batch_size=32, epochs=1, threads_per_task=1, show_progress=False,
                 use_ray=False, learning_rates=[1e-3], max_seq_length=48)
    kinds = {
        "glue": (GlueConfig, dict(tasks=["SST-2"], max_train_examples=40, max_eval_examples=32), "glue_dir", "glue"),
        "squad": (SquadConfig, dict(train_articles=1, max_train_questions=16, max_eval_questions=8, doc_stride=24,
                                    max_query_length=16), "dev_file", "squad.json"),
        "ner": (NerConfig, dict(max_train_sentences=120, max_eval_sentences=20, feature_layers=[-1], lstm_hidden=8,
                                lstm_layers=1, feature_epochs=1, feature_learning_rates=[3e-3]), "conll_dir", "conll"),
    }
    for kind, (model, opts, field, rel) in kinds.items():
        local = evaluate(kind, model(model_path=str(tiny_hf), vocab_file=str(tiny_hf / "vocab.txt"),
                                     output_dir=str(tmp_path / f"local-{kind}"), **{field: str(data / rel)},
                                     **quick, **opts))
        cfg = model(model_path=f"{s3_env}/hf", vocab_file=f"{s3_env}/hf/vocab.txt", output_dir=f"{s3_env}/eval/{kind}",
                    **{field: f"{s3_env}/data/{rel}"}, **quick, **opts)
        remote = evaluate(kind, cfg)
        assert {t: v["mean"] for t, v in remote["tasks"].items()} == {t: v["mean"] for t, v in local["tasks"].items()}
        assert [r["metrics"] for r in remote["runs"]] == [r["metrics"] for r in local["runs"]], kind
        assert str(scratch) not in json.dumps(remote) and f"{s3_env}/hf" in json.dumps(remote), kind
        assert json.loads(location(f"{s3_env}/eval/{kind}").read("results.json")) == remote
        assert status(kind, cfg).done, kind
    # nothing of the copies is half-made; at most the copies themselves stay on scratch
    assert not list(scratch.glob("bertflow-fetch-*"))


def test_the_recipes_comparison_on_s3_equals_the_local_one(tiny_hf, s3_env, scratch, tmp_path):
    """The recipe's comparison stage (every row's GLUE grid, then comparison.{json,md,png}) with its output
    and a reference row's cells on an object store: the local comparison's numbers, the report on the
    store, a rerun done, nothing left on scratch but the model copies."""
    from flows.stages import CompareStage

    from tiny_tasks import write_tiny_sst2

    glue = {"glue_dir": str(write_tiny_sst2(tmp_path / "glue")), "tasks": ["SST-2"], "learning_rates": [1e-3], "seeds": [1],
            "epochs": 1, "batch_size": 16, "max_seq_length": 16, "use_ray": False, "show_progress": False,
            "write_test_predictions": False}

    def compare(root: str) -> tuple[CompareStage, dict]:
        rows = [{"name": "pretrained", "model_path": str(tiny_hf), "random_init": False},
                {"name": "random init", "model_path": str(tiny_hf), "random_init": True,
                 "glue_dir": f"{root}/compare/random-init-x"}]
        stage = CompareStage(rows, glue, f"{root}/compare/run-x")
        assert stage.status().state == "absent"
        return stage, stage.run(stage.status(), lambda line: None)

    _, local = compare(str(tmp_path / "local"))
    stage, remote = compare(s3_env)
    assert [r["tasks"] for r in remote["rows"]] == [r["tasks"] for r in local["rows"]]
    assert remote["markdown"] == f"{s3_env}/compare/run-x/comparison.md"
    out = location(f"{s3_env}/compare/run-x")
    assert {"comparison.json", "comparison.md", "comparison.png"} <= {m.name for m in out.list()}
    assert json.loads(out.read("comparison.json"))["rows"][1]["glue_dir"] == f"{s3_env}/compare/random-init-x"
    assert location(f"{s3_env}/compare/random-init-x").exists("results.json")
    assert stage.status().done and stage.result()["rows"] == remote["rows"]
    assert not list(scratch.glob("bertflow-stage-*"))
