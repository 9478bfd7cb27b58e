"""Configs from YAML plus CLI flags (flags win), strict validation, and the summary/report logic."""
from __future__ import annotations

import pytest

from contracts.common import UserError
from evaluation.cli import build_parser, config_from_args
from evaluation.report import markdown_report, summarize


def test_yaml_then_flags(tmp_path):
    y = tmp_path / "glue.yaml"
    y.write_text("model_path: m\nglue_dir: g\noutput_dir: o\ntasks: [RTE]\nseeds: [7]\nlearning_rates: [1.0e-5]\n")
    cfg = config_from_args(build_parser().parse_args(["glue", "--config", str(y), "--tasks", "SST-2,CoLA", "--no-ray"]))
    assert cfg.tasks == ["SST-2", "CoLA"] and cfg.seeds == [7] and cfg.learning_rates == [1e-5]
    assert cfg.use_ray is False and cfg.batch_size == 32 and cfg.epochs == 3.0  # paper defaults
    y.write_text("model_path: m\nglue_dir: g\noutput_dir: o\nlearning_rate: 3\n")
    with pytest.raises(UserError, match=r"learning_rate: unknown key \(typo\?\)"):
        config_from_args(build_parser().parse_args(["glue", "--config", str(y)]))
    with pytest.raises(UserError, match="model_path: Field required"):
        config_from_args(build_parser().parse_args(["squad", "--dev-file", "d", "--output-dir", "o"]))


def _run(task, ev, lr, seed, value, metric="accuracy"):
    return {"task": task, "eval": ev, "lr": lr, "seed": seed, "metrics": {metric: value}}


def test_summarize_picks_lr_on_mean_over_seeds_and_mnli_mm_follows_m():
    runs = [
        _run("MNLI", "MNLI-m", 5e-5, 1, 0.80), _run("MNLI", "MNLI-m", 5e-5, 2, 0.70),  # mean 0.75
        _run("MNLI", "MNLI-m", 2e-5, 1, 0.78), _run("MNLI", "MNLI-m", 2e-5, 2, 0.76),  # mean 0.77: best
        _run("MNLI", "MNLI-mm", 5e-5, 1, 0.90), _run("MNLI", "MNLI-mm", 5e-5, 2, 0.90),  # better, but not chosen
        _run("MNLI", "MNLI-mm", 2e-5, 1, 0.60), _run("MNLI", "MNLI-mm", 2e-5, 2, 0.70),
    ]
    out = summarize(runs, {"MNLI-m": "accuracy", "MNLI-mm": "accuracy"}, {"MNLI-mm": "MNLI-m"})
    assert out["MNLI-m"]["best_lr"] == 2e-5 and out["MNLI-m"]["mean"] == pytest.approx(0.77)
    assert out["MNLI-m"]["std"] == pytest.approx(0.0141421356)  # sample std of (0.78, 0.76)
    assert out["MNLI-mm"]["best_lr"] == 2e-5 and out["MNLI-mm"]["mean"] == pytest.approx(0.65)
    md = markdown_report({"evaluation": "glue", "model_path": "m", "tasks": out})
    assert "| MNLI-m | accuracy | 2e-05 | 0.7700 ± 0.0141 | 2 |" in md


def test_summarize_never_chooses_a_nan_learning_rate():
    # A cell written before constant STS-B predictions scored 0 holds NaN; the first lr of the grid must
    # not win by default over a finite score.
    runs = [_run("STS-B", "STS-B", 1e-4, 1, float("nan")), _run("STS-B", "STS-B", 3e-4, 1, 0.05)]
    out = summarize(runs, {"STS-B": "accuracy"}, {})
    assert out["STS-B"]["best_lr"] == 3e-4 and out["STS-B"]["mean"] == pytest.approx(0.05)
