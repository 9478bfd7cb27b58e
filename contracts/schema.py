"""Every on-disk format of bertflow, defined once: Parquet schemas and the dataset manifest.

A dataset directory holds Parquet files plus ``manifest.json``, written last. The manifest carries
the producing config and its hash, the vocab hash (downstream of the vocab), one entry per file with
its row count and SHA-256, totals and statistics. Readers validate files against it.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field

from contracts.common import UserError, json_record, sha256_file, stable_hash, write_json_atomic
from contracts.storage import is_uri, location

SCHEMA_VERSION = 1
MANIFEST_NAME = "manifest.json"

# documents: one row per document; assigned to a shard by a stable hash of doc_id.
DOCUMENTS_SCHEMA = pa.schema(
    [
        pa.field("doc_id", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("sentences", pa.list_(pa.string()), nullable=False),
    ]
)


def token_type(vocab_size: int) -> pa.DataType:
    """Compact integer type for token ids: uint16 while the vocab fits, else uint32."""
    return pa.uint16() if vocab_size <= 65536 else pa.uint32()


def instances_schema(vocab_size: int) -> pa.Schema:
    """Static MLM/NSP instances; no padding is stored.

    input_ids        [CLS] A [SEP] B [SEP] with masking applied (what the model sees)
    segment_a_len    tokens of [CLS] A [SEP]; token_type_ids = 0 for those, 1 after
    masked_positions sorted, unique positions into input_ids
    masked_ids       the original token ids at masked_positions (the MLM labels)
    nsp_label        0 = B follows A (or in order for SOP), 1 = random next (or swapped); -1 = no task
    """
    tok = token_type(vocab_size)
    return pa.schema(
        [
            pa.field("input_ids", pa.list_(tok), nullable=False),
            pa.field("segment_a_len", pa.uint16(), nullable=False),
            pa.field("masked_positions", pa.list_(pa.uint16()), nullable=False),
            pa.field("masked_ids", pa.list_(tok), nullable=False),
            pa.field("nsp_label", pa.int8(), nullable=False),
        ]
    )


# How errors name each kind of dataset.
KIND_NAMES = {"documents": "document shards", "vocab": "a vocab dataset", "instances": "instances"}


class FileEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="file name relative to the dataset directory")
    rows: int
    bytes: int
    sha256: str
    meta: dict[str, Any] = Field(default_factory=dict, description="e.g. shard index, length bin")


class Manifest(BaseModel):
    """Written last into every dataset directory; a step whose manifest matches its config is skipped."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = SCHEMA_VERSION
    kind: Literal["documents", "vocab", "instances", "checkpoint", "eval"]
    config: dict[str, Any]
    config_hash: str
    vocab_hash: str | None = None
    files: list[FileEntry] = Field(default_factory=list)
    totals: dict[str, Any] = Field(default_factory=dict)
    stats: dict[str, Any] = Field(default_factory=dict)

    def write(self, directory: str | Path) -> Path | str:
        """Write the manifest (last: it is what makes the dataset exist) into a directory or an
        object-store prefix; the same bytes either way."""
        if is_uri(directory):
            location(str(directory)).write(MANIFEST_NAME, json_record(self.model_dump(mode="json")))
            return f"{str(directory).rstrip('/')}/{MANIFEST_NAME}"
        path = Path(directory) / MANIFEST_NAME
        write_json_atomic(path, self.model_dump(mode="json"))
        return path

    @classmethod
    def read(cls, directory: str | Path, kind: str | None = None) -> "Manifest":
        """The manifest of a dataset directory; with ``kind``, also check that the directory exists and
        holds that kind of dataset (one-line UserError otherwise)."""
        what = KIND_NAMES.get(kind or "", kind)
        if is_uri(directory):  # an object store: the manifest is the only thing that makes a dataset exist
            d, path = str(directory).rstrip("/"), f"{str(directory).rstrip('/')}/{MANIFEST_NAME}"
            try:
                text = location(d).read(MANIFEST_NAME)
            except FileNotFoundError:
                raise UserError(f"{path}: no manifest (not a finished bertflow dataset)") from None
        else:
            d = Path(directory)
            if kind is not None and not d.is_dir():
                raise UserError(f"{d}: directory not found (expected {what})")
            path = d / MANIFEST_NAME
            if not path.is_file():
                raise UserError(f"{path}: no manifest (not a finished bertflow dataset directory)")
            text = path.read_bytes()
        try:
            manifest = cls.model_validate(json.loads(text.decode("utf-8")))
        except RecursionError:
            raise UserError(f"{path}: corrupt manifest: JSON nested too deeply") from None
        except (ValueError, TypeError) as err:  # ValueError: not UTF-8, not JSON, not a manifest
            raise UserError(f"{path}: corrupt manifest: {str(err).splitlines()[0]}") from None
        if kind is not None and manifest.kind != kind:
            raise UserError(f"{d}: manifest is of kind {manifest.kind!r}, expected {what}")
        return manifest

    def identity(self) -> str:
        """Content identity of the dataset: what it was made by and the checksum of every file, not
        where it lies (a copied or moved dataset keeps it; a remade one with other content does not)."""
        files = sorted((f.name, f.sha256) for f in self.files)
        return stable_hash([self.kind, self.config_hash, self.vocab_hash, files])

    def verify_files(self, directory: str | Path, deep: bool = True) -> list[str]:
        """Return a list of problems ('<file>: missing', '<file>: checksum mismatch'); empty if sound.
        On an object store (``s3://``) one listing gives every object's size, and ``deep`` checks no
        more: an object appears only complete, the store verifies each upload, and hashing would
        download the whole dataset."""
        if is_uri(directory):
            return self._verify_objects(str(directory).rstrip("/"))
        problems = []
        for entry in self.files:
            p = Path(directory) / entry.name
            if not p.is_file():
                problems.append(f"{p}: missing")
            elif p.stat().st_size != entry.bytes:
                problems.append(f"{p}: size {p.stat().st_size} != {entry.bytes} in manifest")
            elif deep and sha256_file(p) != entry.sha256:
                problems.append(f"{p}: checksum mismatch (corrupt or modified)")
        return problems


    def _verify_objects(self, uri: str) -> list[str]:
        sizes = {m.name: m.size for m in location(uri).list()}
        problems = []
        for entry in self.files:
            size = sizes.get(entry.name)
            if size is None:
                problems.append(f"{uri}/{entry.name}: missing")
            elif size != entry.bytes:
                problems.append(f"{uri}/{entry.name}: size {size} != {entry.bytes} in manifest")
        return problems


def file_entry(path: str | Path, rows: int, **meta: Any) -> FileEntry:
    p = Path(path)
    return FileEntry(name=p.name, rows=rows, bytes=p.stat().st_size, sha256=sha256_file(p), meta=meta)
