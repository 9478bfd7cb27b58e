"""A training run directory on an object store (``--output-dir s3://bucket/runs/x``).

The run trains exactly as on a local disk, in a mirror of its directory on node-local scratch
(``$BERTFLOW_SCRATCH``, else the system's temporary directory): DeepSpeed writes each checkpoint there,
then every rank uploads its own files (its ZeRO shards, its RNG state; rank 0 the shared ones), all
ranks report what they uploaded (size and SHA-256 of each file), and rank 0 writes the checkpoint's
COMPLETE marker, holding that inventory, LAST: an object appears only complete, and a checkpoint
exists only when its marker does. The run's records (``train_config.json``, ``metrics.jsonl``) are
uploaded whole, the config when the run starts, the metrics at every checkpoint and at the end.

Resume (also on a replaced node with an empty disk, or on another world size) pulls the run's records
and its latest COMPLETE checkpoint (the files its marker names, nothing else) down to the scratch
mirror; the local code then resumes from the mirror as from any run directory, the checksums in the
marker checked as usual. A checkpoint without its marker (an upload cut short) is never taken: a line
says it was skipped. Keep-last deletes, of this run's older checkpoints, only the objects their markers
name, the marker last. The prefix's writer lock is the lease of contracts.lease, held by rank 0 and
checked before every record or marker is written.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from bert_core.identity import CHECKPOINTS, MARKER, METRICS_FILE, RUN_CONFIG
from contracts.common import UserError, sha256_file
from contracts.storage import Location, is_uri, location, scratch_root
from contracts.views import fetched_whole, inside, prune_copies



def scratch_mirror(uri: str) -> Path:
    """The node-local directory mirroring the run at ``uri``: the same path for every rank of a node."""
    root = scratch_root()
    digest = hashlib.sha256(uri.rstrip("/").encode()).hexdigest()[:16]
    return root / f"bertflow-run-{digest}"


def _step(name: str) -> Optional[int]:
    if not name.startswith("step_"):
        return None
    try:
        return int(name.split("_")[-1])
    except ValueError:
        return None


class RemoteRun:
    """The run at an object-store ``uri`` and its node-local mirror ``local``."""

    def __init__(self, uri: str, log: Callable[[str], None] | None = None):
        self.uri = uri.rstrip("/")
        self.loc: Location = location(self.uri)
        self.local = scratch_mirror(self.uri)
        self.lease = None  # rank 0's lease on the prefix (contracts.lease), set by bert_core.train.run
        self._log = log or (lambda line: print(line, file=sys.stderr, flush=True))

    # ------------------------------------------------------------ checks, on every rank alike

    def refuse(self, resume: bool) -> None:
        """Before any work: the prefix is reachable, holds nothing foreign, and holds a run exactly when
        resuming. One-line UserErrors naming the URI."""
        from bert_core.stage import run_stage

        self.loc.check()
        if resume:
            if not self.loc.exists(RUN_CONFIG):
                raise UserError(f"{self.uri}: nothing to resume (no {RUN_CONFIG})")
        elif self.loc.exists(RUN_CONFIG) or self.loc.list(CHECKPOINTS):
            raise UserError(f"output_dir: {self.uri} already holds a run; pass --resume to continue it, "
                            "or choose another prefix")
        run_stage(self.uri).refuse_foreign("objects no run wrote", prefix="output_dir: ",
                                           advice="move them or choose another prefix")

    # ------------------------------------------------------------ what is there

    def checkpoints(self) -> dict[int, bool]:
        """step -> has its COMPLETE marker, for every checkpoint prefix of the run."""
        found: dict[int, bool] = {}
        for m in self.loc.list(CHECKPOINTS):
            parts = m.name.split("/")
            step = _step(parts[1]) if len(parts) >= 3 else None
            if step is not None:
                found[step] = found.get(step, False) or (len(parts) == 3 and parts[2] == MARKER)
        return found

    def complete(self, announce: bool = False) -> list[int]:
        """The steps whose checkpoint exists (its marker is there), oldest first; ``announce``: a line
        for each checkpoint skipped for want of its marker."""
        found = self.checkpoints()
        if announce:
            for step in sorted(s for s, done in found.items() if not done):
                self._log(f"bertflow: skipping {self.uri}/{CHECKPOINTS}/step_{step:08d}: no {MARKER} marker "
                          "(an upload cut short); it is not resumed from")
        return sorted(s for s, done in found.items() if done)

    def inventory(self, step: int) -> dict[str, dict[str, Any]]:
        """The files a checkpoint's marker names (relative to the checkpoint), the marker itself aside."""
        name = f"{CHECKPOINTS}/step_{step:08d}/{MARKER}"
        try:
            files = json.loads(self.loc.read(name)).get("files")
        except FileNotFoundError:
            return {}
        except (ValueError, AttributeError) as err:
            raise UserError(f"{self.uri}/{name}: corrupt checkpoint marker: {err}") from None
        return {k: v for k, v in (files or {}).items() if isinstance(k, str) and inside(k) and k != MARKER}

    # ------------------------------------------------------------ down

    def pull(self, resume: bool, local_rank: int) -> Path:
        """Make the node-local mirror (local rank 0 of each node; the caller then waits at a barrier):
        emptied, then on resume filled with the run's records and its latest complete checkpoint."""
        if local_rank != 0:
            return self.local
        shutil.rmtree(self.local, ignore_errors=True)
        self.local.mkdir(parents=True)
        if not resume:
            return self.local
        for name in (RUN_CONFIG, METRICS_FILE):
            try:
                self.loc.download(name, self.local / name)
            except FileNotFoundError:
                pass
        done = self.complete(announce=True)
        if done:
            self._pull_checkpoint(done[-1])
        return self.local

    def _pull_checkpoint(self, step: int) -> None:
        name = f"{CHECKPOINTS}/step_{step:08d}"
        dest = self.local / name
        for rel in self.inventory(step):
            try:
                self.loc.download(f"{name}/{rel}", dest / rel)
            except FileNotFoundError:
                raise UserError(f"{self.uri}/{name}/{rel}: missing (named by the checkpoint's {MARKER})") from None
        self.loc.download(f"{name}/{MARKER}", dest / MARKER)  # last: the local copy is complete only now
        self._log(f"bertflow: pulled {self.uri}/{name} to {dest}")

    # ------------------------------------------------------------ up

    def push_files(self, tmp: Path, step: int, rank: int) -> dict[str, dict[str, Any]]:
        """Upload this rank's files of the checkpoint written under ``tmp`` (rank 0: also the shared
        ones); their size and SHA-256."""
        from bert_core.checkpoint import owner_rank

        mine = {}
        for f in sorted(tmp.rglob("*")):
            rel = f.relative_to(tmp).as_posix()
            if not f.is_file() or f.name == MARKER or owner_rank(rel) not in ((None, 0) if rank == 0 else (rank,)):
                continue
            self.loc.upload(f"{CHECKPOINTS}/step_{step:08d}/{rel}", f)
            mine[rel] = {"bytes": f.stat().st_size, "sha256": sha256_file(f)}
        return mine

    def retract(self, step: int) -> None:
        """Rank 0, before a checkpoint of ``step`` is (re)written: its old marker goes first, so no
        reader takes a checkpoint while its files are being replaced."""
        self._check_lease()
        self.loc.delete(f"{CHECKPOINTS}/step_{step:08d}/{MARKER}")

    def commit(self, step: int, marker: Path) -> None:
        """Rank 0, after every rank uploaded its files: the marker, last; then the metrics, and
        keep-last."""
        self._check_lease()
        self.loc.upload(f"{CHECKPOINTS}/step_{step:08d}/{MARKER}", marker)

    def push_record(self, local_run: Path, name: str) -> None:
        """A run record (the config, the metrics) uploaded whole."""
        if (local_run / name).is_file():
            self._check_lease()
            self.loc.upload(name, local_run / name)

    def purge(self, keep_last: int) -> None:
        """Delete this run's checkpoints older than the last ``keep_last``: only the objects each one's
        marker names, then the marker (which names what is left to delete until it goes)."""
        for step in self.complete()[:-keep_last] if keep_last > 0 else []:
            prefix = f"{CHECKPOINTS}/step_{step:08d}"
            files = self.inventory(step)
            self._check_lease()
            for rel in files:
                self.loc.delete(f"{prefix}/{rel}")
            self.loc.delete(f"{prefix}/{MARKER}")

    def _check_lease(self) -> None:
        if self.lease is not None:
            self.lease.check()

    def close(self) -> None:
        """The mirror is scratch: removed when the run ends (everything that matters was uploaded)."""
        shutil.rmtree(self.local, ignore_errors=True)


def remote_for(output_dir: str) -> Optional[RemoteRun]:
    """The RemoteRun of an object-store ``output_dir``; None for a local directory."""
    return RemoteRun(output_dir) if is_uri(output_dir) else None


def last_remote_checkpoint(uri: str) -> Optional[str]:
    """The URI of a remote run's latest complete checkpoint (TrainResult), or None."""
    run = RemoteRun(uri)
    done = run.complete()
    return f"{run.uri}/{CHECKPOINTS}/step_{done[-1]:08d}" if done else None


# ---------------------------------------------------------------- reading a finished checkpoint

def checkpoint_uri(uri: str) -> Optional[str]:
    """The checkpoint an export (or evaluation) takes from an object-store URI: the URI itself where it
    holds a COMPLETE marker, else the latest complete checkpoint of the run there; None if none."""
    uri = uri.rstrip("/")
    return uri if location(uri).exists(MARKER) else last_remote_checkpoint(uri)


def _marker_files(ckpt: str) -> dict[str, Any]:
    try:
        files = json.loads(location(ckpt).read(MARKER)).get("files")
    except (ValueError, AttributeError, RecursionError) as err:
        raise UserError(f"{ckpt}/{MARKER}: corrupt checkpoint marker: {err}") from None
    if not isinstance(files, dict) or not files:
        raise UserError(f"{ckpt}/{MARKER}: corrupt checkpoint marker: names no files")
    return files


def remote_identity(uri: str) -> str:
    """bert_core.identity's content identity of the checkpoint at (or latest under) ``uri``, from its
    marker alone: the same value as for a local copy of it, so an export made from one is recognised
    from the other."""
    from contracts.common import stable_hash

    ckpt = checkpoint_uri(uri)
    if ckpt is None:
        return "missing"
    return stable_hash(["checkpoint", ckpt.rpartition("/")[2], _marker_files(ckpt)])


def _fetch_checkpoint(ckpt: str, dest: Path) -> None:
    """Download the checkpoint at URI ``ckpt`` into ``dest``: the files its marker names, each checked
    against its size and SHA-256, the marker last."""
    files, loc = _marker_files(ckpt), location(ckpt)
    for rel, meta in sorted(files.items()):
        if not inside(rel) or rel == MARKER:
            continue
        try:
            loc.download(rel, dest / rel)
        except FileNotFoundError:
            raise UserError(f"{ckpt}/{rel}: missing (named by the checkpoint's {MARKER})") from None
        want = (meta.get("bytes"), meta.get("sha256")) if isinstance(meta, dict) else (None, None)
        if ((dest / rel).stat().st_size, sha256_file(dest / rel)) != want:
            raise UserError(f"{ckpt}/{rel}: changed since the checkpoint's {MARKER} was written "
                            "(size or checksum)")
    loc.download(MARKER, dest / MARKER)


def _checkpoint_of(path: str | Path) -> str:
    ckpt = checkpoint_uri(str(path))
    if ckpt is None:
        raise UserError(f"{str(path).rstrip('/')}: holds no complete checkpoint (no {MARKER} marker)")
    return ckpt


@contextmanager
def local_checkpoint(path: str | Path) -> Iterator[Path]:
    """A local checkpoint directory for ``path``: ``path`` itself where it is local; else the checkpoint
    at (or latest under) the URI, copied to node-local scratch (the files its marker names, each checked
    against its size and SHA-256, the marker last) and removed afterwards."""
    if not is_uri(path):
        yield Path(path)
        return
    ckpt = _checkpoint_of(path)
    work = Path(tempfile.mkdtemp(prefix="bertflow-ckpt-", dir=scratch_root()))
    try:
        dest = work / ckpt.rpartition("/")[2]
        _fetch_checkpoint(ckpt, dest)
        yield dest
    finally:
        shutil.rmtree(work, ignore_errors=True)


def remote_checkpoints(uri: str) -> list[tuple[int, str]]:
    """(step, URI) of every complete checkpoint at ``uri`` (a run prefix), oldest first; the checkpoint
    itself where ``uri`` is one."""
    uri = uri.rstrip("/")
    loc = location(uri)
    if loc.exists(MARKER):
        try:
            step = json.loads(loc.read(MARKER)).get("step")
        except (ValueError, AttributeError, RecursionError) as err:
            raise UserError(f"{uri}/{MARKER}: corrupt checkpoint marker: {err}") from None
        if type(step) is not int:
            step = _step(uri.rpartition("/")[2]) or 0
        return [(step, uri)]
    return [(s, f"{uri}/{CHECKPOINTS}/step_{s:08d}") for s in RemoteRun(uri).complete()]


# Node-local copies of checkpoints read by evaluation jobs, kept for the node's other jobs of the same
# model: at most this many, the least recently used removed first (never one used in the last hour).
MODEL_CACHE_KEEP = 3
_CACHE_PREFIX = "bertflow-model-"


def cached_checkpoint(path: str | Path) -> Path:
    """A local checkpoint directory for ``path``: ``path`` itself where it is local; else a node-local
    copy of the checkpoint at (or latest under) the URI, named by its content identity and shared by
    every job of this node that reads it. Fetched into a temporary directory (each file checked against
    the marker's size and SHA-256) and renamed into place whole, so a copy that exists is complete; one
    whose files no longer match the marker's sizes is fetched again. Loading checks the checksums."""
    if not is_uri(path):
        return Path(path)
    import os

    ckpt = _checkpoint_of(path)
    root = scratch_root()
    final = root / f"{_CACHE_PREFIX}{remote_identity(ckpt)[:24]}" / ckpt.rpartition("/")[2]
    if final.is_dir() and not _intact(final):
        shutil.rmtree(final.parent, ignore_errors=True)
    if not final.is_dir():
        fetched_whole(final, lambda dest: _fetch_checkpoint(ckpt, dest))
    os.utime(final.parent)
    prune_copies(root, _CACHE_PREFIX, final.parent, MODEL_CACHE_KEEP)
    return final


def _intact(local: Path) -> bool:
    try:
        files = json.loads((local / MARKER).read_text(encoding="utf-8")).get("files")
        return isinstance(files, dict) and all(
            (local / rel).is_file() and (local / rel).stat().st_size == meta.get("bytes")
            for rel, meta in files.items() if inside(rel) and rel != MARKER and isinstance(meta, dict))
    except (OSError, ValueError, AttributeError):
        return False
