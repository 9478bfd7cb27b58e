"""Ray job: document shards -> static MLM/NSP instances (Parquet, binned by sequence length).

    python -m data_jobs.instances_job --shards-dir S --vocab-dir V --output-dir O [--config FILE.yaml]
    bertflow data instances ...            (same flags)
    ray job submit -- python -m data_jobs.instances_job ...

Two fan-outs of one task per document shard (no algorithm lives here), on Ray or, on one machine
without a Ray address, on local processes (``engine``, see data_jobs/fanout.py):
  1. pool: every shard contributes a fixed, seed-determined sample of its documents to the corpus-wide
     random-next pool (put once into the object store, read by every worker). Random-next segments
     therefore come from across the corpus, not only the worker's own shard, and the pool depends on
     (shards, seed) only, never on the number of workers.
  2. instances: each task tokenizes its shard once, runs ``dupe_factor`` rounds of
     ``instance_table.round_table`` and writes ``part-{shard:05d}-len{upper:04d}.parquet`` files (atomic
     rename), then a ``part-{shard:05d}.done.json`` record with their checksums and statistics.
A rerun reuses every shard whose record matches (config, vocab, input) and whose files verify. The
manifest is written last.
"""
from __future__ import annotations

import argparse
import fnmatch
import functools
import math
import os
import random
import re
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from contracts.common import NO_OUTPUT, Status, UserError, config_from_args, config_parser, run_main, stable_hash
from data_jobs.config import InstancesConfig
from data_jobs.job_output import another_config, fetched, join, kept_copy, publish, staged, write_json
from data_jobs.shard_read import read_documents, read_flat, read_sources
from contracts.schema import MANIFEST_NAME, FileEntry, Manifest, file_entry, instances_schema
from contracts.stage import StageDir, Storage, store_for
from contracts.storage import is_uri, location
from data_jobs.tokenization import VocabInfo, load_vocab_dir, read_vocab, wordpiece_tokenizer

# What a local worker imports (once, in the fork server): everything process_shard touches.
WORKER_MODULES = [
    "data_jobs.instances", "data_jobs.instance_table", "data_jobs.instance_stats", "pyarrow.parquet", "tokenizers", "tqdm",
]
POOL_WINDOW_FACTOR = 8  # pool documents longer than ~this many max_seq_lengths enter as one region
POOL_REGION_CHARS_PER_TOKEN = 4  # regions are cut by characters, before tokenizing (~4 chars a token)


def part_name(shard: int, upper: int) -> str:
    return f"part-{shard:05d}-len{upper:04d}.parquet"


WORK_RECORD = ".instances-work.json"  # the shards a run set out to make (named before their part files exist)


def done_name(shard: int) -> str:
    return f"part-{shard:05d}.done.json"


PART_RE = re.compile(r"part-(\d{5})-len\d{4}\.parquet")


# ---------------------------------------------------------------- worker side (pure but for files)

def _tokenizer(vocab_file: str, lowercase: bool):
    """The worker's tokenizer, built once per process (Ray reuses workers across shard tasks; building
    one from a 30k vocab costs ~0.05 s), with its cache of chunk ids (data_jobs.chunk_encode) kept
    across the shards a worker processes."""
    st = os.stat(vocab_file)
    return _cached_tokenizer(vocab_file, lowercase, st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=4)
def _cached_tokenizer(vocab_file: str, lowercase: bool, mtime_ns: int, size: int):
    from data_jobs.chunk_encode import ChunkEncoder

    return ChunkEncoder(wordpiece_tokenizer(vocab_file, lowercase))


def build_pool_part(shard_path: str, shard: int, num_rows: int, per_shard: int, seed: int,
                    max_seq_length: int, vocab_file: str, lowercase: bool, shard_expect=None, vocab_expect=None,
                    source_weights: dict | None = None):
    """This shard's contribution to the random-next pool: a seeded sample of its documents (of the sources
    whose weight is not 0). A path may be an object-store URI, fetched and checked against its ``*_expect``
    (bytes, sha256)."""
    from data_jobs.instances import derive_seed, pool_sample
    from data_jobs.source_weights import weight_of

    rng = random.Random(derive_seed(seed, "pool", shard))
    with fetched(shard_path, shard_expect) as local:
        candidates: Sequence[int] = range(num_rows)
        if source_weights and any(w == 0 for w in source_weights.values()):
            candidates = [r for r, src in enumerate(read_sources(str(local))) if weight_of(src, source_weights) > 0]
        rows = sorted(rng.sample(candidates, min(per_shard, len(candidates))))
        docs = read_documents(str(local), rows)
    tok = _tokenizer(str(kept_copy(vocab_file, vocab_expect) if vocab_expect else vocab_file), lowercase)
    region_chars = POOL_REGION_CHARS_PER_TOKEN * POOL_WINDOW_FACTOR * max_seq_length
    return pool_sample(tok, docs, [(shard << 32) | r for r in rows], region_chars, max_seq_length, rng)


def process_shard(shard_path: str, shard: int, pool, cfg_json: dict, vocab: dict, out_dir: str,
                  key: dict, expect: dict | None = None) -> dict:
    """Make and write all instances of one shard; returns its done record (also written to disk)."""
    import resource

    from data_jobs.instances import PairParams, ShardContext, tokenize_flat

    cpu0 = time.process_time()
    cfg = InstancesConfig.model_validate(cfg_json)
    with fetched(shard_path, (expect or {}).get(shard_path)) as local:
        sentences, per_doc = read_flat(str(local))
        sources = read_sources(str(local)) if cfg.source_weights else None
    local = kept_copy(vocab["vocab_file"], vocab["expect"]) if vocab["expect"] else Path(vocab["vocab_file"])
    tok = _tokenizer(str(local), vocab["lowercase"])
    words = read_vocab(local) if cfg.whole_word_masking else None
    doc_keys = [(shard << 32) | i for i in range(len(per_doc))]
    td = tokenize_flat(tok, sentences, per_doc, doc_keys)  # once, for all rounds
    del sentences
    passes = by_source = None
    if sources is not None:  # source_weights: rounds per document (data_jobs.source_weights)
        from data_jobs.source_weights import counts_by_key, document_passes

        passes = document_passes(sources, doc_keys, cfg.source_weights, cfg.dupe_factor, cfg.seed)
        by_source = counts_by_key(sources, passes, cfg.source_weights)
    is_cont = None
    if cfg.whole_word_masking:
        is_cont = np.array([t.startswith("##") for t in words])
    ctx = ShardContext(
        td, pool, PairParams(cfg.max_seq_length, cfg.short_seq_prob, cfg.sentence_task), cfg.masked_lm_prob,
        cfg.max_predictions_per_seq, vocab["vocab_size"], vocab["cls_id"], vocab["sep_id"], vocab["mask_id"],
        cfg.seed, shard, is_cont, passes,
    )
    # In place for a local output; on node-local scratch, then uploaded, for an object store (s3://).
    with staged(out_dir) as work:
        rows, stats = _write_rounds(ctx, cfg, instances_schema(vocab["vocab_size"]), work, shard)
        files = [_entry(work / part_name(shard, u), rows[u], shard, u) for u in sorted(rows)]
        publish(out_dir, [work / f["name"] for f in files])
    # "worker" is diagnostics (the benchmark reads it); nothing downstream depends on it.
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    record = {"key": key, "shard": shard, "documents": td.num_docs, "files": files, "stats": stats,
              **({"by_source": by_source} if by_source is not None else {}),
              "worker": {"peak_rss_mb": round(peak_mb, 1), "cpu_s": round(time.process_time() - cpu0, 3)}}
    write_json(out_dir, done_name(shard), record)  # after the files it vouches for
    return record


def _entry(path: Path, rows: int, shard: int, upper: int) -> dict:
    """A part file's manifest entry, with its row groups' sizes (a reader plans its blocks from the
    manifest, never fetching each file's footer at open: bert_core.loader)."""
    import pyarrow.parquet as pq

    md = pq.read_metadata(path)
    groups = [md.row_group(g).num_rows for g in range(md.num_row_groups)]
    return file_entry(path, rows, shard=shard, bin=upper, row_groups=groups).model_dump()


def _write_rounds(ctx, cfg: InstancesConfig, schema, out: Path, shard: int) -> tuple[dict[int, int], dict]:
    """Run the dupe rounds, appending each round's instances to one file per length bin (one row group
    per round); the files appear under their final names only when all rounds are written."""
    import pyarrow.parquet as pq

    from contracts.common import atomic_path
    from data_jobs.instance_stats import merge_stats, new_stats
    from data_jobs.instance_table import bin_slices, round_table

    stats = new_stats()
    rows: dict[int, int] = {}
    writers: dict[int, Any] = {}
    with ExitStack() as stack:
        try:
            rounds = cfg.dupe_factor if ctx.passes_D is None else int(ctx.passes_D.max(initial=0))
            for r in range(rounds):
                table, len_N, round_stats = round_table(ctx, r, cfg.length_bin_size)
                stats = merge_stats(stats, round_stats)
                for upper, first, n in bin_slices(len_N, cfg.length_bin_size, cfg.max_seq_length):
                    if upper not in writers:
                        tmp = stack.enter_context(atomic_path(out / part_name(shard, upper)))
                        writers[upper] = pq.ParquetWriter(tmp, schema, compression="zstd", use_dictionary=False,
                                                          write_statistics=False)
                    writers[upper].write_table(table.slice(first, n))
                    rows[upper] = rows.get(upper, 0) + n
        finally:  # close before atomic_path renames (success) or deletes (failure) the files
            for w in writers.values():
                w.close()
    return rows, stats


# ---------------------------------------------------------------- driver side

def _select_split(files: list[FileEntry], cfg: InstancesConfig) -> list[FileEntry]:
    """The shards of ``cfg.split``: held-out documents never reach training instances, not even as a
    random next sentence (the pool is built from the selected shards only)."""
    if cfg.heldout_shards == 0:
        return files
    if cfg.heldout_shards >= len(files):
        raise UserError(f"{cfg.shards_dir}: heldout_shards={cfg.heldout_shards} leaves no training shard "
                        f"(the dataset has {len(files)} shards)")
    cut = len(files) - cfg.heldout_shards
    return files[:cut] if cfg.split == "train" else files[cut:]


def _load_shards(shards_dir: str) -> tuple[Manifest, list[FileEntry], str]:
    d = shards_dir if is_uri(shards_dir) else Path(shards_dir)
    m = Manifest.read(d, kind="documents")
    from data_jobs.inspect import row_problems

    # On an object store: sizes from one listing here, each worker checks its shard's checksum.
    problems = m.verify_files(d, deep=False) or ([] if is_uri(shards_dir) else row_problems(d, m))
    if problems:
        raise UserError(problems[0])
    files = sorted(m.files, key=lambda f: f.name)
    return m, files, m.identity()  # content identity: the same dataset elsewhere is the same input


def _check_output(store: Storage, cfg: InstancesConfig) -> Manifest | None:
    """The existing manifest if it is this exact result; UserError if the location is someone else's."""
    if not store.exists(MANIFEST_NAME):
        for name in _done_names(store):
            if (_record_key(store, name) or {}).get("config_hash") != cfg.config_hash():
                raise UserError(f"{store.where}: holds partial instances of another config ({name}); "
                                "use another output_dir or delete it")
        return None
    m = Manifest.read(store.where)
    if m.kind != "instances" or m.config_hash != cfg.config_hash():
        raise another_config(store.where, m.kind, m.config_hash, cfg.config_hash())
    return m  # made from other inputs (documents or vocab): redone in place


def _done_names(store: Storage) -> list[str]:
    return sorted(fnmatch.filter(store.names(), "part-*.done.json"))


def _reusable(store: Storage, shard: int, key: dict, sizes: dict[str, int] | None) -> dict | None:
    """Shard ``shard``'s done-record if it was made with ``key`` and its files verify (locally by
    checksum; on an object store by the sizes of one listing, ``sizes``: see Manifest.verify_files)."""
    rec = store.read_json(done_name(shard))
    if not isinstance(rec, dict) or rec.get("key") != key:
        return None
    try:
        probe = Manifest(kind="instances", config={}, config_hash="", files=rec["files"])
    except (KeyError, ValueError):
        return None
    if sizes is not None:
        return rec if all(sizes.get(f.name) == f.bytes for f in probe.files) else None
    return None if probe.verify_files(store.where, deep=True) else rec


def status(cfg: InstancesConfig, deep: bool = False) -> Status:
    """done | partial | absent for this config and these two input datasets (contracts.common.Status)."""
    _, _, input_hash = _load_shards(cfg.shards_dir)
    return _status(cfg, load_vocab_dir(cfg.vocab_dir), input_hash, deep)


def _status(cfg: InstancesConfig, vocab: VocabInfo, input_hash: str, deep: bool) -> Status:
    store = store_for(cfg.output_dir)
    ident = stable_hash([input_hash, vocab.vocab_hash])

    def answer(state: str, reason: str) -> Status:
        return Status(state, reason, ident)

    if not store.exists(MANIFEST_NAME):
        key = {"config_hash": cfg.config_hash(), "vocab_hash": vocab.vocab_hash, "input_hash": input_hash}
        parts = [n for n in _done_names(store) if _record_key(store, n) == key]
        return answer("partial", f"{len(parts)} shards done earlier") if parts else answer("absent", NO_OUTPUT)
    try:
        m = Manifest.read(store.where)
    except UserError:
        return answer("absent", "corrupt manifest")
    if m.kind != "instances" or m.config_hash != cfg.config_hash():
        return answer("absent", "config differs")
    changed = [name for name, same in (("vocab", m.vocab_hash == vocab.vocab_hash),
                                       ("documents", m.totals.get("input_hash") == input_hash)) if not same]
    if changed:
        return answer("absent", f"inputs changed: {' and '.join(changed)} dataset")
    problems = m.verify_files(store.where, deep=deep)
    if problems:
        return answer("partial", f"{len(problems)} of {len(m.files)} files damaged or missing")
    return answer("done", "complete")


def _record_key(store: Storage, name: str) -> dict | None:
    rec = store.read_json(name)
    return rec.get("key") if isinstance(rec, dict) else None


def _in_progress(store: Storage) -> set[str]:
    """Names this job's own work records vouch for: the part files of the shards a killed run was
    working on (unrecorded), every done-record and the files it lists."""
    names: set[str] = set()
    present = store.names()
    work = store.read_json(WORK_RECORD)
    try:
        shards = {int(s) for s in work["shards"]}
        names.add(WORK_RECORD)
        names.update(n for n in present if (m := PART_RE.fullmatch(n)) and int(m.group(1)) in shards)
    except (KeyError, TypeError, ValueError):
        pass
    for rec_name in fnmatch.filter(present, "part-*.done.json"):
        rec = store.read_json(rec_name)
        try:
            names.update([rec_name, *(f["name"] for f in rec["files"])])
        except (KeyError, TypeError):
            continue  # not a record of ours
    return names


def _stage(out: str) -> StageDir:
    """The instances dataset as a stage location (contracts.stage), a directory or an ``s3://`` prefix:
    the manifest is the record, the done-records and the work record are this job's own work records."""
    store = store_for(out)
    return StageDir(store, "instances", record=MANIFEST_NAME, claim_record=True, scratch=(".tmp-part-",),
                    in_progress=lambda: _in_progress(store))


def run(cfg: InstancesConfig) -> Manifest:
    """Make the instances dataset of ``cfg`` (or return it untouched if already complete and valid)."""
    docs_manifest, shard_files, input_hash = _load_shards(cfg.shards_dir)
    if cfg.source_weights:  # a key naming no source is a typo, refused before any work
        from data_jobs.source_weights import check_keys

        inputs = docs_manifest.stats.get("inputs") or []  # [source, size, mtime, sha256] per input file
        sources = [r[0] for r in inputs if isinstance(r, list) and r and isinstance(r[0], str)]
        if sources:  # a dataset that does not list its inputs cannot be checked
            check_keys(cfg.source_weights, sources, f"{cfg.shards_dir}/{MANIFEST_NAME}")
    shard_files = _select_split(shard_files, cfg)
    if not any(f.rows for f in shard_files):
        # Every document was dropped or skipped by the shard job: its manifest says why.
        raise UserError(f"{cfg.shards_dir}: the corpus holds no documents (see 'dropped', 'files_skipped' and "
                        f"'problems' in its {MANIFEST_NAME}); nothing to make instances from")
    vocab = load_vocab_dir(cfg.vocab_dir)
    stage = _stage(cfg.output_dir)
    with stage.lock():  # one writer per output location (a lease on an object store)
        return _run_locked(cfg, stage, shard_files, input_hash, vocab)


def _run_locked(cfg: InstancesConfig, stage: StageDir, shard_files: list[FileEntry], input_hash: str,
                vocab: VocabInfo) -> Manifest:
    out, store = cfg.output_dir, stage.store
    owned = stage.refuse_foreign()  # a job never deletes or overwrites a file its own records do not name
    state = _status(cfg, vocab, input_hash, deep=True)
    existing = _check_output(store, cfg)  # or a one-line refusal
    if not state.fresh:
        print(state.line("instances") + f": {out}", file=sys.stderr)
    if state.done:
        return existing
    key = {"config_hash": cfg.config_hash(), "vocab_hash": vocab.vocab_hash, "input_hash": input_hash}
    if existing is not None:
        # About to change files: the old manifest must not vouch for a half-updated directory.
        stage.retract()
    sizes = None
    if is_uri(out):
        sizes = {m.name: m.size for m in location(out).list()}  # one listing verifies every record
    else:
        Path(out).mkdir(parents=True, exist_ok=True)
        for stale in Path(out).glob(".tmp-part-*"):  # left by a killed worker; never valid
            stale.unlink()
    shard_paths = [join(cfg.shards_dir, f.name) for f in shard_files]
    records: dict[int, dict] = {}
    for s in range(len(shard_paths)):
        rec = _reusable(store, s, key, sizes)
        if rec is not None:
            records[s] = rec
    # Largest shards first: with few, uneven shards (books are single documents) this shortens the
    # longest worker's queue; the output does not depend on the order.
    todo = sorted((s for s in range(len(shard_paths)) if s not in records), key=lambda s: -shard_files[s].bytes)
    if todo:
        # A work record first: part files of a run killed before its done-records stay ours to redo.
        store.write_json(WORK_RECORD, {"shards": todo})
        records.update(_run_shards(cfg, vocab, shard_paths, shard_files, todo, key, out))
    _remove_orphans(store, records, owned)
    manifest = _write_manifest(cfg, vocab, records, input_hash, len(shard_paths), store)
    store.delete(WORK_RECORD)
    return manifest


def _remove_orphans(store: Storage, records: dict[int, dict], owned: set[str]) -> None:
    """Drop part files of an earlier input (e.g. more shards then) that this result does not list;
    only those our own records named when the run started (``owned``)."""
    keep = {f["name"] for rec in records.values() for f in rec["files"]} | {done_name(s) for s in records}
    for name in store.names():
        if fnmatch.fnmatch(name, "part-*.parquet") or fnmatch.fnmatch(name, "part-*.done.json"):
            if name not in keep and name in owned:
                store.delete(name)


def _write_manifest(cfg: InstancesConfig, vocab: VocabInfo, records: dict[int, dict], input_hash: str,
                    n_shards: int, store: Storage) -> Manifest:
    from tqdm import tqdm

    from data_jobs.instance_stats import merge_stats, new_stats, summarize_stats

    stats = new_stats()
    files: list[dict] = []
    documents = 0
    for s in sorted(records):
        stats = merge_stats(stats, records[s]["stats"])
        files.extend(records[s]["files"])
        documents += records[s]["documents"]
    totals = {
        "instances": stats["instances"], "tokens": stats["tokens"], "documents": documents,
        "shards": n_shards, "vocab_size": vocab.vocab_size, "vocab_file": str(vocab.vocab_file),
        "lowercase": vocab.lowercase, "max_seq_length": cfg.max_seq_length,
        "max_predictions_per_seq": cfg.max_predictions_per_seq, "masked_lm_prob": cfg.masked_lm_prob,
        "dupe_factor": cfg.dupe_factor, "whole_word_masking": cfg.whole_word_masking,
        "sentence_task": cfg.sentence_task, "length_bin_size": cfg.length_bin_size, "input_hash": input_hash,
    }
    if cfg.source_weights:  # the mixture made: per key, documents and the rounds they took part in
        from data_jobs.source_weights import merge_counts

        totals["source_weights"] = dict(cfg.source_weights)
        totals["by_source"] = merge_counts([records[s].get("by_source") or {} for s in sorted(records)])
    manifest = Manifest(
        kind="instances", config=cfg.model_dump(mode="json"), config_hash=cfg.config_hash(),
        vocab_hash=vocab.vocab_hash, files=sorted(files, key=lambda f: f["name"]), totals=totals,
        stats=summarize_stats(stats, cfg.length_bin_size, cfg.max_seq_length),
    )
    # Last: what makes the dataset exist (on a store, written only while this run still holds the lease).
    store.write_json(MANIFEST_NAME, manifest.model_dump(mode="json"))
    tqdm.write(f"instances: {totals['instances']:,} from {documents:,} documents in {len(files)} files -> {store.where}")
    return manifest


def _run_shards(cfg, vocab: VocabInfo, shard_paths, shard_files, todo, key, out: str) -> dict[int, dict]:
    """The two fan-outs (pool, then instances) on the configured engine (data_jobs.fanout)."""
    from data_jobs.fanout import Workers
    from data_jobs.instances import concat_docs

    vocab_d = {"vocab_file": str(vocab.vocab_file), "lowercase": vocab.lowercase, "vocab_size": vocab.vocab_size,
               "cls_id": vocab.cls_id, "sep_id": vocab.sep_id, "mask_id": vocab.mask_id, "expect": vocab.vocab_expect}
    expect = {p: (f.bytes, f.sha256) for p, f in zip(shard_paths, shard_files)} if is_uri(cfg.shards_dir) else None
    shared = dict(cfg_json=cfg.model_dump(mode="json"), vocab=vocab_d, out_dir=out, key=key, expect=expect)
    with Workers(cfg.num_workers, engine=cfg.engine, ray_address=cfg.ray_address, preload=WORKER_MODULES) as w:
        pool = None
        if cfg.sentence_task == "nsp":
            per_shard = math.ceil(cfg.random_pool_docs / len(shard_paths))
            calls = [(p, s, shard_files[s].rows, per_shard, cfg.seed, cfg.max_seq_length, str(vocab.vocab_file),
                      vocab.lowercase, (expect or {}).get(p), vocab.vocab_expect, cfg.source_weights or None)
                     for s, p in enumerate(shard_paths)]
            pool = concat_docs(w.map(build_pool_part, calls, desc="random-next pool", where="instances worker",
                                     unit="shard"))
            if not pool.num_docs:
                raise UserError(f"{cfg.shards_dir}: no document has a token in {vocab.vocab_file} (text the "
                                "tokenizer drops entirely?); nothing to make instances from")
        results = w.map(process_shard, [(shard_paths[s], s) for s in todo], desc="instances", max_retries=1,
                        shared=dict(shared, pool=pool), where="instances worker", unit="shard")
    return {rec["shard"]: rec for rec in results}


# ---------------------------------------------------------------- CLI

def build_parser() -> argparse.ArgumentParser:
    return config_parser(InstancesConfig, "bertflow data instances", __doc__.split("\n")[0])


def config_from_argv(argv: Sequence[str] | None) -> InstancesConfig:
    return config_from_args(InstancesConfig, build_parser().parse_args(argv))


def _main(argv: Sequence[str] | None) -> int:
    run(config_from_argv(argv))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_main(_main, argv)


if __name__ == "__main__":
    # Run the copy imported under the package name: Ray pickles remote functions by module, and a
    # worker cannot import "__main__" (this is how `ray job submit -- python -m data_jobs.instances_job` runs).
    from data_jobs.instances_job import main as _package_main

    raise SystemExit(_package_main())
