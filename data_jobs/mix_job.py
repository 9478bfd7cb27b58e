"""Mix job: instances datasets -> one instances dataset holding a deterministic, weighted mixture of their rows.

    python -m data_jobs.mix_job --sources A B --weights 1 0.25 --output-dir O [--seed 0]
    bertflow data mix ...

For mixing sources by weight (Wikipedia and books) and for replaying earlier snapshots in continual
pretraining. Weight w of a source takes floor(w) full copies of its rows plus a sample of
round((w - floor(w)) x rows) of them (half up): 1 = all once, 0.25 = a quarter, 2.5 = twice and a half.

The sample is spread over the whole source: every row gets a 64-bit key drawn from (seed, source index,
its file's name) and the rows with the smallest keys are taken (ties: file name, then row), so it does
not depend on file order or on anything but the inputs, config and seed. Keys are made again per file
on each of the three passes (a histogram of the top 16 bits, the boundary bucket, the selection): memory
holds one file's keys, never the source's.

Output: an ordinary instances dataset. Each source file (one length bin) with rows taken gives one file
``s{i:02d}-{name}`` of the same schema: the full copies, then the sampled rows, each in ascending row
order; its manifest entry keeps the bin. Sources on an object store are read file by file through a
checked local copy; an object-store output is written on scratch and uploaded, the manifest last.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq

from contracts.common import (Status, UserError, atomic_path, config_from_args, config_parser, run_main,
                              stable_hash)
from contracts.schema import MANIFEST_NAME, FileEntry, Manifest, file_entry
from contracts.stage import WORK, StageDir
from contracts.storage import is_uri
from data_jobs.config import MixConfig
from data_jobs.job_output import another_config, fetched, join, publish, record_status, staged

# What every source must share with the first: a training batch mixes their rows freely.
SHARED = ("max_seq_length", "max_predictions_per_seq", "length_bin_size", "sentence_task")
BUCKET_SHIFT = np.uint64(48)  # keys are bucketed by their top 16 bits


@dataclass
class _Part:
    """One output file: ``copies`` full copies of source file ``entry`` of source ``src``, then ``sample``."""

    src: int
    entry: FileEntry
    copies: int
    sample: np.ndarray  # sorted row indices

    @property
    def name(self) -> str:
        return f"s{self.src:02d}-{self.entry.name}"

    @property
    def rows(self) -> int:
        return self.copies * self.entry.rows + len(self.sample)


def _load_sources(cfg: MixConfig) -> list[Manifest]:
    """Each source's manifest; a one-line UserError naming a source that is no instances dataset, is
    damaged, or cannot be mixed with the first."""
    manifests = [Manifest.read(src, kind="instances") for src in cfg.sources]
    first, m0 = cfg.sources[0], manifests[0]
    for src, m in zip(cfg.sources, manifests):
        problems = m.verify_files(src, deep=False)
        if problems:
            raise UserError(problems[0])
        if m.vocab_hash != m0.vocab_hash:
            raise UserError(f"{src}: vocab hash {m.vocab_hash} differs from {first}'s {m0.vocab_hash}; "
                            "mixed instances must share one vocab")
        for key in SHARED:
            if m.totals.get(key) != m0.totals.get(key):
                raise UserError(f"{src}: {key} {m.totals.get(key)!r} differs from {first}'s {m0.totals.get(key)!r}; "
                                "mixed instances must share it")
    return manifests


def _input_hash(manifests: list[Manifest]) -> str:
    return stable_hash([m.identity() for m in manifests])  # by content, in source order (weights pair with it)


def _keys(seed: int, src: int, name: str, rows: int) -> np.ndarray:
    """One uniform 64-bit key per row of a source file, from (seed, source index, file name) only."""
    tag = int.from_bytes(hashlib.sha256(name.encode("utf-8")).digest()[:8], "big")
    return np.random.default_rng([seed, src, tag]).integers(0, 2**64, size=rows, dtype=np.uint64)


def _sample(files: list[FileEntry], k: int, seed: int, src: int) -> dict[str, np.ndarray]:
    """The ``k`` rows of a source (``files`` sorted by name) with the smallest keys, ties broken by file
    then row: sorted row indices per file name."""
    if k == 0:
        return {f.name: np.zeros(0, np.int64) for f in files}
    keys = lambda f: _keys(seed, src, f.name, f.rows)  # noqa: E731
    hist = sum(np.bincount((keys(f) >> BUCKET_SHIFT).astype(np.int64), minlength=1 << 16) for f in files)
    cum = np.cumsum(hist)
    edge = int(np.searchsorted(cum, k))  # the bucket holding the k-th smallest key
    need = k - (int(cum[edge - 1]) if edge else 0)
    cand = []  # (key, file order, row) of the boundary bucket's rows
    for order, f in enumerate(files):
        kf = keys(f)
        rows = np.flatnonzero((kf >> BUCKET_SHIFT) == edge)
        cand.append((kf[rows], np.full(len(rows), order), rows))
    ck, co, cr = (np.concatenate(c) for c in zip(*cand))
    pick = np.lexsort((cr, co, ck))[:need]
    chosen = {}
    for order, f in enumerate(files):
        sel = (keys(f) >> BUCKET_SHIFT) < edge
        sel[cr[pick][co[pick] == order]] = True
        chosen[f.name] = np.flatnonzero(sel)
    return chosen


def _plan(cfg: MixConfig, manifests: list[Manifest]) -> list[_Part]:
    parts = []
    for i, (m, w) in enumerate(zip(manifests, cfg.weights)):
        files = sorted(m.files, key=lambda f: f.name)
        copies = math.floor(w)
        k = math.floor((w - copies) * sum(f.rows for f in files) + 0.5)
        sample = _sample(files, k, cfg.seed, i)
        parts += [p for f in files if (p := _Part(i, f, copies, sample[f.name])).rows]
    return parts


def _write(src_dir: str, part: _Part, work: Path) -> tuple[FileEntry, int]:
    """Write one output file; its manifest entry and token count."""
    entry, tokens = part.entry, 0
    with fetched(join(src_dir, entry.name), (entry.bytes, entry.sha256)) as path, atomic_path(work / part.name) as tmp:
        pf = pq.ParquetFile(path)
        if pf.metadata.num_rows != entry.rows:
            raise UserError(f"{join(src_dir, entry.name)}: {pf.metadata.num_rows} rows, "
                            f"its manifest entry says {entry.rows}")
        writer = pq.ParquetWriter(tmp, pf.schema_arrow, compression="zstd", use_dictionary=False,
                                  write_statistics=False)
        try:
            passes = [None] * part.copies + ([part.sample] if len(part.sample) else [])
            for rows in passes:  # a full copy (None), then the sample; one row group at a time
                first = 0
                for g in range(pf.num_row_groups):
                    n = pf.metadata.row_group(g).num_rows
                    table = pf.read_row_group(g)
                    if rows is not None:
                        lo, hi = np.searchsorted(rows, [first, first + n])
                        table = table.take(rows[lo:hi] - first)
                    first += n
                    if table.num_rows:
                        writer.write_table(table)
                        tokens += pc.sum(pc.list_value_length(table.column("input_ids"))).as_py()
        finally:
            writer.close()
        md = pq.read_metadata(tmp)
        groups = [md.row_group(g).num_rows for g in range(md.num_row_groups)]
    meta = {"bin": entry.meta.get("bin"), "row_groups": groups, "source": part.src}
    return file_entry(work / part.name, part.rows, **meta), tokens


def status(cfg: MixConfig, deep: bool = False) -> Status:
    """done | absent for this config and these sources (see contracts.common.Status)."""
    return _status(cfg, _input_hash(_load_sources(cfg)), deep)


def _status(cfg: MixConfig, input_hash: str, deep: bool) -> Status:
    return record_status(cfg.output_dir, "instances", cfg.config_hash(), "input_hash", input_hash,
                         "instances datasets", deep)


def _stage(out: str) -> StageDir:
    return StageDir.at(out, "instances", record=MANIFEST_NAME, claim_record=True)


def run(cfg: MixConfig) -> Manifest:
    """Write the mixture of ``cfg`` (skipped when an identical one is already there)."""
    manifests = _load_sources(cfg)
    with _stage(cfg.output_dir).lock():  # one writer per output location (a lease on an object store)
        return _run_locked(cfg, manifests, _input_hash(manifests))


def _run_locked(cfg: MixConfig, manifests: list[Manifest], input_hash: str) -> Manifest:
    out, sd = cfg.output_dir, _stage(cfg.output_dir)
    owned = sd.refuse_foreign()  # never overwrite or delete a file our own records do not name
    state = _status(cfg, input_hash, deep=True)
    if state.reason == "config differs":
        m = Manifest.read(out)
        raise another_config(out, m.kind, m.config_hash, cfg.config_hash())
    if not state.fresh:
        print(state.line("mix") + f": {out}", file=sys.stderr)
    if state.done:
        return Manifest.read(out)
    parts = _plan(cfg, manifests)
    names = [p.name for p in parts]
    entries, tokens = [], 0
    with sd.writing(cfg.config_hash(), {"input_hash": input_hash}, names), staged(out) as work:
        for part in parts:
            entry, n = _write(cfg.sources[part.src], part, work)
            entries.append(entry)
            tokens += n
            publish(out, [work / part.name])
            if is_uri(out):
                (work / part.name).unlink()  # scratch holds one file at a time
        for stale in sorted(owned - set(names) - {MANIFEST_NAME, WORK}):  # an earlier mixture's files
            sd.store.delete(stale)
    taken = {i: sum(p.rows for p in parts if p.src == i) for i in range(len(manifests))}
    t0 = manifests[0].totals

    def common(key: str):  # the sources' value where they agree, else None
        return t0.get(key) if len({json.dumps(m.totals.get(key)) for m in manifests}) == 1 else None

    vocab_file = t0.get("vocab_file")
    if vocab_file and not is_uri(cfg.sources[0]) and not is_uri(vocab_file):
        vocab_file = str(Path(cfg.sources[0]) / vocab_file)  # relative: to its dataset; made absolute
    totals = {
        "instances": sum(taken.values()), "tokens": tokens, "vocab_size": t0["vocab_size"], "vocab_file": vocab_file,
        "lowercase": t0.get("lowercase"), **{k: t0.get(k) for k in SHARED},
        **{k: common(k) for k in ("masked_lm_prob", "whole_word_masking", "dupe_factor")}, "input_hash": input_hash,
        "sources": [{"dir": d, "identity": m.identity(), "weight": w, "rows_in": sum(f.rows for f in m.files),
                     "rows_taken": taken[i]} for i, (d, m, w) in enumerate(zip(cfg.sources, manifests, cfg.weights))],
    }
    manifest = Manifest(kind="instances", config=cfg.model_dump(mode="json"), config_hash=cfg.config_hash(),
                        vocab_hash=manifests[0].vocab_hash, files=sorted(entries, key=lambda f: f.name), totals=totals)
    sd.store.write_json(MANIFEST_NAME, manifest.model_dump(mode="json"))  # last, while the lease holds
    sd.end()
    per = ", ".join(f"source {i} {s['rows_taken']:,} rows ({s['rows_in']:,} x weight {s['weight']:g})"
                    for i, s in enumerate(totals["sources"]))
    print(f"mix: {per}; {totals['instances']:,} instances in {len(entries)} files -> {out}")
    return manifest


def build_parser() -> argparse.ArgumentParser:
    # a path may hold a comma: --sources takes one dataset per value
    return config_parser(MixConfig, "bertflow data mix", __doc__.split("\n")[0], keep_commas=["sources"])


def _main(argv: Sequence[str] | None) -> int:
    run(config_from_args(MixConfig, build_parser().parse_args(argv)))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_main(_main, argv)


if __name__ == "__main__":
    raise SystemExit(main())
