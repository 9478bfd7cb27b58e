"""The statuses of the training and export stages, and a run's result read back from its directory.

Torch-free on purpose: a rerun whose stages are all done asks every status without importing torch
(seconds on a busy machine). ``bert_core.train`` and ``bert_core.export`` re-export what is theirs
(``train.status``, ``export.status``), so each job still owns its answer.

Run-directory layout facts used here (written by bert_core.train / bert_core.checkpoint):
``train_config.json`` (the config, its hash and its inputs' identity), ``metrics.jsonl``, and
``checkpoints/step_*/`` finished when they hold COMPLETE and trainer_state.json.
"""
from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from bert_core.identity import MARKER, identity
from bert_core.train_config import TrainConfig
from contracts.lock import others, output_lock
from contracts.common import NO_OUTPUT, Status, UserError

RUN_CONFIG = "train_config.json"
METRICS_FILE = "metrics.jsonl"  # bert_core.train_log.METRICS_FILE
STATE = "trainer_state.json"  # bert_core.checkpoint.STATE
EXPORT_RECORD = "exported_from.json"  # the exported checkpoint's content identity


@dataclass
class TrainResult:
    run_dir: Path
    last_checkpoint: Optional[Path]
    metrics_file: Path
    final_metrics: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_run_dir(cls, run_dir: str | Path) -> "TrainResult":
        """The result of a run read back from its directory (launches in other processes, skipped runs)."""
        run_dir = Path(run_dir)
        last: dict[str, Any] = {}
        path = run_dir / METRICS_FILE
        for line in path.read_text(encoding="utf-8").splitlines() if path.is_file() else []:
            try:
                last = json.loads(line)
            except ValueError:
                break  # a line cut by kill -9: nothing after it counts
        return cls(run_dir, latest_checkpoint(run_dir), path, last)


def _step(path: Path) -> int:
    return int(path.name.split("_")[-1])


def latest_checkpoint(run_dir: str | Path) -> Optional[Path]:
    """The last finished checkpoint of a run (as CheckpointManager.latest, without torch)."""
    root = Path(run_dir) / "checkpoints"
    done = [p for p in root.glob("step_*") if (p / MARKER).is_file() and (p / STATE).is_file()] if root.is_dir() else []
    return max(done, key=_step) if done else None


def input_identity(config: TrainConfig) -> dict[str, Optional[str]]:
    """Content identity of the run's inputs (the instances dataset, the init weights), not their paths."""
    return {name: identity(getattr(config, name)) for name in sorted(TrainConfig.input_fields)}


def status(config: TrainConfig) -> Status:
    """Training stage: done (every step checkpointed) | partial (resumable) | absent, for this config
    and these inputs."""
    run_dir = Path(config.output_dir)
    try:
        saved = json.loads((run_dir / RUN_CONFIG).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return Status("absent", NO_OUTPUT if not run_dir.exists() else "no finished run config")
    if saved.get("resume_hash") != config.resume_hash():
        return Status("absent", "config differs")
    inputs = input_identity(config)
    changed = [k for k, v in (saved.get("inputs") or inputs).items() if inputs.get(k) != v]
    if changed:
        return Status("absent", f"inputs changed: {', '.join(changed)}")
    latest = latest_checkpoint(run_dir)
    if latest is not None and _step(latest) >= config.max_steps:
        return Status("done", "complete")
    return Status("partial", f"resumable from {latest.name if latest else 'the start (no checkpoint yet)'}")


RUN_FILES = frozenset({RUN_CONFIG, METRICS_FILE, "checkpoints", "tensorboard"})  # what a run writes


def discard(config: TrainConfig) -> None:
    """Remove a stale run (another config's or other inputs') from ``output_dir`` before training anew:
    only what a run writes, under the directory's one-writer lock; a directory that also holds files
    no run wrote is refused with one line (a user's notes are never deleted with the stale run)."""
    run_dir = Path(config.output_dir)
    if not ((run_dir / RUN_CONFIG).is_file() or (run_dir / "checkpoints").is_dir()):
        return
    with output_lock(run_dir):
        foreign = sorted(p.name for p in others(run_dir) if p.name not in RUN_FILES)
        if foreign:
            raise UserError(f"output_dir: {run_dir} holds a stale run and files no run wrote ({foreign[0]}"
                            f"{f' and {len(foreign) - 1} more' if len(foreign) > 1 else ''}); move them or "
                            "choose another directory")
        for p in others(run_dir):
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()


def export_status(checkpoint_or_run_dir: str | Path, out_dir: str | Path) -> Status:
    """Export stage: done when ``out_dir`` holds the export of exactly this checkpoint's content."""
    out = Path(out_dir)
    try:
        record = json.loads((out / EXPORT_RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return Status("absent", NO_OUTPUT if not others(out) else "no export record")  # (the lock is not output)
    src = Path(checkpoint_or_run_dir)
    ckpt = latest_checkpoint(src) if (src / "checkpoints").is_dir() else src
    if not isinstance(record, dict) or record.get("source") != identity(ckpt):
        return Status("absent", "inputs changed: checkpoint")
    missing = [n for n in record.get("files", []) if not (out / n).is_file()]
    if missing:
        return Status("absent", f"{len(missing)} files missing")
    return Status("done", "complete")
