"""Small hand-made inputs for the reader, bad-input and shard-job tests (written into tmp dirs)."""
from __future__ import annotations

import bz2
import gzip
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import zstandard

from data_jobs.config import ShardConfig

BERT_TEXT = (
    "\ufeffThe first document starts here.\r\nIt has two sentences.\r\n\r\n"
    "Second document, one sentence.\r\n\r\n\r\n"
    "Third document.\r\nWith a second line.\r\nAnd a third.\r\n"
)
BOOK_TEXT = """\ufeffThe Project Gutenberg eBook of A Test Book

This ebook is for the use of anyone anywhere in the United States.

*** START OF THE PROJECT GUTENBERG EBOOK A TEST BOOK ***

CHAPTER I.

It was a bright cold day in April, and Mr. Smith
walked slowly home. He did not hurry.

"Is it far?" she asked. It was not far at
all.

*** END OF THE PROJECT GUTENBERG EBOOK A TEST BOOK ***

Section 1. General Terms of Use and Redistributing Project Gutenberg electronic works.
""".replace("\n", "\r\n")
MEDIAWIKI_XML = """<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/" version="0.10">
  <siteinfo><sitename>Wikipedia</sitename></siteinfo>
  <page>
    <title>Alpha</title><ns>0</ns><id>10</id>
    <revision><id>1</id><text xml:space="preserve">{{Infobox thing|name=Alpha|size=3}}
'''Alpha''' is the first letter of the [[Greek alphabet]].&lt;ref&gt;{{cite book|title=Letters}}&lt;/ref&gt; It has the value one.

== History ==
The letter came from the [[Phoenicia|Phoenician]] aleph.
{| class="wikitable"
|-
| TableCellText || MoreCells
|}
[[File:Alpha.svg|thumb|An alpha glyph in a caption.]]
[[Category:Letters]]
</text></revision>
  </page>
  <page>
    <title>Alfa</title><ns>0</ns><id>11</id><redirect title="Alpha" />
    <revision><id>2</id><text xml:space="preserve">#REDIRECT [[Alpha]]</text></revision>
  </page>
  <page>
    <title>Beta (disambiguation)</title><ns>0</ns><id>12</id>
    <revision><id>3</id><text xml:space="preserve">'''Beta''' may refer to:
* [[Beta (letter)]]
{{disambiguation}}</text></revision>
  </page>
  <page>
    <title>Talk:Alpha</title><ns>1</ns><id>13</id>
    <revision><id>4</id><text xml:space="preserve">Please discuss here.</text></revision>
  </page>
  <page>
    <title>Gamma</title><ns>0</ns><id>14</id>
    <revision><id>5</id><text xml:space="preserve">'''Gamma''' is the third letter. It follows beta.</text></revision>
  </page>
</mediawiki>
"""
JSONL_ROWS = [
    {"id": "a1", "text": "A web page. It has text.\n\nAnd a second paragraph."},
    {"id": "a2", "text": "Another page with one sentence."},
]


def compress(path: Path, codec: str) -> Path:
    """Write path.<codec> next to path and return it."""
    data = path.read_bytes()
    out = path.with_name(path.name + "." + codec)
    if codec == "gz":
        out.write_bytes(gzip.compress(data))
    elif codec == "bz2":
        out.write_bytes(bz2.compress(data))
    else:
        out.write_bytes(zstandard.ZstdCompressor().compress(data))
    return out


def write_corpus(d: Path) -> dict[str, Path]:
    """One file of each format in ``d``."""
    d.mkdir(parents=True, exist_ok=True)
    paths = {
        "bert": d / "sample.txt",
        "books": d / "book.txt",
        "mediawiki": d / "dump.xml",
        "jsonl": d / "web.jsonl",
        "parquet": d / "web.parquet",
        "wikiextractor": d / "wiki_00",
    }
    paths["bert"].write_bytes(BERT_TEXT.encode())
    paths["books"].write_bytes(BOOK_TEXT.encode())
    paths["mediawiki"].write_text(MEDIAWIKI_XML, encoding="utf-8")
    paths["jsonl"].write_text("".join(json.dumps(r) + "\n" for r in JSONL_ROWS), encoding="utf-8")
    pq.write_table(pa.table({"doc": ["Parquet text one. Two.", "Parquet text three."], "n": [1, 2]}), paths["parquet"])
    paths["wikiextractor"].write_text(
        '<doc id="7" url="https://x/?curid=7" title="Seven">\nSeven\n\nSeven is a number. It is odd.\n\n'
        "It comes after six.\n</doc>\n"
        '<doc id="9" url="https://x/?curid=9" title="Nine">\nNine\n\nNine is three squared.\n</doc>\n',
        encoding="utf-8",
    )
    return paths


def cfg(inputs, out="unused", **kw) -> ShardConfig:
    return ShardConfig(inputs=[str(p) for p in inputs], output_dir=str(out), **kw)
