"""shard job: raw text -> N Parquet document shards + manifest.json, on Ray or local processes.

    bertflow data shard --input corpus/ --output-dir out/docs --num-shards 8 --num-workers 4
    python -m data_jobs.shard_job --config shard.yaml          (so `ray job submit -- python -m ...` works)

A document goes to shard ``sha256(doc_id) % num_shards``; each shard is sorted by doc_id, so the
files are byte-identical whatever the number of workers. Exact duplicates (same sentences) are
dropped corpus-wide, keeping the smallest doc_id. The steps are in data_jobs/shard_tasks.py.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Sequence

from data_jobs.common import UserError, build_config, load_config, run_main, stable_hash
from data_jobs.config import ShardConfig
from data_jobs.fanout import Workers
from data_jobs.readers import Unit, expand_inputs
from data_jobs.schema import MANIFEST_NAME, FileEntry, Manifest
from data_jobs.shard_tasks import (
    done_record, find_duplicates, merge_shard, partition_units,
)

WORK = ".work"


def _inputs_hash(units: list[Unit]) -> str:
    """Fingerprint of the input files (name, size, mtime): a rerun on changed inputs is not skipped."""
    rows = []
    for u in units:
        if u.fmt == "builtin" or u.path.startswith("builtin:"):
            rows.append([u.source, sys.version])
        else:
            st = os.stat(u.path)
            rows.append([u.source, st.st_size, st.st_mtime_ns])
    return stable_hash(rows)


def _prepare_output(out: Path, config: ShardConfig, chash: str, ihash: str) -> Manifest | None:
    """Return the finished manifest if this exact job is already done; otherwise make out/ ready.

    Reuses shards of an earlier run of the same config that are still intact (their manifest entries
    become done-records); refuses, unless overwrite, a directory holding another config's data.
    """
    work = out / WORK
    if (out / MANIFEST_NAME).is_file():
        old = Manifest.read(out)
        if old.kind != "documents" or old.config_hash != chash:
            if not config.overwrite:
                raise UserError(
                    f"{out}: holds another config's data ({old.kind}, config_hash {old.config_hash}, "
                    f"this config {chash}); use a new output dir or --overwrite"
                )
            _clear(out)
        elif old.stats.get("inputs_hash") == ihash:
            if not old.verify_files(out):
                return old
            # Keep what is intact: its manifest entries tell merge_shard it need not redo those shards.
            shutil.rmtree(work, ignore_errors=True)
            (work / "done").mkdir(parents=True)
            for e in old.files:
                rec = {**e.meta, "name": e.name, "rows": e.rows, "bytes": e.bytes, "sha256": e.sha256}
                (work / "done" / f"{e.meta['shard']:05d}.json").write_text(
                    json.dumps({**rec, "config_hash": f"{chash}:{ihash}"}), encoding="utf-8"
                )
        # From here on the directory is being rewritten: it must not look finished.
        (out / MANIFEST_NAME).unlink(missing_ok=True)
    elif out.is_dir() and any(out.iterdir()):
        ours = all(p.name == WORK or p.name.startswith((".tmp-", "shard-")) for p in out.iterdir())
        if not ours and not config.overwrite:
            raise UserError(f"{out}: not empty and not a bertflow documents dataset; use a new output dir")
    out.mkdir(parents=True, exist_ok=True)
    for stale in ("parts", "hashes", "drops"):
        shutil.rmtree(work / stale, ignore_errors=True)
    for tmp in out.glob(".tmp-shard-*"):  # left by a run killed mid-write
        tmp.unlink()
    return None


def _clear(out: Path) -> None:
    for p in out.glob("shard-*.parquet"):
        p.unlink()
    (out / MANIFEST_NAME).unlink(missing_ok=True)
    shutil.rmtree(out / WORK, ignore_errors=True)


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
    out = Path(config.output_dir).resolve()
    config = config.model_copy(update={"output_dir": str(out)})
    units = expand_inputs(config)
    chash, ihash = config.config_hash(), _inputs_hash(units)
    done = _prepare_output(out, config, chash, ihash)
    if done is not None:
        print(f"shard: {out} already complete for this config and inputs; nothing to do", file=sys.stderr)
        return done
    work = str(out / WORK)
    n = config.num_shards
    key = f"{chash}:{ihash}"  # done-records of another config or of other inputs are never reused
    groups = _groups(units, config.num_workers)
    with Workers(config.num_workers, engine=config.engine, ray_address=config.ray_address,
                 preload=["data_jobs.shard_tasks"]) as w:
        read = _run_tasks(w, "read", partition_units, [(g, config, i, work) for i, g in enumerate(groups)], config)
        if config.dedup:
            _run_tasks(w, "dedup", find_duplicates, [(k, work) for k in range(n)], config)
        todo = [s for s in range(n) if done_record(s, config, work, key) is None]
        _run_tasks(w, "merge", merge_shard, [(s, config, work, key) for s in todo], config)
    shards = [done_record(s, config, work, key) for s in range(n)]
    if any(r is None for r in shards):
        raise UserError(f"{out}: a shard changed while the job ran; rerun it")
    manifest = _manifest(config, chash, ihash, read, shards)
    manifest.write(out)
    shutil.rmtree(out / WORK, ignore_errors=True)
    _report(manifest, out)
    return manifest


def _manifest(config: ShardConfig, chash: str, ihash: str, read: list[dict], shards: list[dict]) -> Manifest:
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
        "inputs_hash": ihash,
        "shard_rows": {"min": min(rows), "max": max(rows), "mean": round(mean, 2)},
        "shard_bytes_of_text": {"min": min(text), "max": max(text)},
        "imbalance_rows": round(max(rows) / mean, 4) if mean else None,
        "sentence_splitter": config.sentence_splitter,
    }
    return Manifest(kind="documents", config=config.model_dump(mode="json"), config_hash=chash,
                    files=files, totals=totals, stats=stats)


def _report(m: Manifest, out: Path) -> None:
    t = m.totals
    lines = [f"shard: {t['documents_kept']} of {t['documents_read']} documents kept in {len(m.files)} shards "
             f"({t['sentences']} sentences, {t['bytes_of_text'] / 1e6:.1f} MB of text) -> {out}"]
    if t["dropped"]:
        lines.append("shard: dropped documents: " + ", ".join(f"{k}={v}" for k, v in t["dropped"].items()))
    if t["files_skipped"]:
        lines.append("shard: skipped files: " + ", ".join(f"{k}={v}" for k, v in t["files_skipped"].items()))
    lines += [f"shard: problem: {p}" for p in t["problems"][:20]]
    if len(t["problems"]) > 20:
        lines.append(f"shard: ... {len(t['problems']) - 20} more problems in {out / MANIFEST_NAME}")
    print("\n".join(lines), file=sys.stderr)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="bertflow data shard", description="Raw text -> Parquet document shards (a Ray job).",
        epilog="Flags override keys of --config. Formats: auto, bert, books, wikiextractor, mediawiki, jsonl, parquet.",
    )
    ap.add_argument("--config", help="YAML file with ShardConfig keys")
    ap.add_argument("--input", dest="inputs", action="append", nargs="+", metavar="PATH",
                    help="file, directory, glob or builtin:python-docs (repeatable)")
    ap.add_argument("--output-dir", help="directory for shard-*.parquet and manifest.json")
    ap.add_argument("--format", dest="input_format", help="input format (default auto: by name and content)")
    ap.add_argument("--text-column", help="JSONL/Parquet text column (default text)")
    ap.add_argument("--id-column", help="JSONL/Parquet document id column (default: row index)")
    ap.add_argument("--num-shards", type=int, help="number of output shards (default 8)")
    ap.add_argument("--num-workers", type=int, help="parallel tasks (default 2)")
    ap.add_argument("--ray-address", help="existing Ray cluster ('auto', 'ray://host:10001'); default: this machine")
    ap.add_argument("--engine", choices=["auto", "local", "ray"],
                    help="ray: Ray tasks; local: local processes, no Ray start-up; auto (default): ray when "
                         "--ray-address or $RAY_ADDRESS is set, else local")
    ap.add_argument("--min-sentences", type=int, help="drop documents with fewer sentences (default 1)")
    ap.add_argument("--splitter", dest="sentence_splitter", help="syntok (default), blingfire or pysbd")
    ap.add_argument("--on-bad-input", choices=["skip", "fail"], help="damaged input: skip+count (default) or stop")
    ap.add_argument("--no-dedup", dest="dedup", action="store_const", const=False, help="keep exact duplicates")
    ap.add_argument("--overwrite", action="store_const", const=True, help="replace another config's shards")
    return ap


def config_from_args(args: argparse.Namespace) -> ShardConfig:
    overrides = {k: v for k, v in vars(args).items() if k != "config" and v is not None}
    if "inputs" in overrides:
        overrides["inputs"] = [p for group in overrides["inputs"] for p in group]
    if args.config:
        return load_config(ShardConfig, args.config, overrides)
    return build_config(ShardConfig, overrides, "command line")


def _main(argv: Sequence[str] | None) -> int:
    config = config_from_args(build_parser().parse_args(argv))
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
