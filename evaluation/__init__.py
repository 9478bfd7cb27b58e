"""Downstream and intrinsic evaluation: GLUE (nine tasks), SQuAD v1.1, CoNLL-2003 NER (fine-tuning and
the feature-based BiLSTM), held-out MLM/NSP over checkpoints. Each ``run_*`` fans its jobs out as Ray
tasks, writes ``results.json`` + ``report.md`` into ``cfg.output_dir`` and returns the results.

Imports are lazy so ``bertflow eval --help`` and the flows layer stay light, and ``run_glue`` first checks
what can be refused without torch (``evaluation.inputs``; ``evaluation.runner.preflight`` for a stage run):
a user error there costs no heavy import.
"""
from __future__ import annotations

from typing import Any


def run_glue(cfg, checked: bool = False) -> dict[str, Any]:
    """``checked``: ``evaluation.runner.preflight`` has checked the tasks' files and the model (a stage run
    through ``evaluation.runner``); their files are not read again."""
    from evaluation.glue import get_task
    from evaluation.inputs import check_glue_tasks, model_format

    specs = None
    if not cfg.predict_only and checked:
        specs = [get_task(t) for t in cfg.tasks]
    elif not cfg.predict_only:  # (predict_only checks its kept model first: evaluation.glue_predict)
        specs = check_glue_tasks(cfg)
        model_format(cfg)
    from evaluation.glue_eval import run_glue as _run

    return _run(cfg, specs)


def run_squad(cfg) -> dict[str, Any]:
    from evaluation.squad_eval import run_squad as _run

    return _run(cfg)


def run_ner(cfg) -> dict[str, Any]:
    from evaluation.ner_eval import run_ner as _run

    return _run(cfg)


def run_intrinsic(cfg) -> dict[str, Any]:
    from evaluation.intrinsic import run_intrinsic as _run

    return _run(cfg)


__all__ = ["run_glue", "run_squad", "run_ner", "run_intrinsic"]
