"""Content identity of a model input (a checkpoint, a run directory, a Hugging Face directory, a
dataset): what a stage's ``status`` compares to decide whether its inputs changed.

Identity is by content, never by path, so the same weights addressed relatively, absolutely or copied
elsewhere are recognised, and weights rewritten in place are not. Imports neither torch nor DeepSpeed.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from contracts.lock import LOCK_NAME
from contracts.common import sha256_file, stable_hash
from contracts.schema import MANIFEST_NAME, Manifest

# A run directory's layout, defined once (torch-free: the stage, the trainer, the checkpoint manager,
# the metrics log and the object-store mirror all name their files from here).
RUN_CONFIG = "train_config.json"
METRICS_FILE = "metrics.jsonl"
CHECKPOINTS = "checkpoints"
STATE = "trainer_state.json"  # in each checkpoint
MARKER = "COMPLETE"  # in each checkpoint, written last, with every file's size and SHA-256


# What any bertflow checkpoint (even one cut short while saving) or run directory holds.
CHECKPOINT_SIGNS = (MARKER, STATE, "model_config.json", "engine", CHECKPOINTS)


def looks_like_model(path: str | Path) -> bool:
    """A Hugging Face directory, or a bertflow checkpoint or run directory, complete or not: what a model
    path must at least look like before its content is hashed (a home directory or ``/`` does not)."""
    p = Path(path)
    return is_hf_dir(p) or (p.is_dir() and any((p / n).exists() for n in CHECKPOINT_SIGNS))


def is_hf_dir(path: str | Path) -> bool:
    """The one test for "this is a Hugging Face directory" (training's init_from, checkpoint loading,
    evaluation's model_format auto): a config.json and not a bertflow checkpoint or run directory.
    Weights are not looked for here, so an HF directory without them gets load_hf's precise error."""
    p = Path(path)
    return (p / "config.json").is_file() and not (p / MARKER).exists() and not (p / CHECKPOINTS).exists()


def _checkpoint(path: Path) -> str:
    """A finished checkpoint: the inventory in its marker (size and checksum of every file)."""
    try:
        marker = json.loads((path / MARKER).read_text(encoding="utf-8"))
        files = marker.get("files") if isinstance(marker, dict) else None  # an edited marker: the files' own
    except (OSError, ValueError, RecursionError):
        files = None
    return stable_hash(["checkpoint", path.name, files or _files(path)])


def _files(directory: Path) -> list:
    return [[str(f.relative_to(directory)), f.stat().st_size, sha256_file(f)]
            for f in sorted(directory.rglob("*")) if f.is_file() and f.name != LOCK_NAME]  # a writer's lock is no content


def identity(path: Optional[str | Path]) -> Optional[str]:
    """Content identity of ``path`` (None for no path, "missing" for a path that does not exist)."""
    if path is None:
        return None
    from contracts.storage import is_uri

    if is_uri(path):  # a dataset (its manifest), or a checkpoint or run (bert_core.remote_run), on a store
        from bert_core.remote_run import remote_identity
        from contracts.storage import location

        if location(str(path)).exists(MANIFEST_NAME):
            try:
                return Manifest.read(str(path)).identity()
            except Exception:  # noqa: BLE001 - a corrupt manifest is simply another content
                return stable_hash(["corrupt-manifest", location(str(path)).read(MANIFEST_NAME).hex()])
        found = remote_identity(str(path))
        if found != "missing":
            return found
        from contracts.common import UserError
        from contracts.views import local_view

        try:  # task data, a vocab, a Hugging Face directory: the content of this node's copy, as if local
            return identity(local_view(str(path)))
        except UserError:
            return "missing"
    p = Path(path)
    if not p.exists():
        return "missing"
    if (p / MANIFEST_NAME).is_file():
        try:
            return Manifest.read(p).identity()
        except Exception:  # noqa: BLE001 - a corrupt manifest is simply another content
            pass
    if (p / MARKER).is_file():
        return _checkpoint(p)
    if (p / CHECKPOINTS).is_dir():  # a run directory: each finished checkpoint
        ckpts = sorted(c for c in (p / CHECKPOINTS).glob("step_*") if (c / MARKER).is_file())
        return stable_hash(["run", [_checkpoint(c) for c in ckpts]])
    if p.is_file():
        return stable_hash(["file", p.stat().st_size, sha256_file(p)])
    return stable_hash(["dir", _files(p)])
