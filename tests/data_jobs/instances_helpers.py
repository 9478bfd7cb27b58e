"""Test helpers for the vocab and instances jobs: document shards written straight with pyarrow (so
these tests do not depend on the shard job), naive readers of the real corpora, tiny vocabularies."""
from __future__ import annotations

import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from contracts.schema import DOCUMENTS_SCHEMA, Manifest, file_entry
from data_jobs.tokenization import SPECIAL_TOKENS

_SENT_END = re.compile(r"(?<=[.!?])\s+(?=[\"'A-Z])")


def write_documents(out_dir: Path, documents: list[list[str]], num_shards: int = 2) -> Path:
    """DOCUMENTS_SCHEMA shards (document i -> shard i % num_shards) plus a "documents" manifest."""
    out_dir.mkdir(parents=True, exist_ok=True)
    files = []
    for s in range(num_shards):
        rows = [{"doc_id": f"doc-{i}", "source": "test", "sentences": d}
                for i, d in enumerate(documents) if i % num_shards == s]
        path = out_dir / f"shard-{s:05d}.parquet"
        pq.write_table(pa.Table.from_pylist(rows, schema=DOCUMENTS_SCHEMA), path)
        files.append(file_entry(path, len(rows), shard=s))
    Manifest(kind="documents", config={"made_by": "test"}, config_hash="test", files=files).write(out_dir)
    return out_dir


def bert_sample_documents(shared_data: Path) -> list[list[str]]:
    """BERT's sample_text.txt: one sentence per line, blank line between documents."""
    text = (shared_data / "corpus" / "bert_sample" / "sample_text.txt").read_text(encoding="utf-8")
    docs = [[line.strip() for line in block.split("\n") if line.strip()] for block in text.split("\n\n")]
    return [d for d in docs if d]


def book_documents(path: Path, max_chars: int | None = None, paragraphs_per_doc: int = 40) -> list[list[str]]:
    """A Gutenberg book, naively: body between the START/END markers, paragraphs joined, split at
    sentence punctuation, every `paragraphs_per_doc` paragraphs one document."""
    text = path.read_text(encoding="utf-8-sig").replace("\r\n", "\n")
    start = text.find("*** START OF")
    end = text.find("*** END OF")
    body = text[text.find("\n", start) + 1 if start >= 0 else 0: end if end >= 0 else None]
    if max_chars:
        body = body[:max_chars]
    paras = [" ".join(p.split()) for p in re.split(r"\n\s*\n", body)]
    paras = [p for p in paras if p]
    docs = []
    for i in range(0, len(paras), paragraphs_per_doc):
        sents = [s for p in paras[i:i + paragraphs_per_doc] for s in _SENT_END.split(p) if s.strip()]
        if sents:
            docs.append(sents)
    return docs


def wiki_documents(path: Path) -> list[list[str]]:
    """WikiExtractor output: <doc ...> title, paragraphs one per line </doc>; naive sentence split."""
    docs = []
    for block in re.findall(r"<doc[^>]*>(.*?)</doc>", path.read_text(encoding="utf-8"), flags=re.S):
        lines = [ln.strip() for ln in block.strip().split("\n")[1:] if ln.strip()]
        sents = [s for ln in lines for s in _SENT_END.split(ln) if s.strip()]
        if sents:
            docs.append(sents)
    return docs


def write_tiny_vocab(path: Path, words: list[str]) -> Path:
    path.write_text("\n".join(list(SPECIAL_TOKENS) + words) + "\n", encoding="utf-8")
    return path
