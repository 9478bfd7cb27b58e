"""Resumable fine-tuning grids: every (task, learning rate, seed) cell writes its result to
``<output_dir>/cells/<task>-<hash>.json`` atomically the moment it finishes, inside the job itself
(so a driver killed midway loses nothing that finished). A rerun reads the cells whose file exists
and runs only the missing ones.

The hash covers everything that changes a cell's result, by content: the task, the learning rate, the
seed, the config minus the settings that only say where or how jobs run (output directory, Ray address,
progress bars, cpus/gpus per task) and minus its paths, and the *content* of its inputs (``cell_inputs``):
the model's identity (for a random init: its shape and vocab, the weights being ignored), the vocab's
and the task's data directory's. So a model retrained or rewritten in place, or an edited task file, never
reuses a stale cell, while the same model or data addressed by another path (relative, absolute, a copy)
does. The grid's shape is not in it either (the lists of tasks, learning rates and seeds say which cells
exist, not what one computes: a grid extended by a seed, an lr or a task reuses every cell it already has;
``task_epochs`` enters as the one task's epochs), nor the options added later while they hold their
defaults (``evaluation.config.LATER_DEFAULTS``). A cell file that does not parse (a half-written file
cannot exist, but a damaged one can) is run again. Cells written by versions that keyed cells by paths
are not read: a path does not say whether what it names changed, so they run again.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from bert_core.identity import identity
from contracts.common import stable_hash, write_json_atomic
from contracts.views import view_of
from data_jobs.tokenization import vocab_hash
from evaluation.config import GlueConfig, without_later_defaults

CELLS_DIR = "cells"
# Where and how a job runs, not what it computes: never part of a cell's identity.
_NOT_RESULT = ("output_dir", "use_ray", "ray_address", "cpus_per_task", "gpus_per_task", "show_progress")
# The grid's shape: which cells exist, not what one of them computes.
_GRID_SHAPE = ("tasks", "learning_rates", "seeds", "task_seeds")


def cell_key(cfg_data: dict, task: str, lr: float, seed: int, inputs: dict) -> str:
    """``<task>-<16 hex>``: the file name (without .json) of one grid cell's result; ``inputs``: the
    task's ``cell_inputs``."""
    leave_out = set(_NOT_RESULT + _GRID_SHAPE) | set(GlueConfig.input_fields)
    # Options added later are left out at their defaults: an older config keeps its finished cells.
    identity = without_later_defaults({k: v for k, v in cfg_data.items() if k not in leave_out})
    if identity.get("task_epochs"):
        # A cell computes its task's epochs, not the grid's table of them: {epochs: 3, task_epochs: {SST-2: 1}}
        # and {epochs: 1} give the same SST-2 cell.
        identity["epochs"] = identity.pop("task_epochs").get(task, identity.get("epochs"))
    return f"{task}-{stable_hash({'config': identity, 'inputs': inputs, 'task': task, 'lr': lr, 'seed': seed})}"


def cell_inputs(cfg: GlueConfig, model_config, vocab_file: str, task: str) -> dict:
    """What a cell of ``task`` reads, by content: the model (a random init: only its shape and vocab), the
    tokenizer's vocab and the task's directory of TSV files."""
    vocab = vocab_hash(vocab_file)
    if cfg.random_init:
        model = stable_hash(["random-init", model_config.model_dump(mode="json"), vocab])
    else:
        model = identity(cfg.model_path)
    return {"model": model, "vocab": vocab, "data": identity(view_of(cfg.glue_dir, task))}


def cell_path(output_dir: str | Path, key: str) -> Path:
    return Path(output_dir) / CELLS_DIR / f"{key}.json"


def model_dir(output_dir: str | Path, key: str) -> Path:
    """Where a cell's job keeps its fine-tuned model (GLUE ``save_models``) until the grid is complete."""
    return Path(output_dir) / CELLS_DIR / f"{key}.model"


def read_cell(path: Path) -> dict | None:
    """A finished cell's result, or None where it is missing or unreadable (then it runs again)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and "result" in data else None


def cell_job(fn: Callable[..., dict], path: str, key: str, *args) -> dict:
    """Run ``fn(*args)`` and write its result to ``path`` before returning it (runs inside the job)."""
    result = fn(*args)
    write_json_atomic(path, {"key": key, "result": result})
    return result


def split_grid(output_dir: str | Path, keys: list[str]):
    """(finished {index: result}, missing [(index, key, path)]) for the grid's cells, named by ``keys``."""
    done, missing = {}, []
    for i, key in enumerate(keys):
        path = cell_path(output_dir, key)
        cached = read_cell(path)
        if cached is None:
            missing.append((i, key, path))
        else:
            done[i] = cached["result"]
    return done, missing
