"""Kept fine-tuned GLUE models (``save_models``) and predictions from them (``predict_only``): the kept
model is a Hugging Face directory ``transformers`` loads; predicting with it on a held-out (dev+test, no
train) task directory gives the predictions the fine-tuning run wrote; bad input is one line, exit 2;
older configs keep their hashes; the commands of docs/evaluation.md and README.md run as written.

One small grid (tiny model, 2 steps, 2 lrs x 2 seeds on SST-2 and STS-B) is fine-tuned once for the module.
"""
from __future__ import annotations

import json
import logging
import re
import shlex
import shutil
from pathlib import Path

import pytest
import torch

from evaluation.cli import main as eval_main
from evaluation.config import GlueConfig

pytestmark = [pytest.mark.shared_data, pytest.mark.slow]
logging.getLogger("bert_core.hf").setLevel(logging.ERROR)

REPO = Path(__file__).resolve().parents[2]
GRID = dict(learning_rates=[1e-3, 3e-4], seeds=[1, 2], max_train_examples=16, max_eval_examples=24,
            max_seq_length=32, batch_size=8, eval_batch_size=16, max_steps=2, use_ray=False, show_progress=False)
# Scores are written with 3 decimals; the raw floats of the two runs agree to this (same weights, same
# batches, same threads: in practice bit-identical on one machine).
SCORE_TOL = 1e-5


def _held_out(shared: Path, root: Path, task: str, files=("dev.tsv", "test.tsv")) -> Path:
    """A QNLI-style task directory: the shared task's dev and test files, no train.tsv."""
    d = root / task
    d.mkdir(parents=True, exist_ok=True)
    for f in files:
        shutil.copy(shared / "glue" / task / f, d / f)
    return root


@pytest.fixture(scope="module")
def kept(tiny_hf, shared_data, tmp_path_factory):
    from evaluation.glue_eval import run_glue

    out = tmp_path_factory.mktemp("kept")
    cfg = GlueConfig(model_path=str(tiny_hf), glue_dir=str(shared_data / "glue"), output_dir=str(out),
                     tasks=["SST-2", "STS-B"], save_models="best", **GRID)
    return cfg, run_glue(cfg)


def test_kept_model_is_the_submitted_run_and_predicts_the_same(kept, shared_data, tmp_path):
    from evaluation.glue_eval import run_glue
    from evaluation.glue_predict import predict_job

    cfg, res = kept
    out = Path(cfg.output_dir)
    assert sorted(p.name for p in (out / "models").iterdir()) == ["SST-2", "STS-B"]
    assert not list((out / "cells").glob("*.model")) and not list(out.rglob(".tmp-*"))  # the others deleted
    held = _held_out(shared_data, tmp_path / "glue", "SST-2")
    _held_out(shared_data, held, "STS-B")
    for task, metric in (("SST-2", "accuracy"), ("STS-B", "spearman")):
        kept_dir = out / "models" / task
        record = json.loads((kept_dir / "bertflow_finetuned.json").read_text())
        # "best" = the dev-chosen lr and, at that lr, the seed with the best dev score (the submitted run)
        at_lr = [r for r in res["runs"] if r["task"] == task and r["lr"] == res["tasks"][task]["best_lr"]]
        best = max(at_lr, key=lambda r: r["metrics"][metric])
        assert (record["lr"], record["seed"]) == (best["lr"], best["seed"]) == (
            res["saved_models"][task]["lr"], res["saved_models"][task]["seed"])
        assert record["dev"][task]["metrics"] == best["metrics"] and record["max_seq_length"] == 32
        assert record["base_model"]["identity"] and record["task"] == task

        # Predict on a dev+test-only directory; max_seq_length left at 128: the record's 32 must be used.
        pcfg = GlueConfig(model_path=str(kept_dir), glue_dir=str(held), output_dir=str(tmp_path / task),
                          tasks=[task.lower()], predict_only=True, max_eval_examples=24, eval_batch_size=16,
                          use_ray=False, show_progress=False)
        pres = run_glue(pcfg)
        assert pres["tasks"][task]["metrics"][metric]["mean"] == pytest.approx(best["metrics"][metric], abs=1e-9)
        ours = (tmp_path / task / "glue_test" / f"{task}.tsv").read_text().splitlines()
        theirs = (out / "glue_test" / f"{task}.tsv").read_text().splitlines()
        assert len(ours) == len(theirs) == 25 and ours[0] == "index\tprediction"
        if task == "SST-2":
            assert ours == theirs  # same examples, same labels
        else:
            assert [r.split("\t")[0] for r in ours] == [r.split("\t")[0] for r in theirs]
            raw_kept = predict_job(pcfg.model_dump(mode="json"))["test_predictions"][task]
            cell = json.loads((out / "cells" / f"{record['cell']}.json").read_text())
            raw_run = cell["result"]["test_predictions"][task]
            assert raw_kept == pytest.approx(raw_run, abs=SCORE_TOL)


def test_kept_model_loads_in_transformers(kept, shared_data):
    transformers = pytest.importorskip("transformers")
    from evaluation import glue
    from evaluation.finetuned import load_finetuned
    from evaluation.glue_predict import encode
    from evaluation.text import bert_tokenizer

    cfg, _ = kept
    for task, labels in (("SST-2", ["0", "1"]), ("STS-B", None)):
        path = Path(cfg.output_dir) / "models" / task
        hf = transformers.BertForSequenceClassification.from_pretrained(str(path)).eval()
        assert hf.config.num_labels == (len(labels) if labels else 1)
        assert hf.config.problem_type == ("single_label_classification" if labels else "regression")
        if labels:
            assert hf.config.id2label == dict(enumerate(labels)) and hf.config.label2id == {"0": 0, "1": 1}
        ours, _, vocab, record = load_finetuned(path)
        spec = glue.get_task(task)
        examples = glue.read_examples(spec, shared_data / "glue" / task / "dev.tsv", 6)
        data = encode(bert_tokenizer(str(vocab), True), examples, record["max_seq_length"], False)
        with torch.no_grad():
            want_BC = ours.eval()(data["input_ids"], data["token_type_ids"], data["attention_mask"])
            got_BC = hf(input_ids=data["input_ids"], token_type_ids=data["token_type_ids"],
                        attention_mask=data["attention_mask"]).logits
        torch.testing.assert_close(got_BC, want_BC, atol=1e-5, rtol=1e-4)


def _one_line(capsys, argv, message, out_dir):
    assert eval_main(argv) == 2, argv
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("bertflow: error:") and message in err[0], err
    assert "Traceback" not in err[0] and not (out_dir / "results.json").exists()


def test_predict_refusals_are_one_line(kept, tiny_hf, shared_data, tmp_path, capsys):
    cfg, _ = kept
    sst2 = Path(cfg.output_dir) / "models" / "SST-2"
    held = _held_out(shared_data, tmp_path / "held", "SST-2")
    dev_only = _held_out(shared_data, tmp_path / "dev_only", "SST-2", files=("dev.tsv",))
    unfinished = tmp_path / "unfinished"  # what a save killed before its record would leave
    shutil.copytree(sst2, unfinished)
    (unfinished / "bertflow_finetuned.json").unlink()
    out = tmp_path / "out"
    base = ["glue", "--output-dir", str(out), "--no-ray", "--no-progress"]
    cases = [
        (["--predict-only", "--model", str(sst2), "--glue-dir", str(held), "--tasks", "RTE"],
         "fine-tuned on GLUE SST-2, but tasks is RTE (predict with --tasks SST-2)"),
        (["--predict-only", "--model", str(tiny_hf), "--glue-dir", str(held)], "not a fine-tuned GLUE model"),
        (["--predict-only", "--model", str(unfinished), "--glue-dir", str(held)], "not a fine-tuned GLUE model"),
        (["--predict-only", "--model", str(tmp_path / "held"), "--glue-dir", str(held)], "not a model"),
        (["--predict-only", "--model", str(sst2), "--glue-dir", str(dev_only)], "SST-2/test.tsv: task file not found"),
        (["--predict-only", "--random-init", "--model", str(sst2), "--glue-dir", str(held)],
         "cannot be combined with random_init"),
        # the training mode still refuses a dev+test-only directory, and now says what to use instead
        (["--model", str(tiny_hf), "--glue-dir", str(held)], "use --predict-only with --model a model kept by"),
    ]
    for extra, message in cases:
        _one_line(capsys, base + extra, message, out)


def test_killed_save_never_looks_finished(tiny_hf, tmp_path, monkeypatch):
    from bert_core import hf
    from bert_core.config import preset
    from bert_core.heads import BertForSequenceClassification
    from contracts.common import UserError
    from evaluation import finetuned

    config = preset("tiny", vocab_size=30522)
    model = BertForSequenceClassification(config, num_labels=2)
    record = {"task": "SST-2", "labels": ["0", "1"], "lr": 1e-3, "seed": 1, "max_seq_length": 32,
              "lowercase": True, "base_model": {}, "dev": {}}
    real = hf._write_json  # save_finetuned writes through bert_core.hf.save_hf

    def dies_at_the_record(path, obj):
        if path.name == finetuned.RECORD:
            raise KeyboardInterrupt  # killed while writing the marker
        real(path, obj)

    monkeypatch.setattr(hf, "_write_json", dies_at_the_record)
    with pytest.raises(KeyboardInterrupt):
        finetuned.save_finetuned(model, config, tiny_hf / "vocab.txt", tmp_path / "m", record, True)
    assert list(tmp_path.iterdir()) == []  # neither the model nor a leftover
    monkeypatch.setattr(hf, "_write_json", real)
    finetuned.save_finetuned(model, config, tiny_hf / "vocab.txt", tmp_path / "m", record, True)
    assert finetuned.read_record(tmp_path / "m")["seed"] == 1
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("a user's file")
    with pytest.raises(UserError, match="is not a fine-tuned model this evaluation kept"):
        finetuned.save_finetuned(model, config, tiny_hf / "vocab.txt", tmp_path / "mine", record, True)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "a user's file"


def test_older_configs_keep_their_config_hash_and_cells_key_by_content():
    """The new options left at their defaults change no config hash: stage records and pipeline directory
    names of older configs stay valid (golden value: computed by the code before the options). A cell's
    name is the config without paths, run settings and the grid's shape, plus its inputs' content."""
    from contracts.common import stable_hash
    from evaluation.cells import _GRID_SHAPE, _NOT_RESULT, cell_key

    old = GlueConfig(model_path="m", glue_dir="g", output_dir="o", tasks=["RTE"], seeds=[1], learning_rates=[2e-5])
    assert old.config_hash() == "199954ca6105134e"
    dump = old.model_dump(mode="json")
    inputs = {"model": "a", "vocab": "b", "data": "c"}
    identity = {k: v for k, v in dump.items() if k not in (*_NOT_RESULT, *_GRID_SHAPE, *GlueConfig.input_fields)
                and k not in ("save_models", "predict_only", "precision", "task_epochs", "select_on", "select_fraction",
                              "select_max")}
    assert cell_key(dump, "RTE", 2e-5, 1, inputs) == "RTE-" + stable_hash(
        {"config": identity, "inputs": inputs, "task": "RTE", "lr": 2e-5, "seed": 1})
    moved = old.model_copy(update={"model_path": "/elsewhere/m", "glue_dir": "../g", "output_dir": "o2"})
    assert cell_key(moved.model_dump(mode="json"), "RTE", 2e-5, 1, inputs) == cell_key(dump, "RTE", 2e-5, 1, inputs)
    assert cell_key(dump, "RTE", 2e-5, 1, {**inputs, "model": "z"}) != cell_key(dump, "RTE", 2e-5, 1, inputs)
    kept = old.model_copy(update={"save_models": "best"})
    assert cell_key(kept.model_dump(mode="json"), "RTE", 2e-5, 1, inputs) != cell_key(dump, "RTE", 2e-5, 1, inputs)
    assert kept.config_hash() != old.config_hash()


def _commands(text: str, marker: str) -> list[str]:
    """The ``bertflow eval glue`` commands of the first ```bash block after ``marker``."""
    start = text.index(marker)
    block = text[text.index("```bash", start) + 7:text.index("```", text.index("```bash", start) + 7)]
    lines = [c.strip() for c in block.replace("\\\n", " ").splitlines()]
    return [c for c in lines if c.startswith("bertflow eval glue")]


# Appended to a fine-tuning command (later flags win; the lists are unset there): a budget. And to every
# command --no-ray: starting Ray takes minutes on a loaded machine (a grid through Ray is tested in
# test_glue_on_ray_matches_in_process; a job in another directory below).
BUDGET = "--learning-rates 1e-3 --seeds 1 --max-steps 1 --max-train-examples 8 --max-eval-examples 8 --max-seq-length 32"


@pytest.mark.parametrize("doc, marker", [("docs/evaluation.md", "## Keeping fine-tuned models"),
                                         ("README.md", "A typical run by hand")])
def test_documented_predict_commands_run(doc, marker, tiny_hf, shared_data, tmp_path, monkeypatch, capsys):
    cmds = _commands((REPO / doc).read_text(), marker)
    assert any("--save-models best" in c for c in cmds) and any("--predict-only" in c for c in cmds), cmds
    # work/ with ../shared/data/glue (cut short), the commands' model (a tiny one) and a held-out heldout/glue/SST-2
    work = tmp_path / "work"
    for task in ("SST-2", "MRPC", "STS-B"):
        for f in ("train.tsv", "dev.tsv", "test.tsv"):
            lines = (shared_data / "glue" / task / f).read_text(encoding="utf-8-sig").splitlines(keepends=True)
            dst = tmp_path / "shared" / "data" / "glue" / task / f
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_text("".join(lines[:17]), encoding="utf-8")
    _held_out(tmp_path / "shared" / "data", work / "heldout" / "glue", "SST-2")
    first = shlex.split(next(c for c in cmds if "--predict-only" not in c))
    shutil.copytree(tiny_hf, work / first[first.index("--model") + 1])  # hf/mini, runs/hf-mini
    monkeypatch.chdir(work)
    for cmd in cmds:
        argv = shlex.split(cmd)[2:]
        argv += ["--no-ray"] + ([] if "--predict-only" in argv else BUDGET.split())
        assert eval_main(argv) == 0, (cmd, capsys.readouterr().err[-2000:])
        err = capsys.readouterr().err
        out_dir = work / argv[argv.index("--output-dir") + 1]
        for name in re.findall(r"test predictions (\S+): ", err):
            assert (out_dir / "glue_test" / f"{name}.tsv").is_file()
        assert json.loads((out_dir / "results.json").read_text())["tasks"]
    # A job started in another directory (a Ray worker of a cluster started elsewhere) gets absolute paths.
    from evaluation.cli import build_parser, config_from_args
    from evaluation.glue_predict import job_data, predict_job

    cfg = config_from_args(build_parser().parse_args(argv))
    assert cfg.predict_only and not Path(cfg.model_path).is_absolute()
    data = job_data(cfg)
    monkeypatch.chdir(tmp_path)
    assert predict_job(data)["test_predictions"]
