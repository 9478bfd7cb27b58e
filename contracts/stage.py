"""One output location of one stage: "is this directory mine, am I done, write the record", once.

Every stage (shard, vocab, instances, a training phase, export, an evaluation, a comparison) writes
into one location it owns through a ``StageDir``:

    with sd.lock():                          one writer (contracts.lock)
        sd.refuse_foreign()                  a name no record of ours vouches for: one-line UserError
        state = sd.status(hash, inputs)      done | partial | absent + reason (contracts.common.Status)
        sd.begin(hash, inputs, names)        the old record goes first; the names about to be written
        ... the stage writes its files ...
        sd.commit(files, hash, inputs)       the record, last: what makes the output exist

The record is ``{kind, config_hash, inputs, files, ...}``: what made the output (the config's hash and
the content identity of each input) and the names it vouches for. Between ``begin`` and ``commit`` a
work record names what is being written, so a writer killed half-way leaves names that are still ours
(redone or removed by the next run) and no record that could make the directory look finished.

Written for object-storage semantics (``Storage``): no rename, an object appears only complete, the
record written last is what makes an output exist, and nothing here lists more than one level. Two
implementations: ``LocalDir`` (POSIX: atomic writes, the O_EXCL lock of contracts.lock) and
``LocationDir`` (any location of the storage seam, an ``s3://`` prefix first: the lease of
contracts.lease); ``StageDir.at`` picks by the path.
Imports nothing of the project outside contracts.
"""
from __future__ import annotations

import json
import shutil
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Protocol

from contracts.common import NO_OUTPUT, Status, UserError, json_record, stable_hash, write_json_atomic
from contracts.lock import others, output_lock

RECORD = "stage.json"
WORK = ".stage-work.json"  # the names a writer set out to write, before they exist
SCRATCH = (".tmp-",)  # contracts.common.atomic_path's temporaries: never finished, never a user's


class Storage(Protocol):
    """The few operations a stage needs of its output location."""

    where: str  # how one-line errors name the location

    def names(self) -> list[str]:
        """The entries at the top level of the location (the writer lock excluded)."""

    def exists(self, name: str) -> bool: ...

    def read_json(self, name: str) -> Any:
        """The parsed object, or None where absent or not JSON (never half an object: see write_json)."""

    def write_json(self, name: str, obj: Any) -> None:
        """Appears complete or not at all."""

    def delete(self, name: str) -> None:
        """Remove an entry (a file, or everything under a name); absent is fine."""

    def lock(self) -> AbstractContextManager:
        """Hold the location's one-writer lock for the block."""


class LocalDir:
    """A local (POSIX) directory: atomic writes by temporary file and rename, lock by O_EXCL."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.where = str(self.path)

    def names(self) -> list[str]:
        return sorted(p.name for p in others(self.path))

    def exists(self, name: str) -> bool:
        return (self.path / name).exists()

    def read_json(self, name: str) -> Any:
        try:
            return json.loads((self.path / name).read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError):
            return None

    def write_json(self, name: str, obj: Any) -> None:
        write_json_atomic(self.path / name, obj)

    def delete(self, name: str) -> None:
        p = self.path / name
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink(missing_ok=True)

    def lock(self) -> AbstractContextManager:
        return output_lock(self.path)


class LocationDir:
    """An output location behind the storage seam (contracts.storage): an object-store prefix (``s3://``),
    or a directory. Objects appear only complete; the lock is a lease (conditional create, expiry,
    renewal: contracts.lease) whose loss is checked before every write, so a writer that stalled past its
    expiry and was taken over writes nothing more."""

    def __init__(self, uri: str):
        from contracts.storage import location

        self.loc = location(uri)
        self.where = self.loc.uri
        self._lease = None

    def names(self) -> list[str]:
        from contracts.lease import LOCK_NAME

        return sorted({m.name.split("/", 1)[0] for m in self.loc.list()} - {LOCK_NAME})

    def exists(self, name: str) -> bool:
        return self.loc.exists(name) or any(True for _ in self.loc.list(name))

    def read_json(self, name: str) -> Any:
        try:
            return json.loads(self.loc.read(name))
        except (FileNotFoundError, ValueError, RecursionError):  # as LocalDir: unreadable is no record
            return None

    def write_json(self, name: str, obj: Any) -> None:
        self._check()
        self.loc.write(name, json_record(obj))

    def delete(self, name: str) -> None:
        self._check()
        for m in self.loc.list(name):  # everything under a name (a checkpoint's objects), then the name
            self.loc.delete(m.name)
        self.loc.delete(name)

    def _check(self) -> None:
        if self._lease is not None:
            self._lease.check()

    @contextmanager
    def lock(self) -> Iterator[None]:
        from contracts.lease import acquire

        if self._lease is not None:  # re-entrant within one holder
            yield
            return
        self.loc.check()  # credentials, endpoint, bucket: one line before any work
        self._lease = acquire(self.loc)
        try:
            yield
        finally:
            lease, self._lease = self._lease, None
            lease.release()


def store_for(path: str | Path) -> "Storage":
    """The Storage of a user's path or URI: an object-store prefix or a local directory."""
    from contracts.storage import is_uri

    return LocationDir(str(path)) if is_uri(path) else LocalDir(path)


def summary(names: list[str]) -> str:
    """``first`` or ``first and N more``: how a one-line error names a list of files."""
    return names[0] + (f" and {len(names) - 1} more" if len(names) > 1 else "")


@dataclass
class StageDir:
    """The output location of one stage.

    kind: what the record says made it ("eval:glue", "export", ...); a record of another kind is
      another stage's output. record: the record's name. owns: the fixed names this stage writes (a
      run directory's ``metrics.jsonl``, an evaluation's ``report.md``), its own only once its record or
      work record is there: in a fresh directory a file of that name is the user's. hash_field: the
      record's key holding the config hash (older records name it otherwise). A dataset's manifest is
      a record too (its files are entries with a name); ``in_progress`` adds the names a job's own
      per-part work records vouch for (the instances job's done-records).
    """

    store: Storage
    kind: str
    record: str = RECORD
    owns: frozenset[str] = frozenset()
    hash_field: str = "config_hash"
    scratch: tuple[str, ...] = SCRATCH
    claim_record: bool = False  # the record's name is reserved: ours even where unreadable (a manifest)
    in_progress: Optional[Callable[[], Iterable[str]]] = None  # names a job's own work records vouch for

    @classmethod
    def at(cls, path: str | Path, kind: str, **kw: Any) -> "StageDir":
        """The stage output at a local path or an object-store URI (``s3://bucket/prefix``)."""
        return cls(store_for(path), kind, **kw)

    @property
    def where(self) -> str:
        return self.store.where

    def lock(self) -> AbstractContextManager:
        return self.store.lock()

    # ------------------------------------------------------------ what is ours

    def read_record(self) -> Optional[dict]:
        """The record, or None (absent, or not a JSON object: then it is not ours either)."""
        rec = self.store.read_json(self.record)
        return rec if isinstance(rec, dict) else None

    def _work(self) -> Optional[dict]:
        work = self.store.read_json(WORK)
        return work if isinstance(work, dict) else None

    def owned(self) -> set[str]:
        """The names this stage's own records vouch for: the record and the files it lists, the work
        record and the names it announced, and ``owns`` once either record is there."""
        names: set[str] = {self.record} if self.claim_record else set()
        rec, work = self.read_record(), self._work()
        if rec is not None:
            names.add(self.record)
            if rec.get("kind", self.kind) == self.kind:  # another stage's record vouches for its own files
                names |= set(_strings(rec.get("files")))
        if work is not None:
            names |= {WORK, *_strings(work.get("names"))}
        if rec is not None or work is not None:
            names |= self.owns
        if self.in_progress is not None:
            names |= set(self.in_progress())
        return names

    def foreign(self) -> list[str]:
        """The names no record of ours vouches for, sorted (scratch temporaries aside)."""
        owned = self.owned()
        return [n for n in self.store.names() if n not in owned and not n.startswith(self.scratch)]

    def refuse_foreign(self, what: str = "files this job did not write", prefix: str = "",
                       advice: str = "use a new output dir") -> set[str]:
        """The owned names; a one-line UserError naming the first foreign file if there is one: a stage
        never overwrites or deletes a file its own records do not name (a user's notes, another tool's
        output)."""
        foreign = self.foreign()
        if foreign:
            raise UserError(f"{prefix}{self.where}: not empty and holds {what} ({summary(foreign)}); {advice}")
        return self.owned()

    # ------------------------------------------------------------ am I done

    def status(self, config_hash: str, inputs: Mapping[str, Any] | Callable[[], Mapping[str, Any]]) -> Status:
        """done (the record matches this config and these inputs, and every file it lists is there) |
        partial (a run of this config and inputs was interrupted, or lost files) | absent, with why.
        ``inputs`` may be a function: the inputs' identity (checksums) is then computed only when a
        record of this config is there to compare it with."""
        rec = self.read_record()
        if rec is None:
            return self._interrupted(config_hash, inputs)
        if not self._same(rec, self.hash_field, config_hash):
            return Status("absent", "config differs")
        inputs = _resolve(inputs)
        ident = stable_hash(inputs)
        saved = rec.get("inputs") if isinstance(rec.get("inputs"), dict) else {}
        changed = [k for k in sorted(set(saved) | set(inputs)) if saved.get(k) != inputs.get(k)]
        if changed:
            return Status("absent", f"inputs changed: {', '.join(changed)}", ident)
        files = _strings(rec.get("files"))
        missing = [n for n in files if not self.store.exists(n)]
        if missing:
            return Status("partial", f"{len(missing)} of {len(files)} files missing", ident)
        return Status("done", "complete", ident)

    def _interrupted(self, config_hash: str, inputs: Any) -> Status:
        """No record: partial where a run of this very config and inputs was cut short, else absent."""
        work = self._work()
        if work is not None and self._same(work, "config_hash", config_hash):
            now = _resolve(inputs)
            if work.get("inputs") == now:
                return Status("partial", "an earlier run was interrupted", stable_hash(now))
        return Status("absent", NO_OUTPUT if not self.store.names() else "no stage record")

    def _same(self, rec: dict, field: str, config_hash: str) -> bool:
        # A record without a kind predates the field: it is this stage's (its name says so).
        return rec.get("kind", self.kind) == self.kind and rec.get(field) == config_hash

    # ------------------------------------------------------------ write

    def begin(self, config_hash: str, inputs: Mapping[str, Any], names: Iterable[str] = ()) -> None:
        """About to write: the old record goes first (a half-rewritten directory never looks finished),
        then a work record naming what will be written, with what the old record and a killed earlier
        run named (still ours to overwrite or remove)."""
        before, rec = self._work() or {}, self.read_record() or {}
        # What the old record and a killed earlier run vouched for stays ours once the record is gone.
        announced = sorted(set(_strings(before.get("names"))) | set(_strings(rec.get("files"))) | set(names))
        self.retract()
        self.store.write_json(WORK, {"kind": self.kind, "config_hash": config_hash, "inputs": dict(inputs),
                                     "names": announced})

    @contextmanager
    def writing(self, config_hash: str, inputs: Mapping[str, Any], names: Iterable[str] = ()) -> Iterator[None]:
        """``begin`` for the block; a block that fails (a bad input found late) leaves its work record
        only while it vouches for a name that is there: no directory holding nothing but bookkeeping."""
        self.begin(config_hash, inputs, names)
        try:
            yield
        except BaseException:
            work = self._work()
            if work is not None and not any(self.store.exists(n) for n in _strings(work.get("names"))):
                self.end()
            raise

    def retract(self) -> None:
        """Remove the record: from here the output no longer exists (before any file is rewritten)."""
        self.store.delete(self.record)

    def end(self) -> None:
        """The output's own record (a manifest) is written: the work record has done its job."""
        self.store.delete(WORK)

    def commit(self, files: Iterable[str], config_hash: str, inputs: Mapping[str, Any], **extra: Any) -> dict:
        """Write the record, last: from here the output exists. ``extra`` keys go into the record too."""
        rec = {**extra, "kind": self.kind, self.hash_field: config_hash, "inputs": dict(inputs),
               "files": sorted(set(files))}
        self.store.write_json(self.record, rec)
        self.end()
        return rec

    def present(self, names: Iterable[str]) -> list[str]:
        """Those of ``names`` that exist now (what a stage with optional outputs commits)."""
        return sorted(n for n in set(names) if self.store.exists(n))

    def remove_owned(self, keep: Iterable[str] = ()) -> None:
        """Delete what our records vouch for (a stale output), record first; never anything else."""
        owned = self.owned() - set(keep)
        for name in [self.record] + sorted(owned - {self.record, WORK}) + [WORK]:
            if name in owned:
                self.store.delete(name)


def _resolve(inputs: Any) -> dict:
    return dict(inputs() if callable(inputs) else inputs)


def _strings(value: Any) -> list[str]:
    """The names of a record's list (a hand-edited record with other things in it vouches for nothing)."""
    if not isinstance(value, list):
        return []
    names = [v.get("name") if isinstance(v, dict) else v for v in value]  # a manifest's entries: {"name", ...}
    # Top-level names only: a record naming "..", "." or a path must never make us delete outside.
    return [v for v in names if isinstance(v, str) and v not in ("", ".", "..") and "/" not in v and "\\" not in v]
