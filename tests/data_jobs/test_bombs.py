"""Decompression bombs (issue 24, resource limits): a small .gz/.bz2/.zst that expands to hundreds of MB
(newlines or zeros after a few good documents) in every streamed format. The reader stops once the
stream outgrows MAX_EXPANSION times its compressed bytes (past BOMB_FLOOR), so memory and time stay
bounded; the documents before the bomb are kept, the rest is counted under ``compression_bomb``, and
nothing goes uncounted. Ordinary compressed text (a few times smaller) reads whole."""
from __future__ import annotations

import bz2
import functools
import gzip
import io
import json
import resource

import pytest
import zstandard

from data_jobs.readers import ReadStats, Unit, read_unit
from data_jobs.readers import textio
from data_jobs.readers.textio import BOMB_FLOOR, MAX_EXPANSION
from shard_fixtures import cfg

TAIL = 64 << 20  # what the bomb expands to: 4 times the real floor, far past what a reader should hold
SMALL_FLOOR = 1 << 20  # most cases run with the floor at 1 MiB (same rule, a sixteenth of the reading)
CHUNK = 1 << 20
COMPRESS = {".gz": gzip.compress, ".bz2": bz2.compress, ".zst": zstandard.ZstdCompressor().compress}


@functools.lru_cache(maxsize=None)
def _tail(fill: bytes, codec: str) -> bytes:
    """TAIL bytes of ``fill`` as one compressed member, written a chunk at a time (never whole in memory)."""
    out = io.BytesIO()
    if codec == ".gz":
        w = gzip.GzipFile(fileobj=out, mode="wb")
    elif codec == ".bz2":
        w = bz2.BZ2File(out, "wb")
    else:
        w = zstandard.ZstdCompressor().stream_writer(out, closefd=False)
    block = fill * (CHUNK // len(fill))
    for _ in range(TAIL // len(block)):
        w.write(block)
    w.close()
    return out.getvalue()


def _compressed(head: bytes, fill: bytes, codec: str) -> bytes:
    """``head`` then the bomb, as two members (gzip, bz2) or frames (zstd) of one file: readers read on."""
    return COMPRESS[codec](head) + _tail(fill, codec)


GOOD = ["The first document has a sentence.", "The second one has another sentence.",
        "A third document closes the good part."]
HEADS = {
    "bert": ("corpus.txt", "\n\n".join(GOOD).encode() + b"\n\n"),
    "jsonl": ("records.jsonl", b"".join(json.dumps({"text": t}).encode() + b"\n" for t in GOOD)),
    "wikiextractor": ("wiki_00", b"".join(f'<doc id="{i}" title="T{i}">\nT{i}\n{t}\n</doc>\n'.encode()
                                          for i, t in enumerate(GOOD))),
}


def _read(tmp_path, fmt: str, blob: bytes, codec: str):
    path = tmp_path / (HEADS[fmt][0] + codec)
    path.write_bytes(blob)
    stats = ReadStats()
    config = cfg([path], input_format=fmt, sentence_splitter="blingfire")
    docs = list(read_unit(Unit(str(path), path.name, fmt), config, stats))
    assert stats.kept == len(docs) and stats.kept + sum(stats.dropped.values()) == stats.documents_read
    return docs, stats


@pytest.mark.parametrize("codec", [".gz", ".bz2", ".zst"])
@pytest.mark.parametrize("fmt, fill", [("bert", b"\n"), ("jsonl", b"\n"), ("wikiextractor", b"\n"),
                                       ("bert", b"a"), ("jsonl", b"a")])
def test_a_bomb_is_stopped_and_counted_the_documents_before_it_kept(tmp_path, monkeypatch, fmt, fill, codec):
    monkeypatch.setattr(textio, "BOMB_FLOOR", SMALL_FLOOR)
    _bomb_case(tmp_path, fmt, fill, codec)


def test_the_real_floor_bounds_memory_on_the_densest_bomb(tmp_path):
    """zstd (one compressed byte can stand for 32 KB) at the shipped BOMB_FLOOR."""
    _bomb_case(tmp_path, "bert", b"\n", ".zst")


def _bomb_case(tmp_path, fmt: str, fill: bytes, codec: str) -> None:
    blob = _compressed(HEADS[fmt][1], fill, codec)
    assert len(blob) * MAX_EXPANSION < TAIL  # a bomb by the rule's own measure
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    docs, stats = _read(tmp_path, fmt, blob, codec)
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert [" ".join(d.sentences) for d in docs] == GOOD
    reasons = {**stats.dropped, **stats.files_skipped}
    if fill == b"a":  # one endless line: skipped as too long until the bomb rule stops the stream
        assert reasons.get("compression_bomb", 0) + reasons.get("line_too_long", 0) >= 1, stats.to_dict()
    else:
        assert reasons == {"compression_bomb": 1}, stats.to_dict()
    assert grown_mb < 64, f"peak RSS grew {grown_mb:.0f} MB reading a {len(blob):,}-byte bomb"


def test_a_parquet_bomb_is_not_unpacked_to_disk(tmp_path):
    """Compressed Parquet is unpacked to a temporary file: a bomb stops at the floor, counted as a file."""
    blob = _compressed(b"PAR1", b"\x00", ".zst")
    path = tmp_path / "table.parquet.zst"
    path.write_bytes(blob)
    stats = ReadStats()
    docs = list(read_unit(Unit(str(path), path.name, "parquet"), cfg([path], input_format="parquet"), stats))
    assert docs == [] and stats.files_skipped == {"compression_bomb": 1}, stats.to_dict()


@pytest.mark.parametrize("codec", [".gz", ".bz2", ".zst"])
def test_ordinary_compressed_text_past_the_floor_reads_whole(tmp_path, codec):
    """Text that compresses as text does (here about 3-6 times) is no bomb, however large."""
    import random

    rng = random.Random(0)
    words = [("".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9))))
             for _ in range(5000)]
    docs_text, size = [], 0
    while size < BOMB_FLOOR + (2 << 20):
        doc = "\n".join(" ".join(rng.choice(words) for _ in range(12)).capitalize() + "." for _ in range(8))
        docs_text.append(doc)
        size += len(doc) + 2
    data = ("\n\n".join(docs_text) + "\n").encode()
    blob = {".gz": gzip.compress, ".bz2": bz2.compress, ".zst": zstandard.ZstdCompressor().compress}[codec](data)
    docs, stats = _read(tmp_path, "bert", blob, codec)
    assert len(docs) == len(docs_text) and not stats.dropped, stats.to_dict()
