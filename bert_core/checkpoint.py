"""Checkpoints: save / load / latest / purge, and loading a model from any checkpoint or run dir.

Layout of ``RUN_DIR/checkpoints/step_00000010/``:

    engine/             the engine's own files (torch: model.pt + training_state.pt; DeepSpeed: ds/...)
    rng/rank_00000.pt   torch / numpy / python RNG states of every rank (DeepSpeed saves none)
    trainer_state.json  step, loader cursor, tokens seen, engine, zero stage, vocab hash
    train_config.json   the TrainConfig of the run;  model_config.json: the architecture
    ds_config.json      the generated DeepSpeed JSON (DeepSpeed runs)
    vocab.txt           copy of the vocabulary, so a checkpoint exports on its own
    COMPLETE            written last (with the size and SHA-256 of every file above, checked on
                        load), then the directory is renamed from .tmp-step_*: a directory
                        without it (a kill -9 mid-save) is never picked up
"""
from __future__ import annotations

import random
import re
import shutil
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import torch

from bert_core.config import ModelConfig
from bert_core.engine import consolidated_state_dict
from bert_core.hf import load_hf
from bert_core.identity import CHECKPOINTS, MARKER, STATE, is_hf_dir
from bert_core.model import BertForPreTraining
from contracts.common import UserError, build_config, fsync_dir, read_json_object, sha256_file, write_json_atomic



def _noop() -> None:
    pass


def rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def step_of(path: Path) -> int:
    return int(path.name.split("_")[-1])


def is_step_dir(path: Path) -> bool:
    """``step_<digits>``: a checkpoint's name (``step_final``, a user's copy, is not one; nor read as one)."""
    return path.name.startswith("step_") and path.name[5:].isdecimal()


def is_complete(path: Path) -> bool:
    return (path / MARKER).is_file() and (path / STATE).is_file()


class CheckpointManager:
    """Collective save/load of one run's checkpoints; only rank 0 writes the shared files."""

    def __init__(self, run_dir: str | Path, keep_last: int = 3, rank: int = 0, barrier: Callable[[], None] = _noop,
                 remote=None):
        self.root = Path(run_dir) / CHECKPOINTS
        self.keep_last, self.rank, self.barrier = keep_last, rank, barrier
        self.remote = remote  # bert_core.remote_run.RemoteRun: run_dir is its node-local mirror

    def all(self) -> list[Path]:
        if not self.root.is_dir():
            return []
        found = [p for p in self.root.glob("step_*") if is_step_dir(p) and p.is_dir() and is_complete(p)]
        return sorted(found, key=step_of)

    def latest(self) -> Optional[Path]:
        found = self.all()
        return found[-1] if found else None

    def save(self, step: int, engine, state: dict[str, Any], files: dict[str, Any]) -> Path:
        """``state`` goes to trainer_state.json (and the engine's client_state); ``files`` maps file
        names to JSON objects or source paths (vocab.txt) copied beside it."""
        name = f"step_{step:08d}"
        tmp, final = self.root / f".tmp-{name}", self.root / name
        if self.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)  # debris of a run killed mid-save
            (tmp / "rng").mkdir(parents=True)
        self.barrier()
        if self.remote is not None:  # node-local scratch: a node without rank 0 makes its own directory
            (tmp / "rng").mkdir(parents=True, exist_ok=True)
        try:
            engine.save(tmp / "engine", client_state=state)
            torch.save(rng_state(), tmp / "rng" / f"rank_{self.rank:05d}.pt")
        except (OSError, RuntimeError) as err:  # torch reports a full disk as an iostream RuntimeError
            raise UserError(f"{tmp}: cannot write the checkpoint: {_write_failure(tmp, err)}") from None
        self.barrier()
        if self.rank == 0:
            for fname, obj in files.items():
                if isinstance(obj, Path):
                    shutil.copyfile(obj, tmp / fname)
                else:
                    write_json_atomic(tmp / fname, obj)
            write_json_atomic(tmp / STATE, state)
        inventory = self._upload(tmp, step) if self.remote is not None else None
        if self.rank == 0:
            write_json_atomic(tmp / MARKER, {"step": step, "files": _inventory(tmp) if inventory is None else inventory})
            if self.remote is not None:
                self.remote.commit(step, tmp / MARKER)  # last: from here the checkpoint exists on the store
            if final.exists():
                shutil.rmtree(final)
            tmp.rename(final)
            fsync_dir(self.root)
            self.purge()
        self.barrier()
        if self.remote is not None and self.rank != 0:  # a node without rank 0: its uploaded scratch copy
            shutil.rmtree(tmp, ignore_errors=True)
        return final

    def _upload(self, tmp: Path, step: int) -> dict[str, dict[str, Any]]:
        """Every rank uploads its own files of the checkpoint (rank 0 the shared ones too, after
        retracting an older marker of this step); the inventory of all of them, on every rank."""
        import torch.distributed as dist

        if self.rank == 0:
            self.remote.retract(step)
        self.barrier()  # the shared files are written and no old marker stands
        try:
            mine = self.remote.push_files(tmp, step, self.rank)
            problem = None
        except UserError as err:
            mine, problem = {}, str(err)
        found = [(mine, problem)]
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            found = [None] * dist.get_world_size()
            dist.all_gather_object(found, (mine, problem))  # also the barrier before the marker
        problem = next((p for _, p in found if p is not None), None)
        if problem is not None:  # every rank refuses together (a rank alone would hang the others)
            raise UserError(problem)
        return {rel: meta for files, _ in found for rel, meta in files.items()}

    def purge(self) -> None:
        for old in self.all()[: -self.keep_last]:
            shutil.rmtree(old, ignore_errors=True)
        if self.remote is not None:
            self.remote.purge(self.keep_last)

    def load(self, path: Path, engine, check: bool = True, same_world: bool = True) -> dict[str, Any]:
        """Restore engine state and this rank's RNG; returns trainer_state.json. ``check=False`` skips
        the checksum pass when the caller has just run ``verify``. ``same_world=False`` (elastic
        resume): the saved RNG streams belong to other ranks, so none is restored."""
        state = read_state(path)
        if check:
            verify(path, self.rank, same_world)
        rng_file = path / "rng" / f"rank_{self.rank:05d}.pt"
        if same_world and not rng_file.is_file():
            raise UserError(f"{path}: no RNG state for rank {self.rank} (saved with another world size?)")
        try:
            engine.load(path / "engine")
            if same_world:
                set_rng_state(torch.load(rng_file, weights_only=False))
        except UserError:
            raise
        except Exception as err:  # a damaged file surfaces as one of many exception types
            raise UserError(f"{path}: corrupt checkpoint: {_first_line(err)}") from None
        return state


def _inventory(directory: Path) -> dict[str, dict[str, Any]]:
    """Size and SHA-256 of every file: a flipped byte in a weight file loads without error otherwise."""
    return {
        str(f.relative_to(directory)): {"bytes": f.stat().st_size, "sha256": sha256_file(f)}
        for f in sorted(directory.rglob("*")) if f.is_file() and f.name != MARKER
    }


_RANK_FILE = re.compile(r"(?:^|/)(?:rank_(\d{5})\.pt|(?:[a-z0-9]+_)?zero_pp_rank_(\d+)_mp_rank_\d+_\w+\.pt)$")


def owner_rank(rel: str) -> Optional[int]:
    """The rank whose state a checkpoint file holds (its RNG file, its ZeRO shards), None if shared."""
    m = _RANK_FILE.search(rel)
    return None if m is None else int(m.group(1) or m.group(2))


def files_read_by(rel_names, rank: Optional[int], same_world: bool = True) -> list[str]:
    """The files a rank reads on resume: every shared file and its own rank files. With another world
    size (elastic resume) or ``rank=None`` (consolidation, export) every file is read."""
    if rank is None or not same_world:
        return list(rel_names)
    return [r for r in rel_names if owner_rank(r) in (None, rank)]


def verify(path: Path, rank: Optional[int] = None, same_world: bool = True) -> None:
    """Refuse a checkpoint whose files differ from the inventory in its COMPLETE marker (one line,
    naming the first damaged file). ``rank``: check only what that rank reads (``files_read_by``),
    so N ranks hash N shards in all instead of N x N; None checks every file."""
    read_state(path)
    files = read_json_object(path / MARKER, "checkpoint marker").get("files") or {}  # older markers: none
    if not isinstance(files, dict):
        raise UserError(f"{path / MARKER}: corrupt checkpoint marker: 'files' is not a mapping")
    for rel in files_read_by(files, rank, same_world):
        meta = files[rel]
        if not (isinstance(meta, dict) and type(meta.get("bytes")) is int and isinstance(meta.get("sha256"), str)):
            raise UserError(f"{path / MARKER}: corrupt checkpoint marker: no size and checksum for {rel!r}")
        f = path / rel
        if not f.is_file():
            raise UserError(f"{f}: missing from the checkpoint")
        if f.stat().st_size != meta["bytes"]:
            raise UserError(f"{f}: size {f.stat().st_size} != {meta['bytes']} recorded at save (truncated?)")
        if sha256_file(f) != meta["sha256"]:
            raise UserError(f"{f}: checksum mismatch (corrupt checkpoint file)")


def verify_collective(path: Path, rank: int, same_world: bool = True) -> None:
    """Every rank checks what it reads, then all ranks share the first problem found, so they all
    refuse together with the same line (a rank alone would leave the others waiting in a barrier)."""
    problem = None
    try:
        verify(path, rank, same_world)
    except UserError as err:
        problem = str(err)
    agree(problem)


def agree(problem: Optional[str]) -> None:
    """Every rank raises the first rank's problem, together (a rank refusing alone leaves the others
    waiting in the next collective); with no process group, this rank's own."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        found: list = [None] * dist.get_world_size()
        dist.all_gather_object(found, problem)
        problem = next((p for p in found if p is not None), None)
    if problem is not None:
        raise UserError(problem)


def _write_failure(directory: Path, err: BaseException) -> str:
    """A full disk often surfaces without errno (torch: 'iostream error'): say so when it is full."""
    try:
        full = shutil.disk_usage(directory).free < (1 << 20)
    except OSError:
        full = False
    return "No space left on device" if full or getattr(err, "errno", None) == 28 else _first_line(err)


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0]}" if text else type(err).__name__


def read_state(path: Path) -> dict[str, Any]:
    if not path.is_dir():
        raise UserError(f"{path}: checkpoint not found")
    if not is_complete(path):
        raise UserError(f"{path}: incomplete checkpoint (no {MARKER} marker: killed while saving?)")
    return read_json_object(path / STATE, "checkpoint state")


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint dir as given, or the latest complete checkpoint of a run dir."""
    path = Path(path)
    if (path / CHECKPOINTS).is_dir():
        latest = CheckpointManager(path).latest()
        if latest is None:
            raise UserError(f"{path}: run directory holds no complete checkpoint")
        return latest
    if not path.exists():
        raise UserError(f"{path}: checkpoint not found")
    return path


def load_model_from_checkpoint(path: str | Path) -> tuple[BertForPreTraining, ModelConfig, Path]:
    """(model in fp32 on CPU, its config, vocab file) from a run dir, a checkpoint dir or an HF dir.

    ZeRO-2/3 shards are consolidated with DeepSpeed's ``get_fp32_state_dict_from_zero_checkpoint``.
    """
    if is_hf_dir(path):
        return load_hf(path)
    ckpt = resolve_checkpoint(path)
    state = read_state(ckpt)
    verify(ckpt)
    mc_path = ckpt / "model_config.json"
    mc = build_config(ModelConfig, read_json_object(mc_path, "model config"), str(mc_path))
    try:
        weights = consolidated_state_dict(ckpt / "engine", state.get("engine", "torch"), int(state.get("zero_stage", 0)))
    except UserError:
        raise
    except Exception as err:  # torch.load/DeepSpeed raise many types for a truncated or damaged file
        raise UserError(f"{ckpt}: cannot read the weights: {_first_line(err)}") from None
    with torch.device("meta"):  # no init of weights about to be overwritten (as bert_core.hf.read_hf)
        model = BertForPreTraining(mc)
    model.to_empty(device="cpu")
    missing, unexpected = model.load_state_dict(weights, strict=False)
    missing = [k for k in missing if k != "cls.predictions.decoder.weight"]  # tied: one copy suffices
    if missing or unexpected:
        raise UserError(f"{ckpt}: weights do not match the model: missing {missing[:3]}, unexpected {unexpected[:3]}")
    model.tie_weights()
    return model.float(), mc, ckpt / "vocab.txt"
