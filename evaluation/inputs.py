"""What an evaluation can refuse before torch loads: the model path (``model_format``) and, for GLUE,
the task names, the task files and every row in them (``check_glue_tasks``). ``evaluation.run_glue``
calls them first, so a user error is one line in well under a second instead of after the imports of the
fine-tuning stack (torch, the metrics' scipy and scikit-learn: seconds). Imports neither torch nor Ray.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from bert_core.identity import is_hf_dir, looks_like_model
from contracts.common import UserError
from contracts.storage import is_uri
from contracts.views import local_view, view_of
from evaluation import glue
from evaluation.config import EvalBase, GlueConfig


def model_format(cfg: EvalBase) -> str:
    """'hf' or 'checkpoint' (resolving 'auto' with bert_core's one test for an HF directory)."""
    if is_uri(cfg.model_path):  # on an object store: a bertflow run or checkpoint, or a Hugging Face directory
        from bert_core.remote_run import checkpoint_uri
        from contracts.storage import location

        if cfg.model_format != "hf" and checkpoint_uri(cfg.model_path) is not None:
            return "checkpoint"
        if cfg.model_format != "checkpoint" and location(cfg.model_path.rstrip("/")).exists("config.json") \
                and is_hf_dir(local_view(cfg.model_path)):
            return "hf"
        raise UserError(f"{cfg.model_path.rstrip('/')}: not a model (neither a complete bertflow checkpoint or "
                        "run, with a COMPLETE marker, nor a Hugging Face BERT directory with config.json and weights)")
    path = Path(cfg.model_path)
    if not path.exists():
        raise UserError(f"{path}: model path not found")
    if cfg.model_format != "auto":
        return cfg.model_format
    if is_hf_dir(path):
        return "hf"
    if not looks_like_model(path):
        # Not a half-saved checkpoint either: "killed while saving?" would send the user looking in vain.
        raise UserError(f"{path}: not a model (neither a Hugging Face BERT directory with config.json and "
                        "weights, nor a bertflow checkpoint or run directory)")
    return "checkpoint"


def task_files(cfg: GlueConfig, spec: glue.TaskSpec) -> tuple[Path, dict[str, Path], dict[str, Path]]:
    """(train, dev files, existing test files); missing train/dev files are a UserError."""
    d = view_of(cfg.glue_dir, spec.name)  # a URI: this node's copy of the task (contracts.views)
    train = d / "train.tsv"
    devs = {name: d / f for name, f in spec.dev_files.items()}
    if not train.is_file() and d.is_dir() and any(p.is_file() for p in devs.values()):
        # A held-out (dev+test only) task directory: only a model fine-tuned elsewhere can predict it.
        raise UserError(f"{train}: task file not found: GLUE {spec.name} fine-tunes on train.tsv; to predict a "
                        "dev+test-only task directory, use --predict-only with --model a model kept by "
                        "--save-models (<output-dir>/models/<task>)")
    for p in [train, *devs.values()]:
        if not p.is_file():
            raise UserError(f"{p}: task file not found (GLUE {spec.name} needs train.tsv and dev files)")
    tests = {name: d / f for name, f in spec.test_files.items() if (d / f).is_file()}
    return train, devs, tests


def held_out_indices(n: int, fraction: float, most: int) -> list[int]:
    """Which of ``n`` training examples are held out to choose lr and epoch (``select_on: train_split``):
    ``min(most, round(fraction * n))`` of them (at least 1), drawn once with a fixed seed (numpy's legacy
    RandomState, stable across versions), so every lr, seed and model of a grid is chosen on the same ones."""
    k = min(most, max(1, round(fraction * n)))
    if k >= n:
        raise ValueError(f"{n} training examples leave none to train on after holding out {k}")
    return sorted(np.random.RandomState(0).permutation(n)[:k].tolist())


def train_and_held_out(cfg: GlueConfig, spec: glue.TaskSpec, path: Path) -> tuple[list, list]:
    """(examples trained on, examples held out for the choice). ``select_on: dev``: the first
    ``max_train_examples``, nothing held out. ``train_split``: the held-out examples come from the whole
    file, and ``max_train_examples`` takes the first N of the rest (a learning curve's N examples stay N)."""
    if cfg.select_on == "dev":
        return glue.read_examples(spec, path, cfg.max_train_examples), []
    examples = glue.read_examples(spec, path)
    try:
        held = set(held_out_indices(len(examples), cfg.select_fraction, cfg.select_max))
    except ValueError as e:
        raise UserError(f"{path}: select_on train_split: {e}") from None
    train = [e for i, e in enumerate(examples) if i not in held]
    return train[: cfg.max_train_examples], [examples[i] for i in sorted(held)]


def check_glue_tasks(cfg: GlueConfig) -> list[glue.TaskSpec]:
    """Task names, files, every row's columns (test files too, where predictions are written: a malformed
    test row must stop the run before the first fine-tune, not after) and, with ``select_on:
    train_split``, enough rows to hold some out and train on the rest. Returns the task specs."""
    specs = [glue.get_task(t) for t in cfg.tasks]
    for spec in specs:
        train, devs, tests = task_files(cfg, spec)
        for p in [train, *devs.values()]:
            glue.read_examples(spec, p)
        if cfg.select_on == "train_split":
            train_and_held_out(cfg, spec, train)
        for p in tests.values() if cfg.write_test_predictions else []:
            glue.read_test_examples(spec, p)
    return specs
