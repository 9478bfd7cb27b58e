"""Generated hostile inputs for the readers (issue 24): BERT plain text, JSONL and WikiExtractor, each
plain, gzip/bz2/zstd-compressed and truncated, read in-process (no Ray, no job).

Generators know the structure they write (how many documents a file holds), so each case checks:
no exception but UserError; **conservation**: every document the file holds is read, and every document
read is kept or counted under a reason (a whole file skipped is counted as a skipped file, with no
document read from it). A truncated file may lose its tail, never more than it holds plus the one
document cut in half. Settings: tests/fuzz_settings.py; found failures are kept as ``@example``s.
"""
from __future__ import annotations

import bz2
import gzip
import json
import sys
from pathlib import Path

import zstandard
from hypothesis import assume, example, given
from hypothesis import strategies as st

from contracts.common import UserError
from data_jobs.readers import ReadStats, Unit, read_unit
from fuzz_settings import fuzz
from shard_fixtures import cfg

MAX_LINE = 1024  # the smallest max_line_bytes: long-line cases stay cheap
WORDS = st.sampled_from(["the", "Cat", "sat.", "é", "漢字", "🙂", "naïve", "x" * 40, "1.5", "—", "«q»", "\u202e"])
SENTENCE = st.lists(WORDS, min_size=1, max_size=8).map(" ".join)
CODECS = st.sampled_from(["", ".gz", ".bz2", ".zst"])
# Lines that are damaged: each stays inside the document it is in, and is counted as damaged there.
BAD_LINES = st.sampled_from([b"\xff\xfe bad utf8", b"caf\xe9 latin-1", b"x" * (MAX_LINE + 10), b"\xed\xa0\x80 surrogate"])


def compress(data: bytes, codec: str) -> bytes:
    if codec == ".gz":
        return gzip.compress(data)
    if codec == ".bz2":
        return bz2.compress(data)
    if codec == ".zst":
        return zstandard.ZstdCompressor().compress(data)
    return data


def read(tmp: Path, name: str, data: bytes, codec: str, fmt: str, cut: float | None, max_line=MAX_LINE, **kw):
    """Write ``data`` (compressed, then cut at a fraction of its bytes) and read it as ``fmt``."""
    blob = compress(data, codec)
    if cut is not None:
        blob = blob[: int(len(blob) * cut)]
    path = tmp / (name + codec)
    path.write_bytes(blob)
    stats = ReadStats()
    config = cfg([path], input_format=fmt, max_line_bytes=max_line, sentence_splitter="blingfire", **kw)
    docs = list(read_unit(Unit(str(path), path.name, fmt), config, stats))
    assert stats.kept == len(docs)
    assert len({d.doc_id for d in docs}) == len(docs), "doc_ids repeat within one file"
    assert all(d.sentences and all(s.strip() for s in d.sentences) for d in docs)
    return docs, stats


def conserved(stats: ReadStats, expected: int, cut: float | None, extra: int = 0) -> None:
    """Every document of the file read and accounted for (or the whole file skipped and counted)."""
    read = stats.documents_read - extra
    assert stats.files_read + sum(stats.files_skipped.values()) == 1, "one file, counted once"
    assert stats.kept + sum(stats.dropped.values()) == stats.documents_read
    if stats.files_skipped:
        assert sum(stats.files_skipped.values()) == 1 and stats.documents_read == 0
    elif cut is None:
        assert read == expected, f"{read} documents read and counted, the file holds {expected}: {stats.to_dict()}"
    else:
        assert read <= expected + 1, stats.to_dict()


TRUNCATION = st.one_of(st.none(), st.floats(0.0, 1.0))
BERT_DOC = st.lists(st.one_of(SENTENCE.map(str.encode), BAD_LINES), min_size=1, max_size=5)


@given(docs=st.lists(BERT_DOC, max_size=6), codec=CODECS, cut=TRUNCATION, crlf=st.booleans(), bom=st.booleans())
@fuzz(400)
def test_bert_plain_text(tmp_path_factory, docs, codec, cut, crlf, bom):
    nl = b"\r\n" if crlf else b"\n"
    data = (b"\xef\xbb\xbf" if bom else b"") + (nl + nl).join(nl.join(d) for d in docs) + nl
    _, stats = read(tmp_path_factory.mktemp("bert"), "corpus.txt", data, codec, "bert", cut)
    conserved(stats, len(docs), cut)


def nested(n: int) -> str:
    return '{"text": ' + "[" * n + "]" * n + "}"


RECORD = st.one_of(
    st.builds(lambda t, i: json.dumps({"text": t, "id": i}, ensure_ascii=False), SENTENCE, st.integers(0, 9)),
    st.builds(lambda t: json.dumps({"text": t}), st.one_of(st.integers(), st.none(), st.lists(SENTENCE, max_size=2),
                                                          st.dictionaries(SENTENCE, SENTENCE, max_size=2))),
    st.sampled_from(['{"text": "\\udc80 lone surrogate"}', '{"text": ""}', '{"text": "   "}', "[1, 2]", "42",
                     '"text"', "null", '{"text": "unclosed', "{", '{"text": "a", "text": "b"}', "{}",
                     '{"text": NaN}', '{"text": "x"} trailing']),
    st.sampled_from([200, 5_000, 100_000]).map(nested),  # records nested deeply: RecursionError (issue 24)
)


JSONL_LINE = 300_000  # a record nested 100,000 deep is 200 kB: read, not skipped as too long
JSONL_BAD = st.one_of(BAD_LINES.filter(lambda b: len(b) < MAX_LINE), st.just(b"x" * (JSONL_LINE + 10)))


@given(records=st.lists(st.one_of(RECORD.map(str.encode), JSONL_BAD), max_size=8), codec=CODECS, cut=TRUNCATION,
       blank=st.booleans())
@fuzz(400)
@example(records=[nested(100_000).encode()], codec="", cut=None, blank=False)  # RecursionError traceback
@example(records=[nested(100_000).encode()], codec=".gz", cut=None, blank=False)
def test_jsonl(tmp_path_factory, records, codec, cut, blank):
    lead = [json.dumps({"text": "A first good record.", "id": 0}).encode()]  # the text column exists
    lines = lead + records
    data = (b"\n\n" if blank else b"\n").join(lines) + b"\n"
    try:
        _, stats = read(tmp_path_factory.mktemp("jsonl"), "corpus.jsonl", data, codec, "jsonl", cut, JSONL_LINE)
    except UserError as err:
        assert "\n" not in str(err) and "corpus.jsonl" in str(err)
        assert cut is not None, err  # the first record has the text column: only a cut file may miss it
        return
    conserved(stats, len(lines), cut)


WIKI_DOC = st.tuples(st.sampled_from(["Title", "é 漢", "A&amp;B", ""]), st.lists(st.one_of(SENTENCE.map(str.encode),
                                                                                       BAD_LINES), max_size=4),
                     st.sampled_from(["closed", "closed", "unclosed", "outside-text"]))


def wiki_file(docs) -> tuple[bytes, int, int]:
    """A WikiExtractor file of ``docs``: (bytes, documents it holds, runs of text outside any <doc>)."""
    out, outside = [], 0
    for i, (title, lines, shape) in enumerate(docs):
        out.append(f'<doc id="{i}" url="https://x/?curid={i}" title="{title}">'.encode())
        out.append(title.encode())
        out += lines
        if shape != "unclosed":
            out.append(b"</doc>")
        if shape == "outside-text":
            out.append(b"stray text between documents.")
            outside += 1
    return b"\n".join(out) + b"\n", len(docs), outside


@given(docs=st.lists(WIKI_DOC, max_size=5), codec=CODECS, cut=TRUNCATION)
@fuzz(400)
@example(docs=[("", [b"\xff"], "closed")], codec="", cut=None)  # counted twice: invalid_utf8, then truncated
@example(docs=[], codec="", cut=None)  # (an empty file: skipped, counted once)
def test_wikiextractor(tmp_path_factory, docs, codec, cut):
    data, expected, outside = wiki_file(docs)
    _, stats = read(tmp_path_factory.mktemp("wiki"), "wiki_00", data, codec, "wikiextractor", cut)
    conserved(stats, expected, cut, extra=stats.dropped.get("text_outside_doc", 0))
    if cut is None and not stats.files_skipped:
        assert stats.dropped.get("text_outside_doc", 0) == outside


@given(fmt=st.sampled_from(["auto", "bert", "books", "jsonl", "wikiextractor", "mediawiki"]), codec=CODECS,
       data=st.one_of(st.binary(max_size=300), st.text(max_size=300).map(lambda t: t.encode("utf-8", "surrogatepass"))),
       cut=TRUNCATION)
@fuzz(400)
def test_any_bytes_any_format(tmp_path_factory, fmt, codec, data, cut):
    """Unstructured bytes as any format: at worst a UserError line; what is read is accounted for."""
    try:
        _, stats = read(tmp_path_factory.mktemp("any"), "input", data, codec, fmt, cut)
    except UserError as err:
        assert "\n" not in str(err) and str(err).strip()
        return
    assert stats.kept + sum(stats.dropped.values()) == stats.documents_read


def xml_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def deep_markup(kind: tuple[str, str], n: int) -> str:
    return kind[0] * n + "x" + kind[1] * n


WIKITEXT = st.lists(st.one_of(
    SENTENCE, SENTENCE.map(lambda s: f"{{{{Infobox|name={s}}}}}"), SENTENCE.map(lambda s: f"[[Link|{s}]]"),
    SENTENCE.map(lambda s: f"<ref>{s}</ref>"), st.just("== Heading =="), st.just("{{disambiguation}}"),
    st.just("#REDIRECT [[Elsewhere]]"), st.just("[[Category:X]]"), st.just("{| class=x\n| cell\n|}"),
    st.builds(deep_markup, st.sampled_from([("{{a|", "}}"), ("{{{", "}}}"), ("[[a|", "]]"), ("<ref>", "</ref>"),
                                            ("<b>", "</b>"), ("{|\n", "\n|}")]), st.sampled_from([5, 120, 800, 5000])),
), max_size=4).map("\n\n".join)
PAGE = st.tuples(st.sampled_from(["Title", "X (disambiguation)", "é 漢 & <b>"]), st.sampled_from(["0", "0", "1", ""]),
                 st.booleans(), WIKITEXT)


def mediawiki_file(pages) -> bytes:
    out = ['<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/">']
    for i, (title, ns, redirect, text) in enumerate(pages):
        out.append(f"<page><title>{xml_escape(title)}</title><ns>{ns}</ns><id>{i}</id>"
                   + ('<redirect title="Elsewhere" />' if redirect else "")
                   + f'<revision><id>{i}</id><text xml:space="preserve">{xml_escape(text)}</text></revision></page>')
    out.append("</mediawiki>")
    return "\n".join(out).encode()


@given(pages=st.lists(PAGE, max_size=4), codec=CODECS, cut=TRUNCATION)
@fuzz(150)
def test_mediawiki(tmp_path_factory, pages, codec, cut):
    data = mediawiki_file(pages)
    _, stats = read(tmp_path_factory.mktemp("mw"), "dump.xml", data, codec, "mediawiki", cut)
    conserved(stats, len(pages), cut)


def test_found_recursion_cases_outside_hypothesis(tmp_path):
    """The RecursionErrors found, at the interpreter's default recursion limit (Hypothesis raises the limit
    while a property runs, which hides mwparserfromhell's: its tokenizer stops nesting at depth 100).
    Pinned to that default here: a limit raised earlier in the process (seen once in a full-suite run) lets
    the parser through, and the page then counts as no_text, also conserved, but not the case under test."""
    page = mediawiki_file([("T", "0", False, deep_markup(("{{{", "}}}"), 800))])
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(1000)  # CPython's default
    try:
        _, stats = read(tmp_path, "dump.xml", page, "", "mediawiki", None)
    finally:
        sys.setrecursionlimit(limit)
    assert stats.dropped == {"markup_too_deep": 1}
    record = (json.dumps({"text": "A first good record."}) + "\n" + nested(100_000) + "\n").encode()
    _, stats = read(tmp_path, "deep.jsonl", record, ".gz", "jsonl", None, JSONL_LINE)
    assert stats.kept == 1 and stats.dropped == {"bad_json": 1}
