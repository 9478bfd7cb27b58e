"""``bertflow data inspect DIR``: summarise a dataset's manifest and show a few of its records.

Works for every dataset kind. Documents datasets show their first documents; instance datasets are
decoded back to text (with [MASK]s) by ``data_jobs.instances.decode_examples`` when it is available.
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path
from typing import Any, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from contracts.common import ArgParser, UserError, run_main
from contracts.schema import Manifest


def _fmt(value: Any, width: int = 100) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return text if len(text) <= width else text[: width - 3] + "..."


def row_problems(directory: str | Path, m: Manifest) -> list[str]:
    """Parquet files whose row count (from their footer: cheap) differs from the manifest's.

    Checksums alone miss a hand-edited manifest: its files are intact, its numbers are not.
    """
    problems = []
    for f in m.files:
        path = Path(directory) / f.name
        if not f.name.endswith(".parquet") or not path.is_file():
            continue  # a missing file is verify_files' to report
        try:
            rows = pq.ParquetFile(path).metadata.num_rows
        except (pa.ArrowException, OSError):
            continue  # damaged, not edited: the checksums (or the reader) say so in their own words
        if rows != f.rows:
            problems.append(f"{path}: holds {rows} rows, its manifest says {f.rows} (manifest edited?)")
    return problems


def summary(directory: str | Path, verify: bool = False) -> list[str]:
    """Lines describing the manifest in ``directory`` (kind, config, files, totals, stats, checks)."""
    m = Manifest.read(directory)
    rows = sum(f.rows for f in m.files)
    size = sum(f.bytes for f in m.files)
    lines = [
        f"{directory}: {m.kind} dataset (schema v{m.schema_version}), config_hash {m.config_hash}"
        + (f", vocab_hash {m.vocab_hash}" if m.vocab_hash else ""),
        f"  files: {len(m.files)}, rows: {rows}, bytes: {size}",
    ]
    for key, value in m.totals.items():
        if key == "problems":
            lines.append(f"  problems: {len(value)}")
            lines += [f"    {_fmt(p)}" for p in value[:10]]
        else:
            lines.append(f"  {key}: {_fmt(value)}")
    lines += [f"  stats.{k}: {_fmt(v)}" for k, v in m.stats.items()]
    problems = m.verify_files(directory, deep=verify)
    problems += row_problems(directory, m) if verify else []
    check = "checksums and rows" if verify else "sizes"
    lines.append(f"  files {check}: " + ("ok" if not problems else f"{len(problems)} problem(s)"))
    lines += [f"    {p}" for p in problems[:10]]
    return lines


def document_examples(directory: str | Path, n: int) -> list[str]:
    """The first ``n`` documents of the first non-empty shard: id, source and first sentences."""
    m = Manifest.read(directory)
    out: list[str] = []
    for entry in m.files:
        if entry.rows == 0 or len(out) >= n:
            continue
        table = pq.read_table(Path(directory) / entry.name).slice(0, n - len(out))
        for row in table.to_pylist():
            sents = row["sentences"]
            out.append(f"[{row['doc_id']}] ({row['source']}, {len(sents)} sentences)")
            out += [f"  {_fmt(s)}" for s in sents[:3]]
    return out


def instance_examples(directory: str | Path, n: int) -> list[str]:
    """Decoded instances from the instances module, if it offers ``decode_examples``."""
    try:
        instances = importlib.import_module("data_jobs.instances")
    except ImportError:
        return ["(data_jobs.instances is not available: cannot decode instances)"]
    decode = getattr(instances, "decode_examples", None)
    if decode is None:
        return ["(data_jobs.instances has no decode_examples: cannot decode instances)"]
    return [str(s) for s in decode(str(directory), n)]


def build_parser() -> argparse.ArgumentParser:
    ap = ArgParser(prog="bertflow data inspect", description=__doc__.splitlines()[0])
    ap.add_argument("directory", help="a dataset directory (holding manifest.json)")
    ap.add_argument("-n", "--examples", type=int, default=3, help="records to show (default 3; 0 = none)")
    ap.add_argument("--verify", action="store_true", help="recompute every file's SHA-256 (reads everything)")
    return ap


def _main(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    lines = summary(args.directory, args.verify)
    if args.verify:
        m = Manifest.read(args.directory)
        problems = m.verify_files(args.directory, deep=True) + row_problems(args.directory, m)
        if problems:
            # A failed verification must fail the command (scripts check the exit code), naming the file.
            print("\n".join(lines))
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise UserError(problems[0] + more)
    kind = Manifest.read(args.directory).kind
    if args.examples > 0 and kind in ("documents", "instances"):
        lines.append(f"  first {args.examples} {kind}:")
        examples = document_examples if kind == "documents" else instance_examples
        lines += [f"    {part}" for text in examples(args.directory, args.examples) for part in text.splitlines()]
    print("\n".join(lines))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_main(_main, argv)


if __name__ == "__main__":
    sys.exit(main())
