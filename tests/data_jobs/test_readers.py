"""Readers on hand-made fixtures of every format (plain and compressed) and on the real corpora."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contracts.common import UserError
from data_jobs.builtin_corpus import PREFIX, prose_paragraphs, units
from data_jobs.readers import ReadStats, detect_format, expand_inputs, read_documents, read_unit
from data_jobs.readers.mediawiki import wikitext_to_paragraphs
from data_jobs.readers.textio import probe
from shard_fixtures import cfg, compress, write_corpus


def docs_of(path, fmt="auto", **kw):
    stats = ReadStats()
    docs = list(read_documents(cfg([path], input_format=fmt, **kw), stats))
    return docs, stats


def test_bert_format_strips_bom_crlf_and_numbers_documents(tmp_path):
    paths = write_corpus(tmp_path)
    docs, stats = docs_of(paths["bert"], "bert")
    assert [d.sentences for d in docs] == [
        ["The first document starts here.", "It has two sentences."],
        ["Second document, one sentence."],
        ["Third document.", "With a second line.", "And a third."],
    ]
    assert [d.doc_id for d in docs] == ["sample.txt#0", "sample.txt#1", "sample.txt#2"]
    assert stats.documents_read == 3 and not stats.dropped


def test_books_strip_gutenberg_and_join_wrapped_lines(tmp_path):
    paths = write_corpus(tmp_path)
    (doc,), _ = docs_of(paths["books"], "books")
    assert doc.doc_id == "book.txt#0"
    assert doc.sentences == [
        "CHAPTER I.",
        "It was a bright cold day in April, and Mr. Smith walked slowly home.",
        "He did not hurry.",
        '"Is it far?" she asked.',
        "It was not far at all.",
    ]


def test_wikiextractor_drops_title_line(tmp_path):
    paths = write_corpus(tmp_path)
    docs, _ = docs_of(paths["wikiextractor"])
    assert [(d.doc_id, d.sentences) for d in docs] == [
        ("wiki_00#7", ["Seven is a number.", "It is odd.", "It comes after six."]),
        ("wiki_00#9", ["Nine is three squared."]),
    ]


@pytest.mark.parametrize("codec", ["", "bz2"])
def test_mediawiki_strips_markup_and_drops_non_articles(tmp_path, codec):
    paths = write_corpus(tmp_path)
    path = compress(paths["mediawiki"], codec) if codec else paths["mediawiki"]
    docs, stats = docs_of(path)
    assert [d.doc_id for d in docs] == [f"{path.name}#10", f"{path.name}#14"]
    alpha = " ".join(docs[0].sentences)
    assert "Alpha is the first letter of the Greek alphabet." in alpha
    assert "The letter came from the Phoenician aleph." in alpha
    for junk in ("Infobox", "cite", "TableCellText", "History", "caption", "Category", "{{", "[[", "<ref"):
        assert junk not in alpha
    assert dict(stats.dropped) == {"redirect": 1, "disambiguation": 1, "not_article": 1}


def test_wikitext_cleaning_keeps_link_text():
    paras = wikitext_to_paragraphs("See [[Paris|the capital]] and [[Lyon]].<ref name=a/> {{citation needed}}")
    assert paras == ["See the capital and Lyon."]


def test_jsonl_and_parquet_text_and_id_columns(tmp_path):
    paths = write_corpus(tmp_path)
    docs, _ = docs_of(paths["jsonl"], id_column="id")
    assert [(d.doc_id, d.sentences) for d in docs] == [
        ("web.jsonl#a1", ["A web page.", "It has text.", "And a second paragraph."]),
        ("web.jsonl#a2", ["Another page with one sentence."]),
    ]
    docs, _ = docs_of(paths["parquet"], text_column="doc")
    assert [(d.doc_id, d.sentences) for d in docs] == [
        ("web.parquet#0", ["Parquet text one.", "Two."]),
        ("web.parquet#1", ["Parquet text three."]),
    ]


@pytest.mark.parametrize("codec", ["gz", "bz2", "zst"])
@pytest.mark.parametrize("fmt", ["bert", "books", "wikiextractor", "jsonl", "parquet"])
def test_compressed_inputs_read_like_plain_ones(tmp_path, codec, fmt):
    paths = write_corpus(tmp_path)
    kw = {"text_column": "doc"} if fmt == "parquet" else {}
    plain, _ = docs_of(paths[fmt], **kw)
    packed, stats = docs_of(compress(paths[fmt], codec), **kw)
    assert [d.sentences for d in packed] == [d.sentences for d in plain] and plain
    assert not stats.dropped and not stats.files_skipped


def test_auto_detection(tmp_path, shared_data):
    paths = write_corpus(tmp_path)
    for fmt, path in paths.items():
        assert detect_format(str(path), probe(path)[1]) == fmt
    corpus = shared_data / "corpus"
    for rel, fmt in [("bert_sample/sample_text.txt", "bert"), ("gutenberg/pg11_alice_in_wonderland.txt", "books"),
                     ("wikipedia_mlperf/wiki_00", "wikiextractor")]:
        assert detect_format(str(corpus / rel), probe(corpus / rel)[1]) == fmt


def test_expand_inputs_dirs_globs_and_stable_sources(tmp_path):
    write_corpus(tmp_path / "a")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "sample.txt").write_text("Other.\n", encoding="utf-8")
    (tmp_path / "a" / ".hidden").write_text("x", encoding="utf-8")
    got = expand_inputs(cfg([tmp_path / "a", str(tmp_path / "b" / "*.txt"), tmp_path / "a" / "sample.txt"]))
    assert [u.source for u in got] == [
        "a/book.txt", "a/dump.xml", "a/sample.txt", "a/web.jsonl", "a/web.parquet", "a/wiki_00", "b/sample.txt",
    ]
    with pytest.raises(UserError, match="no such file"):
        expand_inputs(cfg([tmp_path / "missing.txt"]))
    with pytest.raises(UserError, match="no files match"):
        expand_inputs(cfg([str(tmp_path / "*.nothing")]))


@pytest.mark.shared_data
def test_real_gutenberg_book_has_no_licence_text(shared_data):
    docs, stats = docs_of(shared_data / "corpus/gutenberg/pg11_alice_in_wonderland.txt")
    (doc,) = docs
    text = " ".join(doc.sentences)
    assert "Project Gutenberg" not in text and "\ufeff" not in text and "\r" not in text
    assert "Alice was beginning to get very tired" in text
    assert len(doc.sentences) > 900


@pytest.mark.shared_data
def test_real_wikiextractor_and_bert_sample(shared_data):
    docs, _ = docs_of(shared_data / "corpus/wikipedia_mlperf/wiki_00")
    assert len(docs) == 37 and len({d.doc_id for d in docs}) == 37
    assert docs[0].doc_id == "wiki_00#12" and docs[0].sentences[0].startswith("Anarchism is")
    docs, _ = docs_of(shared_data / "corpus/bert_sample/sample_text.txt")
    ref = (shared_data / "corpus/bert_sample/sample_text.txt").read_text(encoding="utf-8").split("\n\n")
    assert [d.sentences for d in docs] == [[s.strip() for s in r.strip().split("\n")] for r in ref]


def test_builtin_corpus_is_deterministic_documentation():
    us = units(PREFIX)
    assert us[0].source == "python-docs/topics" and len(us) > 100
    assert us == units(PREFIX)
    config = cfg([PREFIX])
    topics = list(read_unit(us[0], config, ReadStats()))
    assert [d.doc_id for d in topics] == sorted(d.doc_id for d in topics) and len(topics) > 50
    assert any("assert" in s for d in topics if d.doc_id.endswith("#assert") for s in d.sentences)
    mods = [d for u in us[1:12] for d in read_unit(u, config, ReadStats())]
    assert mods == [d for u in us[1:12] for d in read_unit(u, config, ReadStats())] and mods
    assert not any(s.startswith(">>>") for d in mods for s in d.sentences)


def test_prose_paragraphs_skip_code():
    text = "Some prose here.\n\n   code_block = 1\n\n>>> 1 + 1\n2\n\nTitle\n=====\n\nMore prose."
    assert prose_paragraphs(text) == ["Some prose here.", "Title", "More prose."]


def test_min_sentences_drops_are_counted(tmp_path):
    paths = write_corpus(tmp_path)
    docs, stats = docs_of(paths["bert"], min_sentences=2)
    assert len(docs) == 2 and stats.dropped == {"too_few_sentences": 1} and stats.documents_read == 3


def test_parquet_row_batches_and_null_text(tmp_path):
    path = tmp_path / "big.parquet"
    texts = [f"Row {i} text." if i % 100 else None for i in range(1000)]
    pq.write_table(pa.table({"text": texts}), path, row_group_size=300)
    docs, stats = docs_of(path)
    assert len(docs) == 990 and stats.dropped == {"missing_text": 10}
    assert docs[-1].doc_id == "big.parquet#999"


def test_multi_frame_zstd(tmp_path):
    import zstandard

    c = zstandard.ZstdCompressor()
    path = tmp_path / "two.txt.zst"
    path.write_bytes(c.compress(b"Frame one.\n\n") + c.compress(b"Frame two.\n"))
    docs, stats = docs_of(path, "bert")
    assert [d.sentences for d in docs] == [["Frame one."], ["Frame two."]] and not stats.dropped


_sentence = st.text(
    alphabet=st.characters(blacklist_categories=("Cs", "Cc", "Zl", "Zp"), blacklist_characters="\ufeff\x85"),
    min_size=1, max_size=30,
).map(lambda s: " ".join(s.split())).filter(bool)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(docs=st.lists(st.lists(_sentence, min_size=1, max_size=4), min_size=1, max_size=5), crlf=st.booleans())
def test_bert_format_round_trips(tmp_path, docs, crlf):
    """Any documents written in the BERT format (LF or CRLF) read back exactly, ids in order."""
    nl = "\r\n" if crlf else "\n"
    path = tmp_path / "rt.txt"
    path.write_bytes(nl.join(nl.join(d) + nl for d in docs).encode("utf-8"))
    got, stats = docs_of(path, "bert")
    assert [d.sentences for d in got] == docs
    assert [d.doc_id for d in got] == [f"rt.txt#{i}" for i in range(len(docs))] and not stats.dropped
