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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from bert_core.identity import CHECKPOINTS, MARKER, METRICS_FILE, RUN_CONFIG, STATE, identity, looks_like_model
from bert_core.train_config import TrainConfig
from contracts.common import Status
from contracts.stage import StageDir

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
        from contracts.storage import is_uri

        if is_uri(run_dir):  # a run on an object store (bert_core.remote_run): URIs in place of paths
            return cls._from_remote(str(run_dir))
        run_dir = Path(run_dir)
        path = run_dir / METRICS_FILE
        last = _last_record(path.read_bytes().decode("utf-8", "replace") if path.is_file() else "")
        return cls(run_dir, latest_checkpoint(run_dir), path, last)

    @classmethod
    def _from_remote(cls, uri: str) -> "TrainResult":
        from bert_core.remote_run import last_remote_checkpoint
        from contracts.storage import location

        try:
            text = location(uri).read(METRICS_FILE).decode("utf-8", "replace")
        except FileNotFoundError:
            text = ""
        uri = uri.rstrip("/")
        return cls(uri, last_remote_checkpoint(uri), f"{uri}/{METRICS_FILE}", _last_record(text))  # type: ignore[arg-type]


def _last_record(text: str) -> dict[str, Any]:
    last: dict[str, Any] = {}
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):
            break  # a line cut by kill -9: nothing after it counts
        if not isinstance(record, dict):
            break  # nor after a line that is no metrics record (an edited file)
        last = record
    return last


def _step(path: Path) -> int:
    return int(path.name.split("_")[-1])


def latest_checkpoint(run_dir: str | Path) -> Optional[Path]:
    """The last finished checkpoint of a run (as CheckpointManager.latest, without torch)."""
    root = Path(run_dir) / CHECKPOINTS
    done = [p for p in root.glob("step_*") if p.name[5:].isdecimal() and (p / MARKER).is_file()
            and (p / STATE).is_file()] if root.is_dir() else []
    return max(done, key=_step) if done else None


def input_identity(config: TrainConfig) -> dict[str, Optional[str]]:
    """Content identity of the run's inputs (the instances dataset, the init weights), not their paths."""
    check_init_from(config)
    return {name: identity(getattr(config, name)) for name in sorted(TrainConfig.input_fields)}


def check_init_from(config: TrainConfig) -> None:
    """A local ``init_from`` that is missing or no model at all (a home directory, ``/``): one line, before
    its content is hashed or torch loads. (One on an object store: ``bert_core.train._local_model``.)"""
    from contracts.storage import is_uri

    if config.init_from is not None and not is_uri(config.init_from):
        _refuse_no_model(Path(config.init_from), "init_from: ", "a model")


def _refuse_no_model(path: Path, prefix: str, noun: str) -> None:
    """The one check of a local model source (``init_from``, an export's checkpoint) before it is hashed:
    it exists and looks like a model (``bert_core.identity.looks_like_model``)."""
    from contracts.common import UserError

    if not path.exists():
        raise UserError(f"{prefix}{path}: checkpoint not found")
    if not looks_like_model(path):
        raise UserError(f"{prefix}{path}: not {noun} (neither a bertflow checkpoint or run directory nor a "
                        "Hugging Face BERT directory with config.json)")


RUN_FILES = frozenset({RUN_CONFIG, METRICS_FILE, CHECKPOINTS, "tensorboard"})  # what a run writes


def run_stage(run_dir: str | Path) -> StageDir:
    """A run directory as a stage location: its record is ``train_config.json`` (written when the run
    starts: the directory is this config's from then on; each checkpoint's COMPLETE marker is what
    makes a step exist), its names what a run writes."""
    return StageDir.at(run_dir, "train", record=RUN_CONFIG, hash_field="resume_hash", owns=RUN_FILES)


def status(config: TrainConfig) -> Status:
    """Training stage: done (every step checkpointed) | partial (resumable) | absent, for this config
    and these inputs."""
    from contracts.storage import is_uri

    remote = is_uri(config.output_dir)  # a run on an object store: bert_core.remote_run
    run_dir = config.output_dir if remote else Path(config.output_dir)
    state = run_stage(run_dir).status(config.resume_hash(), lambda: input_identity(config))
    if not state.done:
        return state
    if remote:
        from bert_core.remote_run import RemoteRun

        done = RemoteRun(config.output_dir).complete()
        name = f"step_{done[-1]:08d}" if done else None
        last_step = done[-1] if done else None
    else:
        latest = latest_checkpoint(run_dir)
        name, last_step = (latest.name, _step(latest)) if latest is not None else (None, None)
    if last_step is not None and last_step >= config.max_steps:
        return state
    return Status("partial", f"resumable from {name or 'the start (no checkpoint yet)'}", state.inputs)


def refuse_foreign(run_dir: str | Path) -> None:
    """A run writes only its own names (RUN_FILES): a directory holding anything else (a user's
    metrics.jsonl in a fresh directory, notes beside a stale run) is refused with one line, untouched."""
    run_stage(run_dir).refuse_foreign("files no run wrote", prefix="output_dir: ",
                                      advice="move them or choose another directory")


def discard(config: TrainConfig) -> None:
    """Remove a stale run (another config's or other inputs') from ``output_dir`` before training anew:
    only what the run's record vouches for, under the directory's one-writer lock; a directory that
    also holds files no run wrote is refused with one line (a user's notes are never deleted with the
    stale run)."""
    sd = run_stage(config.output_dir)
    if sd.read_record() is None and not (Path(config.output_dir) / CHECKPOINTS).is_dir():
        return
    with sd.lock():
        refuse_foreign(config.output_dir)
        sd.remove_owned()


EXPORT_HASH = "hf-export-1"  # an export has no config: this names the format (a change redoes exports)


def export_stage(out_dir: str | Path) -> StageDir:
    """An export directory as a stage location: its record names the checkpoint's content identity and
    the files written."""
    return StageDir.at(out_dir, "export", record=EXPORT_RECORD)


def export_source(checkpoint_or_run_dir: str | Path) -> Optional[Path]:
    """The checkpoint an export is made from: the run's latest, or the checkpoint given."""
    from contracts.storage import is_uri

    if is_uri(checkpoint_or_run_dir):  # identity() resolves a run's latest checkpoint on the store
        return checkpoint_or_run_dir  # type: ignore[return-value]
    src = Path(checkpoint_or_run_dir)
    return latest_checkpoint(src) if (src / CHECKPOINTS).is_dir() else src


def export_status(checkpoint_or_run_dir: str | Path, out_dir: str | Path) -> Status:
    """Export stage: done when ``out_dir`` holds the export of exactly this checkpoint's content. A local
    source that is missing or no model at all (a home directory, ``/``) is one line before it is hashed."""
    from contracts.storage import is_uri

    if not is_uri(checkpoint_or_run_dir):
        _refuse_no_model(Path(checkpoint_or_run_dir), "", "a checkpoint")
    return export_stage(out_dir).status(
        EXPORT_HASH, lambda: {"checkpoint": identity(export_source(checkpoint_or_run_dir))})
