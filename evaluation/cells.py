"""Resumable fine-tuning grids: every (task, learning rate, seed) cell writes its result to
``<output_dir>/cells/<task>-<hash>.json`` atomically the moment it finishes, inside the job itself
(so a driver killed midway loses nothing that finished). A rerun reads the cells whose file exists
and runs only the missing ones.

The hash covers everything that changes a cell's result: the task, the learning rate, the seed and
the config minus the settings that only say where or how jobs run (output directory, Ray address,
progress bars, cpus/gpus per task), minus the grid's shape (the lists of tasks, learning rates and
seeds say which cells exist, not what one computes: a grid extended by a seed, an lr or a task reuses
every cell it already has; ``task_epochs`` enters as the one task's epochs), and minus the options added
later while they hold their defaults
(``evaluation.config.LATER_DEFAULTS``: an older config keeps its cells). A changed config therefore
never reuses a stale cell; a cell file that does not parse (a half-written file cannot exist, but a
damaged one can) is run again.

Cells written before the grid's shape left the hash (their name hashed the whole grid too: the
*legacy* key) are still read: a cell missing under its key is looked up under its legacy key, and a
hit is copied to its current name, so the next grid change finds it too (not with ``save_models``:
a kept model is filed under its cell's name, so those cells run again).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from contracts.common import stable_hash, write_json_atomic
from evaluation.config import without_later_defaults

CELLS_DIR = "cells"
# Where and how a job runs, not what it computes: never part of a cell's identity.
_NOT_RESULT = ("output_dir", "use_ray", "ray_address", "cpus_per_task", "gpus_per_task", "show_progress")
# The grid's shape: which cells exist, not what one of them computes.
_GRID_SHAPE = ("tasks", "learning_rates", "seeds")


def _key(cfg_data: dict, task: str, lr: float, seed: int, leave_out: tuple[str, ...]) -> str:
    # Options added later are left out at their defaults: an older config keeps its finished cells.
    identity = without_later_defaults({k: v for k, v in cfg_data.items() if k not in leave_out})
    if identity.get("task_epochs"):
        # A cell computes its task's epochs, not the grid's table of them: {epochs: 3, task_epochs: {SST-2: 1}}
        # and {epochs: 1} give the same SST-2 cell.
        identity["epochs"] = identity.pop("task_epochs").get(task, identity.get("epochs"))
    return f"{task}-{stable_hash({'config': identity, 'task': task, 'lr': lr, 'seed': seed})}"


def cell_key(cfg_data: dict, task: str, lr: float, seed: int) -> str:
    """``<task>-<16 hex>``: the file name (without .json) of one grid cell's result."""
    return _key(cfg_data, task, lr, seed, _NOT_RESULT + _GRID_SHAPE)


def legacy_cell_key(cfg_data: dict, task: str, lr: float, seed: int) -> str:
    """The name the same cell had while the grid's shape was part of the hash (read, never written)."""
    return _key(cfg_data, task, lr, seed, _NOT_RESULT)


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


def split_grid(output_dir: str | Path, cfg_data: dict, grid: list[tuple[str, float, int]]):
    """(finished {index: result}, missing [(index, key, path)]) for the grid's cells."""
    done, missing = {}, []
    # A kept fine-tuned model is staged under its cell's name and recorded with it: legacy cells of a
    # save_models grid run again rather than lose track of their models.
    legacy = cfg_data.get("save_models", "none") == "none"
    for i, (task, lr, seed) in enumerate(grid):
        key = cell_key(cfg_data, task, lr, seed)
        path = cell_path(output_dir, key)
        cached = read_cell(path)
        if cached is None and legacy:  # written under the legacy name? then it gets its current name too
            cached = read_cell(cell_path(output_dir, legacy_cell_key(cfg_data, task, lr, seed)))
            if cached is not None:
                write_json_atomic(path, {"key": key, "result": cached["result"]})
        if cached is None:
            missing.append((i, key, path))
        else:
            done[i] = cached["result"]
    return done, missing
