"""The three steps of the shard job as plain functions (the job runs each as Ray tasks; tests call them
directly). All state passes through files under ``<output_dir>/.work``:

1. partition_units   read some input units, route each document to ``shard_of(doc_id)``, write bucket
                     files per shard (and, for dedup, (content_hash, doc_id) per hash bucket); memory
                     is bounded by FLUSH_BYTES of buffered text, not by the input.
2. find_duplicates   per hash bucket: every document whose exact content also appears under a smaller
                     doc_id is listed for dropping. Routing by content hash makes this global: copies
                     in different shards meet in the same bucket, so dedup is corpus-wide, while shard
                     assignment stays by doc_id as the contract says.
3. merge_shard       one output shard: its buckets, sorted by doc_id (so the bytes do not depend on how
                     many workers wrote the buckets), duplicates dropped, written atomically.

``work`` and ``output_dir`` may be object-store prefixes (``s3://``): then every intermediate file is an
object under ``<output_dir>/.work`` (written on node-local scratch and uploaded, read back whole: each
is at most a flush's worth), so workers on different nodes share them as on a shared file system.
"""
from __future__ import annotations

import hashlib
import json
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from contracts.common import atomic_path, sha256_file
from contracts.schema import DOCUMENTS_SCHEMA
from contracts.storage import is_uri, location
from data_jobs.job_output import publish, staged
from data_jobs.readers import ReadStats, Unit, read_unit

FLUSH_BYTES = 32 << 20  # text buffered per reading task before its buckets go to disk
SHARD_NAME = "shard-{:05d}.parquet"
BUCKET_SCHEMA = pa.schema(
    [("doc_id", pa.string()), ("source", pa.string()), ("sentences", pa.list_(pa.string())),
     ("content_hash", pa.binary(16))]
)
HASH_SCHEMA = pa.schema([("content_hash", pa.binary(16)), ("doc_id", pa.string()), ("shard", pa.int32())])
DROP_SCHEMA = pa.schema([("doc_id", pa.string()), ("shard", pa.int32()), ("reason", pa.string())])
SEEN_BY = {"content": pa.schema([("content_hash", pa.binary(16))]), "id": pa.schema([("doc_id", pa.string())])}
SEEN_EARLIER = "seen_earlier"  # the reason a document an earlier snapshot holds is not kept again


def needs_hashes(config) -> bool:
    """Whether documents' content hashes are routed to hash buckets: for dedup, and to meet an earlier
    snapshot's documents by content."""
    return config.dedup or bool(config.earlier and config.seen_by == "content")


def _h64(data: bytes) -> int:
    return int.from_bytes(hashlib.sha256(data).digest()[:8], "big")


def shard_of(doc_id: str, num_shards: int) -> int:
    """Stable shard of a document: SHA-256 of its id (Python's hash() changes between processes)."""
    return _h64(doc_id.encode("utf-8")) % num_shards


def content_hash(sentences: list[str]) -> bytes:
    """128-bit digest of a document's text (sentences never contain a newline, so the join is exact)."""
    return hashlib.sha256("\n".join(sentences).encode("utf-8")).digest()[:16]


def _write(table: pa.Table, work: str, rel: str, compression: str = "lz4") -> None:
    """An intermediate file ``work/rel``: atomically in place, or uploaded whole to an object store."""
    if not is_uri(work):
        with atomic_path(Path(work, rel)) as tmp:
            pq.write_table(table, tmp, compression=compression)
        return
    with staged(work) as scratch:
        pq.write_table(table, scratch / "t.parquet", compression=compression)
        location(work).upload(rel, scratch / "t.parquet")


def _sources(work: str, subdir: str) -> list:
    """The Parquet files under ``work/subdir``, sorted by name (objects read whole into memory)."""
    if is_uri(work):
        loc = location(work)
        return [pa.BufferReader(loc.read(m.name)) for m in loc.list(subdir) if m.name.endswith(".parquet")]
    d = Path(work, subdir)
    return sorted(d.glob("*.parquet")) if d.is_dir() else []


def write_json(work: str, rel: str, obj: Any) -> None:
    if is_uri(work):
        location(work).write(rel, json.dumps(obj).encode("utf-8"))
        return
    with atomic_path(Path(work, rel)) as tmp:
        tmp.write_text(json.dumps(obj), encoding="utf-8")


def _read_json(work: str, rel: str) -> Any:
    try:
        return json.loads(location(work).read(rel) if is_uri(work) else Path(work, rel).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def partition_units(units: list[Unit], config, task: int, work: str) -> dict[str, Any]:
    """Step 1 for one reading task. Returns its ReadStats as a dict (plus counts per shard)."""
    n = config.num_shards
    stats = ReadStats(strict=config.on_bad_input == "fail")
    buckets: list[list[tuple]] = [[] for _ in range(n)]
    buffered, flushes = 0, 0

    def flush() -> None:
        nonlocal buffered, flushes
        name = f"t{task:05d}-{flushes:05d}.parquet"
        hash_cols: list[list] = [[], [], []]
        for s, rows in enumerate(buckets):
            if not rows:
                continue
            cols = list(zip(*rows))
            _write(pa.table(cols, schema=BUCKET_SCHEMA), work, f"parts/{s:05d}/{name}")
            hash_cols[0] += cols[3]
            hash_cols[1] += cols[0]
            hash_cols[2] += [s] * len(rows)
            rows.clear()
        if needs_hashes(config) and hash_cols[0]:
            # Route (content_hash, doc_id, shard) by content hash: one file per hash bucket touched.
            hashes = pa.table(hash_cols, schema=HASH_SCHEMA)
            bucket_of = np.array([_h64(h) % n for h in hash_cols[0]], dtype=np.int64)
            order = np.argsort(bucket_of, kind="stable")
            hashes, bucket_of = hashes.take(pa.array(order)), bucket_of[order]
            starts = np.flatnonzero(np.r_[True, bucket_of[1:] != bucket_of[:-1]])
            for lo, hi in zip(starts, np.r_[starts[1:], len(bucket_of)]):
                k = int(bucket_of[lo])
                _write(hashes.slice(lo, hi - lo), work, f"hashes/{k:05d}/{name}")
        buffered, flushes = 0, flushes + 1

    for unit in units:
        with local_unit(unit) as here:  # an object: read from a scratch copy, streamed as a file
            for doc in read_unit(here, config, stats):
                buckets[shard_of(doc.doc_id, n)].append(
                    (doc.doc_id, doc.source, doc.sentences, content_hash(doc.sentences))
                )
                buffered += sum(len(s) for s in doc.sentences)
                if buffered >= FLUSH_BYTES:
                    flush()
    flush()
    return {"kept": stats.kept, "files_read": stats.files_read, "dropped": dict(stats.dropped),
            "files_skipped": dict(stats.files_skipped), "problems": dict(stats.problems)}


@contextmanager
def local_unit(unit: Unit) -> Iterator[Unit]:
    """``unit`` itself, or for an object (``s3://``) a node-local scratch copy under the same file name
    (so its suffix still tells the format), removed afterwards."""
    if not is_uri(unit.path):
        yield unit
        return
    parent, name = unit.path.rsplit("/", 1)
    with staged(unit.path) as scratch:
        location(parent).download(name, scratch / name)
        yield Unit(str(scratch / name), unit.source, unit.fmt)


def _read_dir(work: str, subdir: str, schema: pa.Schema) -> pa.Table:
    files = _sources(work, subdir)
    if not files:
        return schema.empty_table()
    return pa.concat_tables([pq.read_table(f, schema=schema) for f in files]).combine_chunks()


def collect_seen(path: str, expect: tuple[int, str], config, work: str, tag: str) -> int:
    """Step 1b for one shard file of an earlier snapshot's documents: each document's key (``seen_by``:
    its content hash, or its doc_id), routed where this job's own documents meet it: by hash bucket
    (``find_duplicates``) or by output shard (``merge_shard``). Returns how many documents it read."""
    from data_jobs.job_output import fetched

    n = config.num_shards
    with fetched(path, expect) as local:  # an object: a checked node-local copy
        table = pq.read_table(local, columns=["doc_id", "sentences"])
    if config.seen_by == "id":
        keys = table.column("doc_id").to_pylist()
        route = [shard_of(k, n) for k in keys]
    else:
        keys = [content_hash(s) for s in table.column("sentences").to_pylist()]
        route = [_h64(k) % n for k in keys]
    schema = SEEN_BY[config.seen_by]
    by_place: dict[int, list] = {}
    for k, place in zip(keys, route):
        by_place.setdefault(place, []).append(k)
    for place, vals in sorted(by_place.items()):
        _write(pa.table([pa.array(vals, schema.field(0).type)], schema=schema), work, f"seen/{place:05d}/{tag}.parquet")
    return table.num_rows


def _seen(work: str, place: int, seen_by: str) -> pa.Array:
    return _read_dir(work, f"seen/{place:05d}", SEEN_BY[seen_by]).column(0).combine_chunks()


def find_duplicates(bucket: int, work: str, dedup: bool = True, seen: bool = False) -> int:
    """Step 2 for one hash bucket: write (doc_id, shard, reason) of every document to drop: with
    ``dedup`` every non-first copy ("duplicate"); with ``seen`` every document whose content an earlier
    snapshot holds (``seen_earlier``, all its copies). Returns their count."""
    table = _read_dir(work, f"hashes/{bucket:05d}", HASH_SCHEMA)
    out = f"drops/{bucket:05d}.parquet"
    if table.num_rows == 0:
        _write(DROP_SCHEMA.empty_table(), work, out)
        return 0
    table = table.take(pc.sort_indices(table, [("content_hash", "ascending"), ("doc_id", "ascending")]))
    col = table.column("content_hash").combine_chunks()
    digests = np.frombuffer(col.buffers()[1], dtype="S16")[col.offset : col.offset + len(col)]
    ids = np.array(table.column("doc_id").to_pylist(), dtype=object)
    idx = np.arange(len(digests))
    new_group = np.ones(len(digests), dtype=bool)
    new_group[1:] = digests[1:] != digests[:-1]
    first = np.maximum.accumulate(np.where(new_group, idx, 0))
    # Keep the smallest doc_id of each content group: a choice no worker count can change. Rows that
    # repeat the kept doc_id itself are left to merge_shard, which sees them side by side.
    drop = ~new_group & (ids != ids[first]) if dedup else np.zeros(len(digests), dtype=bool)
    earlier = np.zeros(len(digests), dtype=bool)
    if seen:
        known = _seen(work, bucket, "content")
        if len(known):
            have = np.frombuffer(known.buffers()[1], dtype="S16")[known.offset : known.offset + len(known)]
            earlier = np.isin(digests, have)
    reason = np.where(earlier, SEEN_EARLIER, "duplicate")
    mask = pa.array(drop | earlier)
    _write(pa.table({"doc_id": table.column("doc_id").filter(mask), "shard": table.column("shard").filter(mask),
                     "reason": pa.array(reason[drop | earlier].tolist(), pa.string())}, schema=DROP_SCHEMA), work, out)
    return int((drop | earlier).sum())


def _drop_list(work: str, shard: int) -> dict[str, str]:
    """doc_id -> why it is dropped, for the documents of ``shard`` that ``find_duplicates`` listed."""
    out: dict[str, str] = {}
    for f in _sources(work, "drops"):
        t = pq.read_table(f, filters=[("shard", "=", shard)], columns=["doc_id", "reason"])
        out.update(zip(t.column("doc_id").to_pylist(), t.column("reason").to_pylist()))
    return out


def merge_shard(shard: int, config, work: str, config_hash: str) -> dict[str, Any]:
    """Step 3 for one output shard; returns its file entry fields and drop counts."""
    table = _read_dir(work, f"parts/{shard:05d}", BUCKET_SCHEMA)
    table = table.take(pc.sort_indices(table, [("doc_id", "ascending"), ("content_hash", "ascending")]))
    ids = table.column("doc_id").to_pylist()
    hashes = table.column("content_hash").to_pylist()
    drop_ids = _drop_list(work, shard) if needs_hashes(config) else {}
    seen_ids = set(_seen(work, shard, "id").to_pylist()) if config.earlier and config.seen_by == "id" else set()
    dropped: Counter = Counter()
    keep = []
    for i, doc_id in enumerate(ids):
        if i and doc_id == ids[i - 1]:
            # doc_ids must be unique; the same id twice is a repeated input or a repeated id column value.
            dropped["duplicate" if config.dedup and hashes[i] == hashes[i - 1] else "duplicate_doc_id"] += 1
        elif doc_id in drop_ids:
            dropped[drop_ids[doc_id]] += 1
        elif doc_id in seen_ids:
            dropped[SEEN_EARLIER] += 1
        else:
            keep.append(i)
    docs = table.take(pa.array(keep, pa.int64())).select(["doc_id", "source", "sentences"])
    docs = docs.cast(DOCUMENTS_SCHEMA).combine_chunks()
    with staged(config.output_dir) as d:  # in place; or on node-local scratch, then uploaded
        path = d / SHARD_NAME.format(shard)
        with atomic_path(path) as tmp:
            pq.write_table(docs, tmp, compression="zstd")
        size, digest = path.stat().st_size, sha256_file(path)
        publish(config.output_dir, [path])
    sentences = pc.list_value_length(docs.column("sentences"))
    result = {
        "shard": shard, "name": path.name, "rows": docs.num_rows, "bytes": size,
        "sha256": digest, "dropped": dict(dropped),
        "sentences": int(pc.sum(sentences).as_py() or 0),
        "bytes_of_text": int(pc.sum(pc.binary_length(pc.list_flatten(docs.column("sentences")))).as_py() or 0),
    }
    # A done-record per shard lets a rerun after a crash skip shards that were finished and intact.
    write_json(work, f"done/{shard:05d}.json", {**result, "config_hash": config_hash})
    return result


def done_record(shard: int, config, work: str, config_hash: str) -> dict[str, Any] | None:
    """The result of an earlier merge_shard whose file is still there, unchanged (on an object store:
    of the recorded size, see Manifest.verify_files); else None."""
    rec = _read_json(work, f"done/{shard:05d}.json")
    if not isinstance(rec, dict) or rec.get("config_hash") != config_hash:
        return None
    if is_uri(config.output_dir):
        meta = location(config.output_dir).head(SHARD_NAME.format(shard))
        return rec if meta is not None and meta.size == rec.get("bytes") else None
    path = Path(config.output_dir, SHARD_NAME.format(shard))
    if rec.get("config_hash") != config_hash or not path.is_file() or path.stat().st_size != rec["bytes"]:
        return None
    return rec if sha256_file(path) == rec["sha256"] else None

