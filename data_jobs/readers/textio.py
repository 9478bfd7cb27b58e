"""Streaming byte/line access to input files: decompression, BOM/CRLF, bounded lines, bad-byte flags.

Nothing here loads a whole file: compressed inputs go through streaming decompressors and lines are
read with a length cap, so a 200 MB line costs ``max_line_bytes`` of memory, not 200 MB.
Problems inside a file are not raised; they are yielded as :class:`BadLine` markers so each format
parser can drop (and count) exactly the document they fall into and carry on.
"""
from __future__ import annotations

import bz2
import gzip
import io
import re
import zlib
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Iterable, Iterator, NamedTuple, Union

import zstandard

BOM = b"\xef\xbb\xbf"
COMPRESSIONS = (".gz", ".bz2", ".zst")
PROBE_BYTES = 8192


class BadLine(NamedTuple):
    """Marker yielded in place of a line that could not be used; ``reason`` names why."""

    reason: str  # "invalid_utf8" | "line_too_long" | "truncated" | "compression_bomb"


class BookBreak(NamedTuple):
    """Marker between two Project Gutenberg books concatenated in one file (END ... START again)."""


Line = Union[str, BadLine, BookBreak]


STREAM_ERRORS: tuple[type[BaseException], ...] = (EOFError, OSError, zlib.error, zstandard.ZstdError)

# A compressed input may expand at most MAX_EXPANSION times over its compressed size (text: 3-10x, very
# repetitive markup 20-50x); far above, it is a decompression bomb. Checked once BOMB_FLOOR bytes came
# out, so memory and time stay bounded whatever the file expands to (1 GB of newlines from a 1 MB .gz).
MAX_EXPANSION = 200
BOMB_FLOOR = 16 << 20
ENDS_STREAM = ("truncated", "compression_bomb")  # BadLine reasons after which nothing more is read


class CompressionBomb(EOFError):
    """A compressed stream that expanded past MAX_EXPANSION times the compressed bytes read so far."""


def base_name(path: str | Path) -> str:
    """File name without a compression suffix: ``wiki.xml.bz2`` -> ``wiki.xml``."""
    name = Path(path).name
    for suffix in COMPRESSIONS:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


class _ZstdTruncationCheck(io.RawIOBase):
    """zstandard's stream reader ends quietly on a cut-off frame; this raises EOFError instead."""

    def __init__(self, raw: BinaryIO):
        self._fh = raw
        self._dobj = self._new()
        self._pending = b""
        self._input = memoryview(b"")
        self._eof = False
        self._in_frame = False  # inside a frame whose end has not been seen yet

    @staticmethod
    def _new():
        return zstandard.ZstdDecompressor().decompressobj()

    def readable(self) -> bool:
        return True

    # zstandard's decompressobj returns all the output of what it is fed, and one compressed byte can
    # stand for up to 32 KB (an RLE block): fed FEED bytes at a time, one call makes at most ~8 MB, so a
    # decompression bomb is caught by _Bounded before it fills memory.
    FEED = 256

    def readinto(self, buf) -> int:  # type: ignore[override]
        while not self._pending and not self._eof:
            if not self._input:
                self._input = memoryview(self._fh.read(1 << 16))
            if not self._input:
                self._eof = True
                if self._in_frame:
                    raise EOFError("zstd stream ended before the end of its frame (truncated)")
                break
            chunk, self._input = bytes(self._input[: self.FEED]), self._input[self.FEED:]
            if self._dobj.eof:  # the previous frame ended exactly at a chunk boundary
                self._dobj = self._new()
            self._pending = self._dobj.decompress(chunk)
            # Multi-frame files (pzstd, concatenated .zst): each frame needs a fresh decompressor.
            while self._dobj.eof and self._dobj.unused_data:
                rest = self._dobj.unused_data
                self._dobj = self._new()
                self._pending += self._dobj.decompress(rest)
            self._in_frame = not self._dobj.eof
        n = min(len(buf), len(self._pending))
        buf[:n] = self._pending[:n]
        self._pending = self._pending[n:]
        return n

    def close(self) -> None:
        self._fh.close()
        super().close()


class _Counted(io.RawIOBase):
    """A raw file that counts the bytes read from it (the compressed side of a stream)."""

    def __init__(self, raw: BinaryIO):
        self._fh, self.n = raw, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:  # type: ignore[override]
        n = self._fh.readinto(buf)
        self.n += n or 0
        return n

    def close(self) -> None:
        self._fh.close()
        super().close()


class _Bounded(io.RawIOBase):
    """The decompressed side of a stream; raises CompressionBomb when it outgrows MAX_EXPANSION times the
    compressed bytes read (past BOMB_FLOOR)."""

    def __init__(self, decompressed, counted: _Counted, path: str):
        self._fh, self._counted, self._path, self.out = decompressed, counted, path, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:  # type: ignore[override]
        n = self._fh.readinto(buf)
        self.out += n or 0
        if self.out > BOMB_FLOOR and self.out > MAX_EXPANSION * max(1, self._counted.n):
            raise CompressionBomb(f"{self._path}: {self.out:,} bytes out of {self._counted.n:,} compressed")
        return n

    def close(self) -> None:
        try:
            self._fh.close()
        finally:
            self._counted.close()
            super().close()


@contextmanager
def open_binary(path: str | Path) -> Iterator[BinaryIO]:
    """Open ``path`` for streaming reads, decompressing ``.gz``/``.bz2``/``.zst`` on the fly (bounded:
    a stream expanding past MAX_EXPANSION times its compressed size raises CompressionBomb)."""
    p = str(path)
    if p.endswith(COMPRESSIONS):
        counted = _Counted(open(p, "rb"))  # type: ignore[arg-type]
        if p.endswith(".gz"):
            dec = gzip.GzipFile(fileobj=counted, mode="rb")
        elif p.endswith(".bz2"):
            dec = bz2.BZ2File(counted, "rb")
        else:
            dec = _ZstdTruncationCheck(counted)  # type: ignore[arg-type]
        fh: BinaryIO = io.BufferedReader(_Bounded(dec, counted, p), 1 << 16)  # type: ignore[assignment]
    else:
        fh = open(p, "rb")
    try:
        yield fh
    finally:
        fh.close()


def probe(path: str | Path) -> tuple[str | None, bytes]:
    """Look at the first few KB (decompressed): return (problem or None, head bytes).

    Problems: ``empty``, ``binary`` (NUL bytes: an image, an archive, a model file),
    ``corrupt_compression`` (the decompressor rejects the very start of the file).
    """
    head = b""
    try:
        with open_binary(path) as fh:
            # Small reads: a truncated stream still shows its first bytes before it fails.
            while len(head) < PROBE_BYTES and (block := fh.read(1024)):
                head += block
    except STREAM_ERRORS:
        if not head:
            return "corrupt_compression", head
        # A cut-off stream with readable text is reported (and counted) while reading it.
    if not head.strip() and len(head) < PROBE_BYTES:
        return "empty", head  # nothing, or only whitespace: no document, and it must not vanish uncounted
    if b"\x00" in head:
        return "binary", head
    return None, head


def iter_lines(path: str | Path, max_line_bytes: int) -> Iterator[Line]:
    """Decoded lines without their line ends (LF or CRLF), BOM removed; problems as BadLine.

    A line longer than ``max_line_bytes`` is skipped in bounded chunks and reported once. A stream that
    ends early (cut-off download) yields ``BadLine("truncated")`` and stops; one expanding like a
    decompression bomb yields ``BadLine("compression_bomb")`` and stops.
    """
    with open_binary(path) as fh:
        first = True
        while True:
            try:
                raw = fh.readline(max_line_bytes + 1)
                if len(raw) > max_line_bytes and not raw.endswith(b"\n"):
                    while (rest := fh.readline(1 << 20)) and not rest.endswith(b"\n"):
                        pass
                    yield BadLine("line_too_long")
                    continue
            except CompressionBomb:
                yield BadLine("compression_bomb")
                return
            except STREAM_ERRORS:
                yield BadLine("truncated")
                return
            if not raw:
                return
            if first:
                first = False
                if raw.startswith(BOM):
                    raw = raw[len(BOM) :]
            try:
                yield raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError:
                yield BadLine("invalid_utf8")


_PG_START = re.compile(r"^\s*\*\*\*\s*START OF (THE|THIS) PROJECT GUTENBERG", re.IGNORECASE)
_PG_END = re.compile(r"^\s*\*\*\*\s*END OF (THE|THIS) PROJECT GUTENBERG", re.IGNORECASE)
PG_HEADER_MAX_LINES = 400


def strip_gutenberg_lines(lines: Iterable[Line]) -> Iterator[Line]:
    """Drop a Project Gutenberg licence header (up to ``*** START OF ...``) and footer (from ``*** END``).

    Streaming: only the first PG_HEADER_MAX_LINES lines are held back while looking for the start
    marker; a file without one passes through unchanged. Several books concatenated in one file
    (``*** END`` followed later by another ``*** START``) come out separated by a :class:`BookBreak`,
    their licence text dropped: never the first book only.
    """
    it = iter(lines)
    held: list[Line] = []
    for line in it:
        held.append(line)
        if isinstance(line, str) and _PG_START.match(line):
            held = []
            break
        if len(held) >= PG_HEADER_MAX_LINES:
            break
    in_book = True
    for line in _chain(held, it):
        if not in_book:
            if isinstance(line, str) and _PG_START.match(line):
                in_book = True
                yield BookBreak()
            continue
        if isinstance(line, str) and _PG_END.match(line):
            in_book = False
            continue
        yield line


def _chain(first: list[Line], rest: Iterator[Line]) -> Iterator[Line]:
    yield from first
    yield from rest
