"""Sentence splitters compared on real text: quality against one-sentence-per-line references, speed
on a Gutenberg book. Ratios are against a naive regex splitter measured in the same run.

    .venv/bin/python bench/bench_segment.py [--shared-data ../shared/data] [--book pg1342_pride_and_prejudice.txt]

Quality references (sentence boundaries known):
  bert_sample  Google's sample_text.txt (one sentence per line): each document's lines joined, re-split.
  mrpc         GLUE MRPC sentences (untokenised news sentences), joined 8 at a time into paragraphs.
Score: exact-match sentence F1 (a sentence counts when the splitter reproduces it exactly).
"""
from __future__ import annotations

import argparse
import re
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from data_jobs.readers.textio import strip_gutenberg_lines  # noqa: E402
from data_jobs.segment import BACKENDS, split_paragraph  # noqa: E402


def bert_sample_paragraphs(shared: Path) -> list[list[str]]:
    text = (shared / "corpus/bert_sample/sample_text.txt").read_text(encoding="utf-8")
    docs = [d.strip().split("\n") for d in text.split("\n\n") if d.strip()]
    return [[s.strip() for s in d if s.strip()] for d in docs]


def mrpc_paragraphs(shared: Path, limit: int = 2000, group: int = 8) -> list[list[str]]:
    sents, seen = [], set()
    for line in (shared / "glue/MRPC/train.tsv").read_text(encoding="utf-8-sig").splitlines()[1:]:
        cols = line.split("\t")
        for s in (cols[3], cols[4]):
            s = " ".join(s.split())
            if s and s not in seen:
                seen.add(s)
                sents.append(s)
        if len(sents) >= limit:
            break
    return [sents[i : i + group] for i in range(0, len(sents), group)]


def f1(backend: str, paragraphs: list[list[str]]) -> float:
    tp = n_pred = n_ref = 0
    for ref in paragraphs:
        pred = split_paragraph(" ".join(ref), backend)
        tp += sum((Counter(pred) & Counter(ref)).values())
        n_pred += len(pred)
        n_ref += len(ref)
    p, r = tp / max(n_pred, 1), tp / max(n_ref, 1)
    return 2 * p * r / max(p + r, 1e-9)


def book_paragraphs(path: Path) -> list[str]:
    lines = path.read_text(encoding="utf-8-sig").replace("\r\n", "\n").split("\n")
    body = "\n".join(strip_gutenberg_lines(lines))
    return [p for p in body.split("\n\n") if p.strip()]


def speed(backend: str, paragraphs: list[str]) -> tuple[float, list[str]]:
    t0 = time.perf_counter()
    sents = [s for p in paragraphs for s in split_paragraph(p, backend)]
    return time.perf_counter() - t0, sents


# A sentence ending in a title abbreviation is (in novels) almost always a false split ("Mr. | Darcy").
_ABBREV_END = re.compile(r"\b(Mr|Mrs|Dr|St|Col|Capt|Messrs)\.$")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shared-data", default=str(Path(__file__).resolve().parents[2] / "shared/data"))
    ap.add_argument("--book", default="pg1342_pride_and_prejudice.txt")
    args = ap.parse_args()
    shared = Path(args.shared_data)
    refs = {"bert_sample": bert_sample_paragraphs(shared), "mrpc": mrpc_paragraphs(shared)}
    book = book_paragraphs(shared / "corpus/gutenberg" / args.book)
    mb = sum(len(p.encode()) for p in book) / 1e6
    for b in BACKENDS:  # warm-up: imports, pysbd's rule compilation
        split_paragraph("Warm up. Twice.", b)
    base_s, _ = speed("regex", book)
    print(f"book: {args.book} ({mb:.2f} MB of body text); speed ratio = backend time / regex time")
    print("abbrev = book sentences ending in Mr./Mrs./Dr./St./... (false splits)")
    print(f"{'backend':<10} {'F1 bert_sample':>15} {'F1 mrpc':>9} {'abbrev':>7} {'MB/s':>8} {'x regex':>8} {'sentences':>10}")
    for b in BACKENDS:
        secs, sents = speed(b, book)
        abbrev = sum(1 for s in sents if _ABBREV_END.search(s))
        print(
            f"{b:<10} {f1(b, refs['bert_sample']):>15.3f} {f1(b, refs['mrpc']):>9.3f} {abbrev:>7} "
            f"{mb / secs:>8.2f} {secs / base_s:>8.1f} {len(sents):>10}"
        )


if __name__ == "__main__":
    main()
