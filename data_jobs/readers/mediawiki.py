"""MediaWiki XML dumps (``pages-articles*.xml[.bz2]``), streamed page by page with iterparse.

Markup is stripped with mwparserfromhell (the maintained wikitext parser): templates (infoboxes,
citations), tables, references, galleries, math, files/images and categories are removed, headings
dropped (they are not sentences), and what remains is split into sentences line by line.
Pages outside the article namespace, redirects and disambiguation pages are dropped and counted.
doc_id = ``<source>#<page id>``.
"""
from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from typing import Iterator

import mwparserfromhell

from data_jobs.readers.base import Document, ReadStats
from data_jobs.readers.textio import STREAM_ERRORS, CompressionBomb, open_binary
from data_jobs.segment import split_paragraph

# Tags whose content is not running prose.
_DROP_TAGS = {
    "ref", "references", "table", "gallery", "math", "chem", "code", "pre", "source", "syntaxhighlight",
    "timeline", "score", "imagemap", "graph", "mapframe", "templatedata", "poem", "hiero", "sup", "sub",
}
_DROP_LINK_PREFIXES = ("file:", "image:", "category:", "media:")
_DISAMBIG = re.compile(
    r"\{\{\s*(disambiguation|disambig|dab|disamb|hndis|geodis|numberdis|surname|given name|set index)\s*[|}]",
    re.IGNORECASE,
)


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def _child_text(elem: ET.Element, name: str) -> str | None:
    for child in elem:
        if _local(child.tag) == name:
            return child.text or ""
    return None


def _page_fields(page: ET.Element) -> dict:
    fields = {"title": _child_text(page, "title") or "", "ns": _child_text(page, "ns") or "0",
              "id": _child_text(page, "id") or "", "redirect": False, "text": ""}
    for child in page:
        name = _local(child.tag)
        if name == "redirect":
            fields["redirect"] = True
        elif name == "revision":
            fields["text"] = _child_text(child, "text") or ""
    return fields


def wikitext_to_paragraphs(wikitext: str) -> list[str]:
    """Plain-text paragraphs (one per non-empty line) of an article's wikitext."""
    code = mwparserfromhell.parse(wikitext)
    doomed = list(code.filter_templates(recursive=False)) + list(code.filter_headings(recursive=False))
    doomed += [t for t in code.filter_tags(recursive=True) if str(t.tag).strip().lower() in _DROP_TAGS]
    doomed += [
        link for link in code.filter_wikilinks(recursive=True)
        if str(link.title).strip().lower().startswith(_DROP_LINK_PREFIXES)
    ]
    for node in doomed:
        try:
            code.remove(node)
        except ValueError:  # already gone with an enclosing node
            pass
    text = code.strip_code(normalize=True, collapse=True)
    return [line.strip() for line in text.split("\n") if line.strip()]


def read_mediawiki(path: str, source: str, config, stats: ReadStats) -> Iterator[Document]:
    with open_binary(path) as fh:
        root = None
        try:
            for event, elem in ET.iterparse(fh, events=("start", "end")):
                if root is None:
                    root = elem
                if event != "end" or _local(elem.tag) != "page":
                    continue
                page = _page_fields(elem)
                # Free the parsed page (and its empty shell under the root): memory stays per page.
                elem.clear()
                root.clear()
                doc = _page_to_document(page, path, source, config, stats)
                if doc is not None:
                    yield doc
        except ET.ParseError as err:
            stats.bad_document(path, "malformed_xml", str(err))
        except STREAM_ERRORS as err:
            why = "compression_bomb" if isinstance(err, CompressionBomb) else "truncated"
            stats.bad_document(path, why, type(err).__name__)


def _page_to_document(page: dict, path: str, source: str, config, stats: ReadStats) -> Document | None:
    text = page["text"]
    if page["ns"].strip() != "0":
        stats.drop("not_article")
    elif page["redirect"] or text.lstrip()[:9].upper() == "#REDIRECT":
        stats.drop("redirect")
    elif "(disambiguation)" in page["title"] or _DISAMBIG.search(text):
        stats.drop("disambiguation")
    else:
        try:
            paragraphs = wikitext_to_paragraphs(text)
        except RecursionError:  # e.g. template arguments {{{ nested 800 deep: the parser's own recursion
            stats.bad_document(path, "markup_too_deep", f"page {page['id'] or page['title']}")
            return None
        sentences = [s for p in paragraphs for s in split_paragraph(p, config.sentence_splitter)]
        if sentences:
            return Document(f"{source}#{page['id'] or page['title']}", source, sentences)
        stats.drop("no_text")
    return None
