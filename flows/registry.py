"""The model registry: every model a run produced, with its lineage, and which one is promoted.

    reg = Registry("runs/registry")                  # or "s3://bucket/registry": the storage seam
    m = reg.register(export="s3://bucket/export/abc", parent=reg.promoted_id(), snapshots=["2026-12-01"],
                     config_hashes={"train": "..."}, metrics={"heldout_loss_new": 2.31}, gate=decision)
    reg.promote(m.id, expect=parent)                 # compare-and-swap: refused if the promoted model changed
    reg.rollback()                                   # back to the model promoted before the current one

Layout under the root (a local directory or an object-store prefix):

    models/<id>.json   one immutable entry per model, written once by a conditional create (never
                       overwritten): id, parent, snapshots, config hashes, metrics, gate decision, created
                       time, the export's location, and a checksum of all of it
    promoted.json      the pointer: the promoted model, the stack of earlier promotions (what rollback
                       returns to) and the history of every promotion and rollback; written first by a
                       conditional create, then only by compare-and-swap on the version read (If-Match),
                       so of two promoters racing exactly one wins and the other is told so in one line

An entry or pointer that does not parse, fails its schema or its checksum (edited by hand, truncated) is
a one-line UserError naming the object, never skipped. Nothing here deletes anything.
"""
from __future__ import annotations

import getpass
import json
import os
import re
import secrets
import socket
from datetime import datetime, timezone
from typing import Any, Literal, Mapping, Optional, Sequence, Union

from pydantic import Field, ValidationError, model_validator

from contracts.common import StrictModel, UserError, format_validation_error, json_record, stable_hash
from contracts.storage import Location, location
from flows.gate import GateDecision

FORMAT = 1
MODELS = "models"
POINTER = "promoted.json"
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$"
ANY = object()  # promote/rollback ``expect``: whatever is promoted now


class ModelEntry(StrictModel):
    """One registered model (immutable once written)."""
    empty_strings = True  # a record, not a config: "" means "none given"

    format: int = FORMAT
    id: str = Field(..., pattern=ID_PATTERN)
    parent: Optional[str] = Field(None, pattern=ID_PATTERN, description="the model it continued from")
    snapshots: list[str] = Field(default_factory=list, description="data snapshots it was trained on")
    config_hashes: dict[str, str] = Field(default_factory=dict, description="stage -> config hash")
    metrics: dict[str, Optional[float]] = Field(
        default_factory=dict, description="evaluation metrics (a non-finite value is stored as null)")
    gate: Optional[GateDecision] = Field(None, description="the gate's decision when it was registered")
    created: str = Field(..., description="UTC time of registration, ISO 8601")
    export: str = Field(..., min_length=1, description="where its Hugging Face export lies (path or URI)")
    info: dict[str, Any] = Field(default_factory=dict, description="anything else the flow records (run ids...)")


class Event(StrictModel):
    empty_strings = True  # a record, not a config: "" means "none given"
    action: Literal["promote", "rollback"]
    model: str
    previous: Optional[str]
    at: str
    by: str
    reason: str = ""


class Pointer(StrictModel):
    """promoted.json: the promoted model, the promotions under it, and every change."""
    empty_strings = True  # a record, not a config: "" means "none given"

    format: int = FORMAT
    promoted: str = Field(..., pattern=ID_PATTERN)
    stack: list[str] = Field(..., min_length=1, description="promoted models, oldest first; the last is current")
    history: list[Event] = Field(default_factory=list)

    @model_validator(mode="after")
    def _top_is_promoted(self) -> "Pointer":
        if self.stack[-1] != self.promoted:
            raise ValueError(f"promoted {self.promoted!r} is not the top of the stack ({self.stack[-1]!r})")
        return self


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _who() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()} pid {os.getpid()}"


def _dump(model: StrictModel) -> bytes:
    body = model.model_dump(mode="json")
    body["checksum"] = stable_hash(body)
    return json_record(body)


def _finite(metrics: Mapping[str, Any]) -> dict[str, Optional[float]]:
    out: dict[str, Optional[float]] = {}
    for k, v in metrics.items():
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise UserError(f"metric {k!r}: not a number ({v!r})")
        out[str(k)] = None if v is None or v != v or v in (float("inf"), float("-inf")) else float(v)
    return out


class Registry:
    """A model registry under ``root`` (a path or URI, or a Location)."""

    def __init__(self, root: Union[str, os.PathLike, Location]):
        self.loc = root if isinstance(root, Location) else location(root)

    def __str__(self) -> str:
        return self.loc.uri

    def _where(self, name: str) -> str:
        return f"{self.loc.uri.rstrip('/')}/{name}"

    def _parse(self, name: str, data: bytes, model: type[StrictModel], what: str):
        where = self._where(name)
        try:
            body = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as err:
            raise UserError(f"{where}: corrupt {what}: not JSON ({str(err).splitlines()[0]})") from None
        except RecursionError:
            raise UserError(f"{where}: corrupt {what}: JSON nested too deeply") from None
        if not isinstance(body, dict):
            raise UserError(f"{where}: corrupt {what}: not a JSON object")
        checksum = body.pop("checksum", None)
        if checksum != stable_hash(body):
            why = "no checksum" if checksum is None else "checksum mismatch"
            raise UserError(f"{where}: {what} edited or corrupt ({why}); restore it from a backup or the "
                            "history of the bucket (registry objects are written once by bertflow)")
        if body.get("format") != FORMAT:
            raise UserError(f"{where}: {what} of format {body.get('format')!r}; this bertflow reads format {FORMAT}")
        try:
            return model.model_validate(body)
        except ValidationError as err:
            raise UserError(format_validation_error(err, f"{where}: corrupt {what}")) from None

    # ------------------------------------------------------------------ entries

    def register(self, *, export: str, parent: Optional[str] = None, snapshots: Sequence[str] = (),
                 config_hashes: Optional[Mapping[str, str]] = None, metrics: Optional[Mapping[str, Any]] = None,
                 gate: Optional[GateDecision] = None, info: Optional[Mapping[str, Any]] = None,
                 model_id: Optional[str] = None) -> ModelEntry:
        """Write one immutable entry and return it. ``parent`` must be registered here; ``model_id``
        defaults to ``<UTC time>-<6 hex>`` (sortable by registration time). Refuses an id taken."""
        created = _now()
        if model_id is None:
            model_id = f"{created[:19].replace('-', '').replace(':', '')}Z-{secrets.token_hex(3)}"
        if not re.match(ID_PATTERN, model_id):
            raise UserError(f"model id {model_id!r}: use letters, digits, '.', '_', '-' (at most 100)")
        if parent is not None:
            parent = self.get(parent).id  # lineage: a registered, intact model (a prefix stored as its full id)
        try:
            entry = ModelEntry(id=model_id, parent=parent, snapshots=list(snapshots),
                               config_hashes=dict(config_hashes or {}), metrics=_finite(metrics or {}), gate=gate,
                               created=created, export=str(export), info=dict(info or {}))
        except ValidationError as err:
            raise UserError(format_validation_error(err, f"model {model_id}")) from None
        name = f"{MODELS}/{model_id}.json"
        if self.loc.create(name, _dump(entry)) is None:
            raise UserError(f"{self._where(name)}: model {model_id} is already registered (entries are never "
                            "overwritten)")
        return entry

    def get(self, model_id: str) -> ModelEntry:
        """The entry of ``model_id`` (exact id, or a prefix matching exactly one)."""
        name = f"{MODELS}/{model_id}.json"
        if not re.match(ID_PATTERN, model_id):
            raise UserError(f"model id {model_id!r}: not a valid id")
        try:
            data = self.loc.read(name)
        except FileNotFoundError:
            matches = [m for m in self._names() if m.startswith(model_id)]
            if len(matches) == 1:
                return self.get(matches[0])
            if matches:
                raise UserError(f"model {model_id!r} in {self}: ambiguous, matches {', '.join(matches[:5])}") from None
            raise UserError(f"model {model_id!r}: not registered in {self}") from None
        entry = self._parse(name, data, ModelEntry, "registry entry")
        if entry.id != model_id:
            raise UserError(f"{self._where(name)}: corrupt registry entry: holds id {entry.id!r}")
        return entry

    def _names(self) -> list[str]:
        ids = []
        for meta in self.loc.list(MODELS):
            rel = meta.name[len(MODELS) + 1:]
            if "/" in rel or not rel.endswith(".json") or not re.match(ID_PATTERN, rel[:-5]):
                raise UserError(f"{self._where(meta.name)}: not a registry entry (only models/<id>.json belong "
                                "there); move it away")
            ids.append(rel[:-5])
        return ids

    def list(self) -> list[ModelEntry]:
        """Every entry, oldest first (by created time, then id)."""
        return sorted((self.get(i) for i in self._names()), key=lambda e: (e.created, e.id))

    def lineage(self, model_id: str) -> list[ModelEntry]:
        """``model_id`` and its ancestors: [model, parent, grandparent, ...]."""
        chain = [self.get(model_id)]
        while chain[-1].parent is not None:
            if any(e.id == chain[-1].parent for e in chain):
                raise UserError(f"model {model_id}: lineage loops at {chain[-1].parent}")
            chain.append(self.get(chain[-1].parent))
        return chain

    # ------------------------------------------------------------------ the promoted pointer

    def pointer(self) -> tuple[Optional[Pointer], Optional[str]]:
        """(the pointer, its version tag), or (None, None) before the first promotion."""
        for _ in range(3):
            meta = self.loc.head(POINTER)
            if meta is None:
                return None, None
            try:
                data = self.loc.read(POINTER)
            except FileNotFoundError:
                continue
            if self.loc.head(POINTER) != meta:  # replaced between head and read: look again
                continue
            return self._parse(POINTER, data, Pointer, "promoted pointer"), meta.etag
        raise UserError(f"{self._where(POINTER)}: changing while read; retry")

    def promoted_id(self) -> Optional[str]:
        ptr, _ = self.pointer()
        return ptr.promoted if ptr else None

    def promoted(self) -> Optional[ModelEntry]:
        ptr, _ = self.pointer()
        return self.get(ptr.promoted) if ptr else None

    def _swap(self, ptr: Pointer, etag: Optional[str], before: Optional[str], what: str) -> Pointer:
        data = _dump(ptr)
        ok = self.loc.create(POINTER, data) if etag is None else self.loc.replace_if(POINTER, data, etag)
        if ok is None:
            now, _ = self.pointer()
            raise UserError(f"{self._where(POINTER)}: {what} refused: the promoted model changed meanwhile "
                            f"(from {before or 'none'} to {now.promoted if now else 'none'}, by another "
                            "promotion or rollback); look again and retry")
        return ptr

    def _check_expect(self, current: Optional[str], expect: Any, what: str) -> None:
        if expect is not ANY and expect != current:
            raise UserError(f"{self._where(POINTER)}: {what} refused: expected {expect or 'no'} promoted model, "
                            f"found {current or 'none'}")

    def promote(self, model_id: str, *, reason: str = "", force: bool = False, expect: Any = ANY) -> Pointer:
        """Make ``model_id`` the promoted model. Refused (UserError) when its gate decision was "keep"
        unless ``force``; when it is promoted already; when ``expect`` is given and another model (or
        none: ``expect=None``) is promoted; and when another promoter changes the pointer between our read
        and our write (compare-and-swap)."""
        entry = self.get(model_id)
        ptr, etag = self.pointer()
        current = ptr.promoted if ptr else None
        self._check_expect(current, expect, f"promoting {entry.id}")
        if current == entry.id:
            raise UserError(f"model {entry.id} is already the promoted model")
        if entry.gate is not None and not entry.gate.promote and not force:
            raise UserError(f"model {entry.id}: its gate decided keep ({entry.gate.reason}); pass --force "
                            "(force=True) to promote it anyway")
        if current is not None:
            self.get(current)  # the pointer names an intact entry
        why = reason or (f"manual override of the gate ({entry.gate.reason})"
                         if entry.gate is not None and not entry.gate.promote else "")
        event = Event(action="promote", model=entry.id, previous=current, at=_now(), by=_who(), reason=why)
        new = Pointer(promoted=entry.id, stack=[*(ptr.stack if ptr else []), entry.id],
                      history=[*(ptr.history if ptr else []), event])
        return self._swap(new, etag, current, f"promoting {entry.id}")

    def rollback(self, *, reason: str = "", expect: Any = ANY) -> Pointer:
        """Return to the model promoted before the current one (the current leaves the stack)."""
        ptr, etag = self.pointer()
        if ptr is None:
            raise UserError(f"{self}: nothing to roll back: no model was ever promoted")
        self._check_expect(ptr.promoted, expect, "rollback")
        if len(ptr.stack) < 2:
            raise UserError(f"{self}: nothing to roll back to: {ptr.promoted} is the only model ever promoted "
                            "(or every earlier one was rolled back)")
        target = self.get(ptr.stack[-2]).id
        event = Event(action="rollback", model=target, previous=ptr.promoted, at=_now(), by=_who(), reason=reason)
        new = Pointer(promoted=target, stack=ptr.stack[:-1], history=[*ptr.history, event])
        return self._swap(new, etag, ptr.promoted, "rollback")


def registry_markdown(reg: Registry) -> str:
    """The registry as a Markdown table, newest first (for a Prefect artifact or a report)."""
    entries, promoted = reg.list(), reg.promoted_id()
    rows = ["| model | parent | created | snapshots | gate | metrics | export |", "|---|---|---|---|---|---|---|"]
    for e in reversed(entries):
        metrics = ", ".join(f"{k} {'null' if v is None else f'{v:.4f}'}" for k, v in sorted(e.metrics.items()))
        gate = f"{e.gate.decision}: {e.gate.reason}" if e.gate else "—"
        rows.append(f"| {'**' + e.id + '** (promoted)' if e.id == promoted else e.id} | {e.parent or '—'} | "
                    f"{e.created[:19].replace('T', ' ')} | {', '.join(e.snapshots) or '—'} | {gate} | "
                    f"{metrics or '—'} | {e.export} |")
    return "\n".join(rows) + "\n"
