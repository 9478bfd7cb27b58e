"""The comparison report's tables from a comparison dict: the gain of the pretrained row over its random
init, and the per-learning-rate table that shows how the choice of lr moved each row."""
from __future__ import annotations

from evaluation.compare import comparison_markdown


def _row(name, random_init, sst2, rte, by_lr):
    tasks = {"SST-2": {"metric": "accuracy", "mean": sst2, "std": 0.01, "best_lr": 3e-4, "seeds": [1, 2],
                       "by_lr": {"0.0003": {"mean": sst2, "std": 0.0}, "0.0001": {"mean": by_lr, "std": 0.0}}},
             "RTE": {"metric": "accuracy", "mean": rte, "std": 0.0, "best_lr": 3e-4, "seeds": [1, 2],
                     "by_lr": {"0.0003": {"mean": rte, "std": 0.0}}}}
    return {"name": name, "model_path": "/m" if name != "ref" else "/ref", "random_init": random_init,
            "seeds": [1, 2], "tasks": tasks, "glue_average": {"mean": (sst2 + rte) / 2, "std": 0.0},
            "held_out": None, "cross_held_out": None, "curve": []}


def test_gain_line_and_per_lr_table():
    c = {"rows": [_row("pre", False, 0.81, 0.55, 0.79), _row("rnd", True, 0.80, 0.50, 0.803),
                  _row("ref", False, 0.90, 0.60, 0.88)],
         "sentence_task": "nsp",
         "budget": {"tasks": ["SST-2", "RTE"], "learning_rates": [3e-4, 1e-4], "seeds": [1, 2], "batch_size": 32,
                    "epochs": 3.0, "task_epochs": {"SST-2": 1.0}, "max_steps": None, "max_train_examples": None,
                    "max_eval_examples": None, "max_seq_length": 128, "precision": "bf16"}}
    md = comparison_markdown(c)
    assert "3.0 epochs (SST-2: 1.0)" in md and "bf16 autocast" in md
    assert "| pre − rnd | +1.0 | +5.0 | +3.0 | | |" in md  # one gain line: the reference row has no random init
    assert md.count(" − ") == 1
    assert "| pre | 0.0001 | 79.0 | – |" in md and "| rnd | 0.0003 | 80.0 | 50.0 |" in md
    assert "| ref | 0.0001 | 88.0 | – |" in md


def test_welch_table_per_random_init_row():
    """Each random-init row against its pretrained row: difference, Welch 95% interval over the seeds, verdict;
    the same figures in the comparison's ``differences`` (what comparison.json keeps)."""
    from evaluation.compare import differences

    pre, rnd = _row("pre", False, 0.81, 0.55, 0.79), _row("rnd", True, 0.80, 0.50, 0.803)
    pre["tasks"]["RTE"]["std"] = 0.005
    c = {"rows": [pre, rnd, _row("ref", False, 0.90, 0.60, 0.88)], "sentence_task": "nsp",
         "budget": {"tasks": ["SST-2", "RTE"], "learning_rates": [3e-4], "seeds": [1, 2], "batch_size": 32,
                    "epochs": 3.0, "max_steps": None, "max_train_examples": None, "max_eval_examples": None,
                    "max_seq_length": 128}}
    md = comparison_markdown(c)
    assert "pre minus rnd, dev metric x100" in md and "ref minus" not in md
    # SST-2: 81 ± 1 vs 80 ± 1, two seeds a side: df 2, t 4.303, half-width 4.3 points
    assert "| SST-2 | +1.0 | [-3.3, +5.3] | 2 vs 2 | not shown (interval holds 0) |" in md
    # RTE: 55 ± 0.5 vs 50 ± 0 (one side steady): df 1, t 12.706, half-width 4.5 points
    assert "| RTE | +5.0 | [+0.5, +9.5] | 2 vs 2 | transfer shown |" in md
    assert "| GLUE avg | +3.0 | n/a | 2 vs 2 | n/a (no spread over seeds) |" in md
    d = differences(c)["pre minus rnd"]
    assert set(d) == {"SST-2", "RTE", "GLUE avg"} and d["RTE"]["interval"]["low"] > 0 > d["SST-2"]["interval"]["low"]


def test_one_learning_rate_has_no_per_lr_table():
    c = {"rows": [_row("pre", False, 0.81, 0.55, 0.79)], "sentence_task": "nsp",
         "budget": {"tasks": ["SST-2"], "learning_rates": [3e-4], "seeds": [1], "batch_size": 32, "epochs": 1.0,
                    "max_steps": None, "max_train_examples": None, "max_eval_examples": None, "max_seq_length": 128}}
    md = comparison_markdown(c)
    assert "at every learning rate" not in md and " − " not in md and "autocast" not in md


def test_no_sentence_task_has_no_sentence_columns():
    """sentence_task none trains no sentence head: no "held-out NONE acc" column of n/a, no 0.0000 curve column."""
    held = {"mlm_acc": 0.148, "mlm_count": 100, "mlm_perplexity": 534.0, "nsp_acc": 0.0, "nsp_count": 0, "step": 40}
    pre, rnd = _row("pre", False, 0.81, 0.55, 0.79), _row("rnd", True, 0.80, 0.50, 0.803)
    pre["held_out"], rnd["held_out"] = held, {**held, "mlm_acc": 0.0}
    pre["curve"] = [{**held, "phase": "seq128", "step": 20}, {**held, "phase": "seq512"}]
    budget = {"tasks": ["SST-2", "RTE"], "learning_rates": [3e-4], "seeds": [1, 2], "batch_size": 32, "epochs": 3.0,
              "max_steps": None, "max_train_examples": None, "max_eval_examples": None, "max_seq_length": 128}
    md = comparison_markdown({"rows": [pre, rnd], "sentence_task": "none", "budget": budget})
    assert "NONE" not in md
    assert "| model | SST-2 | RTE | GLUE avg | held-out MLM acc |\n|---|---|---|---|---|\n" in md
    assert "| pre | 81.0 ± 1.0 | 55.0 ± 0.0 | 68.0 ± 0.0 | 14.8 |\n" in md
    assert "| pre − rnd | +1.0 | +5.0 | +3.0 | |\n" in md
    assert "| phase | step | MLM acc | MLM perplexity |\n|---|---|---|---|\n| seq128 | 20 | 0.1480 | 534.00 |\n" in md
    nsp = comparison_markdown({"rows": [pre, rnd], "sentence_task": "nsp", "budget": budget})
    assert "| pre | 81.0 ± 1.0 | 55.0 ± 0.0 | 68.0 ± 0.0 | 14.8 | n/a |\n" in nsp and "| NSP acc |" in nsp


ROWS = [{"name": "pre", "model_path": "/m", "random_init": False},
        {"name": "ref", "model_path": "/ref", "random_init": False, "glue_dir": "/elsewhere/ref"}]


def test_user_file_in_a_comparison_dir_is_refused_before_any_fine_tuning(tmp_path):
    """The comparison is a stage (contracts.stage): a user's comparison.md there is refused in one line
    and kept byte for byte; nothing is fine-tuned, nothing written."""
    import pytest

    from contracts.common import UserError
    from evaluation.compare import run_comparison

    out = tmp_path / "compare" / "x"
    out.mkdir(parents=True)
    (out / "comparison.md").write_bytes(b"# my notes\n")
    with pytest.raises(UserError) as err:
        run_comparison(ROWS, {"tasks": ["SST-2"]}, out, {}, "nsp", {}, "h", {})
    assert "\n" not in str(err.value) and "comparison.md" in str(err.value)
    assert (out / "comparison.md").read_bytes() == b"# my notes\n"
    assert sorted(p.name for p in out.iterdir()) == ["comparison.md"]


def test_a_comparison_made_before_records_is_adopted_only_by_its_signature(tmp_path):
    import json

    from evaluation.compare import _made_before_records, compare_stage

    out = tmp_path / "x"
    (out / "glue-pre").mkdir(parents=True)
    (out / "comparison.json").write_text(json.dumps({"rows": [], "budget": {}}))
    assert _made_before_records(compare_stage(out, ROWS))
    (out / "notes.txt").write_text("mine")  # a user's file beside it: not adopted
    assert not _made_before_records(compare_stage(out, ROWS))
    (out / "notes.txt").unlink()
    (out / "comparison.json").write_text("my own json, not a comparison")
    assert not _made_before_records(compare_stage(out, ROWS))


def test_zero_shot_stsb_table():
    pre, rnd = _row("pre", False, 0.81, 0.55, 0.79), _row("rnd", True, 0.80, 0.50, 0.803)
    pre["zero_shot_stsb"] = {"mean": 0.512, "std": 0.0, "n": 1, "values": [0.512]}
    rnd["zero_shot_stsb"] = {"mean": 0.41, "std": 0.01, "n": 2, "values": [0.403, 0.417]}
    budget = {"tasks": ["SST-2", "RTE"], "learning_rates": [3e-4], "seeds": [1, 2], "batch_size": 32, "epochs": 3.0,
              "max_steps": None, "max_train_examples": None, "max_eval_examples": None, "max_seq_length": 128}
    md = comparison_markdown({"rows": [pre, rnd], "sentence_task": "nsp", "budget": budget})
    assert "| model | zero-shot STS-B |\n|---|---|\n| pre | 51.2 |\n| rnd | 41.0 ± 1.0 |\n| pre minus rnd | +10.2 |\n" in md
    pre["zero_shot_stsb"] = rnd["zero_shot_stsb"] = None  # no STS-B in the grid: no table
    assert "zero-shot" not in comparison_markdown({"rows": [pre, rnd], "sentence_task": "nsp", "budget": budget})
