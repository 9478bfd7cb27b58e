"""Damaged input: each case is skipped and counted by reason (default) or stops the run with one line
naming the file (on_bad_input="fail", and for configuration mistakes such as a missing text column)."""
from __future__ import annotations

import bz2
import gzip
import json
import os
import tracemalloc

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from contracts.common import UserError
from data_jobs.readers import ReadStats, read_documents
from data_jobs.shard_job import main as shard_main
from shard_fixtures import BERT_TEXT, MEDIAWIKI_XML, cfg


def read(path, fmt="auto", **kw):
    stats = ReadStats(strict=kw.get("on_bad_input") == "fail")
    return list(read_documents(cfg([path], input_format=fmt, **kw), stats)), stats


def many_docs(n: int) -> bytes:
    return "".join(f"Document {i} starts. It has words {i * 7919 % 10007}.\n\n" for i in range(n)).encode()


def test_missing_path_is_one_line_error(tmp_path, capsys):
    rc = shard_main(["--input", str(tmp_path / "nope.txt"), "--output-dir", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err == f"bertflow: error: {tmp_path / 'nope.txt'}: no such file or directory"


def test_empty_and_binary_files_are_skipped_and_counted(tmp_path):
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + os.urandom(2000))
    (tmp_path / "good.txt").write_bytes(BERT_TEXT.encode())
    docs, stats = read(tmp_path)
    assert len(docs) == 3 and stats.files_skipped == {"empty": 1, "binary": 1}
    assert any("image.png: binary" in p for p in stats.problems)
    with pytest.raises(UserError, match="empty.txt: empty file"):
        read(tmp_path, on_bad_input="fail")


def test_invalid_utf8_drops_only_its_document(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_bytes(b"Good one.\n\nBad \xff\xfe bytes here.\nMore.\n\nGood two.\n")
    docs, stats = read(path, "bert")
    assert [d.doc_id for d in docs] == ["bad.txt#0", "bad.txt#2"]  # ids do not shift after a bad doc
    assert stats.dropped == {"invalid_utf8": 1} and stats.documents_read == 3
    with pytest.raises(UserError, match=r"bad.txt: invalid UTF-8"):
        read(path, "bert", on_bad_input="fail")


@pytest.mark.slow
def test_a_200_mb_line_is_skipped_in_bounded_memory(tmp_path):
    path = tmp_path / "huge.txt"
    with open(path, "wb") as f:
        f.write(b"Before it.\n\n")
        block = b"x" * (1 << 20)
        for _ in range(200):
            f.write(block)
        f.write(b"\nTail of that document.\n\nAfter it.\n")
    tracemalloc.start()
    try:
        docs, stats = read(path, "bert")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    path.unlink()
    assert [d.sentences for d in docs] == [["Before it."], ["After it."]]
    assert stats.dropped == {"line_too_long": 1}
    assert peak < 40 << 20, f"peak Python memory {peak / 1e6:.0f} MB for a 200 MB line"


@pytest.mark.parametrize("codec", ["gz", "bz2"])
def test_truncated_archive_keeps_what_came_before(tmp_path, codec):
    # bz2 decodes whole blocks only (100 kB at level 1): enough text that half the file holds some.
    data = many_docs(12000)
    packed = gzip.compress(data) if codec == "gz" else bz2.compress(data, compresslevel=1)
    path = tmp_path / f"cut.txt.{codec}"
    path.write_bytes(packed[: len(packed) // 2])
    docs, stats = read(path, "bert")
    assert 0 < len(docs) < 12000 and stats.dropped == {"truncated": 1}
    assert [d.doc_id for d in docs] == [f"cut.txt.{codec}#{i}" for i in range(len(docs))]
    with pytest.raises(UserError, match=rf"cut.txt.{codec}: the file ends early"):
        read(path, "bert", on_bad_input="fail")


def test_truncated_zst_is_detected(tmp_path):
    import zstandard

    packed = zstandard.ZstdCompressor().compress(many_docs(12000))  # several 128 kB blocks
    path = tmp_path / "cut.txt.zst"
    path.write_bytes(packed[: len(packed) // 2])
    docs, stats = read(path, "bert")
    assert 0 < len(docs) < 12000 and stats.dropped == {"truncated": 1}


def test_malformed_xml_keeps_earlier_pages(tmp_path):
    path = tmp_path / "dump.xml"
    broken = MEDIAWIKI_XML.replace("<title>Gamma</title>", "<title>Gamma</titl>")
    path.write_text(broken, encoding="utf-8")
    docs, stats = read(path)
    assert [d.doc_id for d in docs] == ["dump.xml#10"]
    assert stats.dropped["malformed_xml"] == 1
    assert any("dump.xml: malformed XML: mismatched tag" in p for p in stats.problems)


def test_jsonl_bad_line_is_dropped_and_counted(tmp_path):
    path = tmp_path / "web.jsonl"
    path.write_text('{"text": "Fine one."}\n{"text": "cut off\n[1, 2]\n{"text": 5}\n{"text": "Fine two."}\n')
    docs, stats = read(path)
    assert [d.doc_id for d in docs] == ["web.jsonl#0", "web.jsonl#4"]
    assert stats.dropped == {"bad_json": 2, "missing_text": 1}


def test_wrong_text_column_is_a_one_line_error(tmp_path):
    pq.write_table(pa.table({"content": ["Some text."]}), tmp_path / "data.parquet")
    with pytest.raises(UserError, match=r"data.parquet: no column 'text' \(columns: content\)"):
        read(tmp_path / "data.parquet")
    (tmp_path / "data.jsonl").write_text(json.dumps({"content": "Some text."}) + "\n")
    with pytest.raises(UserError, match=r"data.jsonl: no key 'text' in the first record"):
        read(tmp_path / "data.jsonl")


def test_corrupt_parquet_is_skipped(tmp_path):
    (tmp_path / "x.parquet").write_bytes(b"PAR1 this is not really parquet")
    docs, stats = read(tmp_path / "x.parquet")
    assert docs == [] and stats.files_skipped == {"corrupt_parquet": 1}
