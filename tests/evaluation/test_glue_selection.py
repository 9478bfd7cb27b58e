"""``select_on: train_split``: lr and epoch are chosen on a held-out part of train.tsv that is never trained
on, and dev is reported at that choice only; ``select_on: dev`` (the default) keeps the BERT paper's way
and its cells."""
from __future__ import annotations

import csv

import pytest
import torch

from evaluation.cells import cell_key
from evaluation.config import FinetuneOptions, GlueConfig
from evaluation.finetune import fit
from evaluation.inputs import held_out_indices
from evaluation.report import at_choice, markdown_report, summarize


def test_held_out_indices_are_a_fixed_bounded_draw():
    a = held_out_indices(1000, 0.1, 2000)
    assert a == held_out_indices(1000, 0.1, 2000) and len(a) == 100 == len(set(a)) and a == sorted(a)
    assert all(0 <= i < 1000 for i in a) and a != list(range(100))  # a draw, not the file's head
    assert len(held_out_indices(67349, 0.1, 2000)) == 2000  # SST-2: capped
    assert len(held_out_indices(5, 0.1, 2000)) == 1  # at least one
    with pytest.raises(ValueError, match="leave none to train on"):
        held_out_indices(1, 0.1, 2000)


def _run(lr, epoch, seed, dev, held):
    return {"task": "T", "eval": "T", "lr": lr, "seed": seed, "epoch": epoch, "metrics": {"acc": dev},
            "selection": {"metrics": {"acc": held}, "n": 50}}


def test_summarize_chooses_lr_and_epoch_on_the_held_out_split_not_on_dev():
    """lr 1e-4 wins on dev at every epoch but loses on the held-out split: the held-out split decides, dev is
    reported at its choice, and each lr's row is at that lr's own held-out-best epoch."""
    runs = [_run(1e-4, e, s, dev=0.9, held=0.5) for e in (1.0, 2.0) for s in (1, 2)]
    runs += [_run(5e-5, 1.0, s, dev=0.6, held=0.7) for s in (1, 2)]
    runs += [_run(5e-5, 2.0, s, dev=0.65 + 0.01 * s, held=0.8) for s in (1, 2)]
    t = summarize(runs, {"T": "acc"}, {})["T"]
    assert (t["best_lr"], t["best_epoch"]) == (5e-5, 2.0)
    assert t["mean"] == pytest.approx(0.665) and t["seeds"] == [1, 2]
    assert t["selection"] == {"metric": "acc", "n": 50, "mean": pytest.approx(0.8), "std": 0.0}
    assert t["by_lr"]["0.0001"]["mean"] == pytest.approx(0.9) and t["by_lr"]["5e-05"]["mean"] == pytest.approx(0.665)
    assert [r["seed"] for r in runs if at_choice(r, t)] == [1, 2]
    report = markdown_report({"evaluation": "glue", "tasks": {"T": t}})
    assert "| T | acc | 5e-05 (epoch 2) |" in report and "T on 50 training examples held out" in report
    # without held-out scores or epochs, dev chooses and the summary is what it always was
    plain = [{k: v for k, v in r.items() if k not in ("epoch", "selection")} for r in runs if r["epoch"] == 1.0]
    p = summarize(plain, {"T": "acc"}, {})["T"]
    assert p["best_lr"] == 1e-4 and "best_epoch" not in p and "selection" not in p


def test_fit_scores_every_epoch_without_changing_the_training():
    """at_epoch is called at each whole epoch's end and after the last step, with the model as it is then;
    the trained weights are the same with and without it (scoring in eval mode draws no random numbers
    from the training's generators), and training goes on in train mode (dropout on)."""
    seen = []

    def train(scored: bool):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Dropout(0.3), torch.nn.Linear(8, 1))
        data = {"x": torch.randn(10, 6), "attention_mask": torch.ones(10, 6, dtype=torch.long), "y": torch.randn(10)}

        def at_epoch(epoch):
            model.eval()
            with torch.no_grad():
                model(data["x"])
            seen.append(epoch)

        fit(model, data, lambda m, b: ((m(b["x"]).squeeze(-1) - b["y"]) ** 2).mean(),
            FinetuneOptions(batch_size=4, epochs=2.5), 1e-2, 3, torch.device("cpu"),
            at_epoch=at_epoch if scored else None)
        return model

    plain, scored = train(False), train(True)
    # 3 batches an epoch, 2.5 epochs rounded up to 8 steps: the ends of epochs 1 and 2, then the last step (8 / 3)
    assert seen == [1.0, 2.0, 2.6667]
    assert scored.training
    for a, b in zip(plain.parameters(), scored.parameters()):
        assert torch.equal(a, b)


def test_config_refuses_what_the_choice_cannot_keep(tmp_path):
    paths = dict(model_path=str(tmp_path), glue_dir=str(tmp_path), output_dir=str(tmp_path))
    with pytest.raises(ValueError, match="earlier epoch"):
        GlueConfig(**paths, select_on="train_split", save_models="best")
    with pytest.raises(ValueError):
        GlueConfig(**paths, select_on="train_split", select_fraction=0.5)
    # the default keeps every earlier hash and cell; the choice changes them
    dev, split = GlueConfig(**paths), GlueConfig(**paths, select_on="train_split")
    assert dev.config_hash() == GlueConfig(**paths, select_on="dev").config_hash() != split.config_hash()
    data = dev.model_dump(mode="json")
    assert "select_on" in data
    old = {k: v for k, v in data.items() if not k.startswith("select_")}
    assert cell_key(data, "RTE", 1e-4, 1, {}) == cell_key(old, "RTE", 1e-4, 1, {})
    assert cell_key(split.model_dump(mode="json"), "RTE", 1e-4, 1, {}) != cell_key(data, "RTE", 1e-4, 1, {})


@pytest.mark.shared_data
def test_grid_on_real_tasks_chooses_on_held_out_training_rows(tiny_hf, shared_data, tmp_path):
    """A real grid (SST-2 with its test file, RTE): every cell is scored at the end of each epoch on dev and
    on 16 held-out training rows; the learning-curve N examples come after them; the summary's choice is the
    held-out split's; the submitted test predictions are the chosen run's at the chosen epoch."""
    from evaluation import glue_eval

    glue_dir = shared_data / "glue"
    cfg = GlueConfig(model_path=str(tiny_hf), glue_dir=str(glue_dir), output_dir=str(tmp_path / "out"),
                     tasks=["SST-2", "RTE"], learning_rates=[1e-3, 1e-4], seeds=[1, 2], epochs=2,
                     max_train_examples=8, max_eval_examples=12, max_seq_length=32, batch_size=4, use_ray=False,
                     show_progress=False, select_on="train_split", select_max=16)
    train, held = glue_eval.train_and_held_out(cfg, glue_eval.glue.get_task("RTE"), glue_dir / "RTE" / "train.tsv")
    assert len(train) == 8 and len(held) == 16 and not {e.text_a for e in train} & {e.text_a for e in held}
    res = glue_eval.run_glue(cfg)
    assert {(r["task"], r["epoch"]) for r in res["runs"]} == {(t, e) for t in ("SST-2", "RTE") for e in (1.0, 2.0)}
    assert all(r["selection"]["n"] == 16 and r["n_train"] == 8 and r["n_eval"] == 12 for r in res["runs"])
    for task in ("SST-2", "RTE"):
        t = res["tasks"][task]
        cands = {(r["lr"], r["epoch"]): [] for r in res["runs"] if r["task"] == task}
        for r in res["runs"]:
            if r["task"] == task:
                cands[(r["lr"], r["epoch"])].append(r["selection"]["metrics"]["accuracy"])
        best = max(cands, key=lambda k: sum(cands[k]))  # the grid's order breaks ties, as summarize does
        assert (t["best_lr"], t["best_epoch"]) == best and t["selection"]["n"] == 16
        dev = [r["metrics"]["accuracy"] for r in res["runs"] if r["task"] == task and at_choice(r, t)]
        assert t["mean"] == pytest.approx(sum(dev) / len(dev))
    # the submission: the chosen (lr, epoch)'s best held-out seed, from that epoch's predictions
    t = res["tasks"]["SST-2"]
    jobs = [glue_eval.read_cell(p)["result"] for p in sorted((tmp_path / "out" / "cells").glob("SST-2-*.json"))]
    written = [row[1] for row in csv.reader(open(res["test_predictions"]["SST-2"]), delimiter="\t")][1:]
    at = [j for j in jobs if j["runs"][0]["lr"] == t["best_lr"]]
    chosen = max(at, key=lambda j: next(r for r in j["runs"] if r["epoch"] == t["best_epoch"])["selection"]["metrics"]["accuracy"])
    assert written == [str(x) for x in chosen["test_by_epoch"][f"{t['best_epoch']:g}"]["SST-2"]]
    assert "held out" in (tmp_path / "out" / "report.md").read_text()
