"""shard job: raw text -> N Parquet document shards + manifest.json, on Ray or local processes.

    bertflow data shard --input corpus/ --output-dir out/docs --num-shards 8 --num-workers 4
    python -m data_jobs.shard_job --config shard.yaml          (so `ray job submit -- python -m ...` works)

A document goes to shard ``sha256(doc_id) % num_shards``; each shard is sorted by doc_id, so the
files are byte-identical whatever the number of workers. Exact duplicates (same sentences) are
dropped corpus-wide, keeping the smallest doc_id. The steps are in data_jobs/shard_tasks.py.
The output may be an object-store prefix (``s3://``): the shards are written on node-local scratch and
uploaded, the intermediate files are objects under ``<prefix>/.work``, the manifest comes last.
"""
from __future__ import annotations

import argparse
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Sequence

from contracts.common import (NO_OUTPUT, Status, UserError, config_from_args, config_parser, run_main, sha256_file,
                              stable_hash)
from contracts.storage import is_uri, location
from data_jobs.config import ShardConfig
from data_jobs.fanout import Workers
from data_jobs.readers import Unit, expand_inputs
from contracts.schema import MANIFEST_NAME, FileEntry, Manifest
from contracts.stage import StageDir, Storage, store_for
from data_jobs.job_output import join
from data_jobs.shard_tasks import (
    collect_seen, done_record, find_duplicates, merge_shard, needs_hashes, partition_units, write_json,
)

WORK = ".work"


def _input_records(units: list[Unit], known: list | None = None) -> list[list]:
    """[source, size, mtime_ns, sha256] of every input file (an object's etag in place of the mtime): its
    identity is (source, size, sha256), independent of where the corpus lies; ``known`` records of the last
    run spare re-reading files whose size and mtime did not change."""
    cache = {(r[0], r[1], r[2]): r[3] for r in known or [] if len(r) == 4}
    rows = []
    for u in units:
        if u.fmt == "builtin" or u.path.startswith("builtin:"):
            rows.append([u.source, 0, 0, stable_hash([u.source, sys.version])])
        elif is_uri(u.path):  # an object: its etag stands in for the mtime
            parent, name = u.path.rsplit("/", 1)
            meta = location(parent).head(name)
            if meta is None:
                raise UserError(f"{u.path}: no such object (removed while the job started?)")
            digest = cache.get((u.source, meta.size, meta.etag)) or _object_sha256(u.path)
            rows.append([u.source, meta.size, meta.etag, digest])
        else:
            st = os.stat(u.path)
            digest = cache.get((u.source, st.st_size, st.st_mtime_ns)) or sha256_file(u.path)
            rows.append([u.source, st.st_size, st.st_mtime_ns, digest])
    return rows


def _earlier(config: ShardConfig) -> list[Manifest]:
    """The manifests of the earlier snapshots' documents datasets (one line for one that is none)."""
    found = []
    for path in config.earlier:
        try:
            m = Manifest.read(path)
        except UserError as err:
            raise UserError(f"earlier: {err}") from None
        if m.kind != "documents":
            raise UserError(f"earlier: {path}: a {m.kind} dataset, not documents (the shard job's output)")
        found.append(m)
    return found


def _earlier_records(manifests: list[Manifest]) -> list[list]:
    """One input record per earlier snapshot: its dataset's identity (its place does not matter)."""
    return [[f"earlier snapshot {i}", 0, "", m.identity()] for i, m in enumerate(manifests)]


def _lineage(config: ShardConfig, manifests: list[Manifest]) -> dict[str, Any]:
    """This snapshot and the earlier ones it was deduplicated against, oldest first: every snapshot the
    datasets of the whole sequence came from."""
    snapshots: list = []
    for m in manifests:
        for s in (m.stats.get("lineage") or {}).get("snapshots", []):
            if s not in snapshots:
                snapshots.append(s)
    own = config.snapshot or f"documents {stable_hash([config.config_hash(), config.inputs])[:8]}"
    return {"snapshot": config.snapshot, "snapshots": [*snapshots, own], "seen_by": config.seen_by,
            "earlier": [{"snapshot": (m.stats.get("lineage") or {}).get("snapshot"), "identity": m.identity(),
                         "documents": m.totals.get("documents_kept")} for m in manifests]}


def _object_sha256(uri: str) -> str:
    """The SHA-256 of an object, from a node-local scratch copy (objects can be larger than memory)."""
    from data_jobs.shard_tasks import local_unit

    with local_unit(Unit(uri, "", "auto")) as here:
        return sha256_file(here.path)


def _inputs_hash(records: list[list]) -> str:
    return stable_hash([[r[0], r[1], r[3]] for r in records])


def _inputs_changed(old: list | None, new: list[list]) -> int:
    """How many input files were added, removed or changed since the records ``old``."""
    before = {r[0]: (r[1], r[3]) for r in old or []}
    after = {r[0]: (r[1], r[3]) for r in new}
    return sum(before.get(k) != after.get(k) for k in before.keys() | after.keys())


def status(config: ShardConfig, units: list[Unit] | None = None, deep: bool = False) -> Status:
    """done | partial | absent for this config and these input files (see contracts.common.Status)."""
    return _status(config, expand_inputs(config) if units is None else units, deep)[0]


def _status(config: ShardConfig, units: list[Unit], deep: bool) -> tuple[Status, list[list]]:
    """The status and the input records it compared (the run writes them into its manifest)."""
    out, store = config.output_dir, store_for(config.output_dir)
    old = None
    has_manifest = store.exists(MANIFEST_NAME)
    if has_manifest:
        try:
            old = Manifest.read(out)
        except UserError:
            pass
    records = _input_records(units, old.stats.get("inputs") if old is not None else None)
    records += _earlier_records(_earlier(config))
    ident = _inputs_hash(records)
    if old is None:
        if has_manifest:
            return Status("absent", "corrupt manifest", ident), records
        interrupted = store.exists(WORK)
        return Status("partial" if interrupted else "absent",
                      "an earlier run was interrupted" if interrupted else NO_OUTPUT, ident), records
    if old.kind != "documents" or old.config_hash != config.config_hash():
        return Status("absent", "config differs", ident), records
    if old.stats.get("inputs_hash") != _inputs_hash(records):
        n = max(1, _inputs_changed(old.stats.get("inputs"), records))
        return Status("absent", f"inputs changed: {n} file{'s' if n > 1 else ''}", ident), records
    problems = old.verify_files(out, deep=deep)
    if problems:
        return Status("partial", f"{len(problems)} of {len(old.files)} files damaged or missing", ident), records
    return Status("done", "complete", ident), records


def _prepare_output(stage: StageDir, config: ShardConfig, chash: str, ihash: str, state: Status) -> Manifest | None:
    """Return the finished manifest if this exact job is already done; otherwise make out/ ready.

    Reuses shards of an earlier run of the same config that are still intact (their manifest entries
    become done-records); refuses, unless overwrite, a directory holding another config's data.
    """
    out, store = config.output_dir, stage.store
    if store.exists(MANIFEST_NAME):
        old = Manifest.read(out)
        if old.kind != "documents" or old.config_hash != chash:
            if not config.overwrite:
                raise UserError(
                    f"{out}: holds another config's data ({old.kind}, config_hash {old.config_hash}, "
                    f"this config {chash}); use a new output dir or --overwrite"
                )
            _clear(store, old)
        elif old.stats.get("inputs_hash") == ihash:
            if state.done:
                return old
            # Keep what is intact: its manifest entries tell merge_shard it need not redo those shards.
            store.delete(WORK)
            for e in old.files:
                rec = {**e.meta, "name": e.name, "rows": e.rows, "bytes": e.bytes, "sha256": e.sha256}
                write_json(join(out, WORK), f"done/{e.meta['shard']:05d}.json",
                           {**rec, "config_hash": f"{chash}:{ihash}"})
        # From here on the directory is being rewritten: it must not look finished.
        stage.retract()
    elif stage.foreign() and not config.overwrite:
        raise UserError(f"{out}: not empty and not a bertflow documents dataset; use a new output dir")
    for stale in ("parts", "hashes", "drops", "seen"):
        store.delete(f"{WORK}/{stale}")
    if not is_uri(out):
        Path(out).mkdir(parents=True, exist_ok=True)
        for tmp in Path(out).glob(".tmp-shard-*"):  # left by a run killed mid-write
            tmp.unlink()
    return None


def _stage(out: str) -> StageDir:
    """The documents dataset as a stage location (contracts.stage), a directory or an ``s3://`` prefix:
    the manifest is the record; the work area and shards a killed run wrote before its manifest are
    this job's own."""
    store = store_for(out)
    return StageDir(store, "documents", record=MANIFEST_NAME, claim_record=True,
                    in_progress=lambda: {WORK, *(n for n in store.names() if n.startswith("shard-"))})


def _clear(store: Storage, old: Manifest) -> None:
    """Remove another config's dataset (--overwrite): only the files its manifest names."""
    for e in old.files:
        store.delete(e.name)
    store.delete(MANIFEST_NAME)
    store.delete(WORK)


def _groups(units: list[Unit], k: int) -> list[list[Unit]]:
    """Spread units over k reading tasks, largest first onto the least loaded (by file size)."""
    def size(u: Unit) -> int:
        return os.path.getsize(u.path) if os.path.isfile(u.path) else 1

    groups: list[list[Unit]] = [[] for _ in range(min(k, len(units)) or 1)]
    loads = [0] * len(groups)
    for u in sorted(units, key=lambda u: (-size(u), u.source)):
        i = loads.index(min(loads))
        groups[i].append(u)
        loads[i] += size(u)
    return groups


def _run_tasks(workers, label: str, fn: Callable, calls: list[tuple], config: ShardConfig) -> list[Any]:
    """``fn(*args)`` for each call on the job's workers (data_jobs.fanout); results in call order.
    An OSError without a file name (pyarrow's write errors) is reported against the output dir."""
    return workers.map(fn, calls, desc=f"shard: {label}", where=config.output_dir)


def run(config: ShardConfig) -> Manifest:
    """Run the shard job; returns the manifest written (last) into ``config.output_dir``."""
    # Ray workers may not share the driver's working directory: hand them absolute paths.
    out = config.output_dir if is_uri(config.output_dir) else str(Path(config.output_dir).resolve())
    config = config.model_copy(update={"output_dir": out})
    units = expand_inputs(config)  # bad inputs are refused before the output dir is even created
    stage = _stage(out)
    with stage.lock():  # one writer per output location (a lease on an object store)
        return _run_locked(config, stage, units)


def _run_locked(config: ShardConfig, stage: StageDir, units: list[Unit]) -> Manifest:
    out = config.output_dir
    state, records = _status(config, units, deep=True)
    chash, ihash = config.config_hash(), _inputs_hash(records)
    done = _prepare_output(stage, config, chash, ihash, state)  # or a one-line refusal
    if not state.fresh:
        print(state.line("shard") + f": {out}", file=sys.stderr)
    if done is not None:
        return done
    work = join(out, WORK)
    n = config.num_shards
    key = f"{chash}:{ihash}"  # done-records of another config or of other inputs are never reused
    groups = _groups(units, config.num_workers)
    with Workers(config.num_workers, engine=config.engine, ray_address=config.ray_address,
                 preload=["data_jobs.shard_tasks"]) as w:
        read = _run_tasks(w, "read", partition_units, [(g, config, i, work) for i, g in enumerate(groups)], config)
        earlier = _earlier(config)
        if earlier:  # the earlier snapshots' documents' keys, where this job's documents meet them
            files = [(join(e, f.name), (f.bytes, f.sha256), config, work, f"e{i:03d}-{j:05d}")
                     for i, (e, m) in enumerate(zip(config.earlier, earlier)) for j, f in enumerate(m.files)]
            _run_tasks(w, "earlier snapshots", collect_seen, files, config)
        if needs_hashes(config):
            seen = bool(earlier) and config.seen_by == "content"
            _run_tasks(w, "dedup", find_duplicates, [(k, work, config.dedup, seen) for k in range(n)], config)
        todo = [s for s in range(n) if done_record(s, config, work, key) is None]
        _run_tasks(w, "merge", merge_shard, [(s, config, work, key) for s in todo], config)
    shards = [done_record(s, config, work, key) for s in range(n)]
    if any(r is None for r in shards):
        raise UserError(f"{out}: a shard changed while the job ran; rerun it")
    manifest = _manifest(config, chash, records, read, shards)
    if config.earlier or config.snapshot:
        manifest.stats["lineage"] = _lineage(config, _earlier(config))
    store = stage.store  # on a store, written only while this run still holds the lease
    store.write_json(MANIFEST_NAME, manifest.model_dump(mode="json"))  # last: what makes the dataset exist
    store.delete(WORK)
    _report(manifest, out)
    return manifest


def _manifest(config: ShardConfig, chash: str, records: list[list], read: list[dict], shards: list[dict]) -> Manifest:
    dropped: Counter = Counter()
    skipped: Counter = Counter()
    problems: Counter = Counter()
    documents_read = files_read = 0
    for r in read:
        # Read = every document a reader met: those it passed on plus those it dropped.
        documents_read += r["kept"] + sum(r["dropped"].values())
        files_read += r["files_read"]
        dropped.update(r["dropped"])
        skipped.update(r["files_skipped"])
        problems.update(r["problems"])
    for s in shards:
        dropped.update(s["dropped"])
    rows = [s["rows"] for s in shards]
    kept = sum(rows)
    mean = kept / len(rows)
    files = [
        FileEntry(name=s["name"], rows=s["rows"], bytes=s["bytes"], sha256=s["sha256"],
                  meta={k: s[k] for k in ("shard", "dropped", "sentences", "bytes_of_text")})
        for s in shards
    ]
    totals = {
        "documents_read": documents_read,
        "documents_kept": kept,
        "dropped": dict(sorted(dropped.items())),
        "sentences": sum(s["sentences"] for s in shards),
        "bytes_of_text": sum(s["bytes_of_text"] for s in shards),
        "files_read": files_read,
        "files_skipped": dict(sorted(skipped.items())),
        "problems": [f"{k} (x{v})" if v > 1 else k for k, v in sorted(problems.items())][:100],
    }
    text = [s["bytes_of_text"] for s in shards]
    stats = {
        "inputs_hash": _inputs_hash(records),
        "inputs": records,  # [source, size, mtime_ns, sha256] per input file: what `status` compares
        "shard_rows": {"min": min(rows), "max": max(rows), "mean": round(mean, 2)},
        "shard_bytes_of_text": {"min": min(text), "max": max(text)},
        "imbalance_rows": round(max(rows) / mean, 4) if mean else None,
        "sentence_splitter": config.sentence_splitter,
    }
    return Manifest(kind="documents", config=config.model_dump(mode="json"), config_hash=chash,
                    files=files, totals=totals, stats=stats)


def _report(m: Manifest, out: str) -> None:
    t = m.totals
    lines = [f"shard: {t['documents_kept']} of {t['documents_read']} documents kept in {len(m.files)} shards "
             f"({t['sentences']} sentences, {t['bytes_of_text'] / 1e6:.1f} MB of text) -> {out}"]
    if t["dropped"]:
        lines.append("shard: dropped documents: " + ", ".join(f"{k}={v}" for k, v in t["dropped"].items()))
    if t["files_skipped"]:
        lines.append("shard: skipped files: " + ", ".join(f"{k}={v}" for k, v in t["files_skipped"].items()))
    lines += [f"shard: problem: {p}" for p in t["problems"][:20]]
    if len(t["problems"]) > 20:
        lines.append(f"shard: ... {len(t['problems']) - 20} more problems in {join(out, MANIFEST_NAME)}")
    print("\n".join(lines), file=sys.stderr)


def build_parser() -> argparse.ArgumentParser:
    return config_parser(
        ShardConfig, "bertflow data shard", "Raw text -> Parquet document shards (a Ray job).",
        aliases={"--input": "inputs", "--format": "input_format", "--splitter": "sentence_splitter"},
        keep_commas=["inputs"],
    )


def _main(argv: Sequence[str] | None) -> int:
    config = config_from_args(ShardConfig, build_parser().parse_args(argv))
    manifest = run(config)
    print(f"{config.output_dir}: {manifest.totals['documents_kept']} documents in {len(manifest.files)} shards")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_main(_main, argv)


if __name__ == "__main__":
    # Run the copy imported under the package name: Ray pickles remote functions by module, and a
    # worker cannot import "__main__" (this is how `ray job submit -- python -m data_jobs.shard_job` runs).
    from data_jobs.shard_job import main as _package_main

    raise SystemExit(_package_main())
