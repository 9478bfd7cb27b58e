"""``builtin:python-docs``: a smoke-test corpus that every Python installation already holds.

English documentation shipped with the interpreter, read at run time (no text is copied into this
repository): the help topics of ``pydoc_data.topics`` (the language reference sections ``help()``
shows) and the docstrings of the standard library's modules, classes and functions, read from the
source files with ``ast`` (nothing is imported, so no module's import side effects run).

It is a few MB of real English prose, deterministic for a given Python version: good for testing the
pipeline end to end offline, far too small and too technical to pretrain a useful model on.
"""
from __future__ import annotations

import ast
import re
import sysconfig
from pathlib import Path
from typing import Iterator

from pydoc_data.topics import topics

from contracts.common import UserError
from data_jobs.readers.base import Document, ReadStats, Unit
from data_jobs.segment import split_paragraph

NAME = "python-docs"
PREFIX = f"builtin:{NAME}"
# Packages that are tests, tools, GUIs or vendored code rather than documented library API.
_SKIP_PARTS = {"test", "tests", "site-packages", "dist-packages", "idlelib", "lib2to3", "tkinter",
               "turtledemo", "ensurepip", "__pycache__", "config-3", "venv"}
_UNDERLINE = re.compile(r"^\s*([*=\-~^\"'#+])\1{2,}\s*$")


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def units(name: str) -> list[Unit]:
    """Work units of a built-in corpus: the help topics, then one per stdlib module (sorted)."""
    if name != PREFIX:
        raise UserError(f"{name}: unknown built-in corpus (available: {PREFIX})")
    root = stdlib_dir()
    out = [Unit(f"{PREFIX}/topics", f"{NAME}/topics", "builtin")]
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if any(part in _SKIP_PARTS or part.startswith((".", "config-")) for part in rel.parts):
            continue
        out.append(Unit(f"{PREFIX}/stdlib/{rel.as_posix()}", f"{NAME}/stdlib/{rel.as_posix()}", "builtin"))
    return out


def prose_paragraphs(text: str) -> list[str]:
    """Paragraphs of documentation text without code: indented blocks, doctests, headings' underlines."""
    out = []
    for block in re.split(r"\n\s*\n", text):
        lines = [ln for ln in block.split("\n") if ln.strip() and not _UNDERLINE.match(ln)]
        if not lines:
            continue
        indent = min(len(ln) - len(ln.lstrip()) for ln in lines)
        body = [ln.strip() for ln in lines]
        # Code examples are indented relative to the prose around them, or are doctest sessions.
        if indent >= 3 or body[0].startswith((">>>", "...", "$ ", "::")):
            continue
        out.append(" ".join(body))
    return out


def _docstrings(path: Path) -> list[str]:
    tree = ast.parse(path.read_bytes(), filename=str(path))
    docs = [ast.get_docstring(tree, clean=True)]
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
            docs.append(ast.get_docstring(node, clean=True))
            if isinstance(node, ast.ClassDef):
                docs += [
                    ast.get_docstring(m, clean=True)
                    for m in node.body
                    if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)) and not m.name.startswith("_")
                ]
    return [d for d in docs if d]


def read_builtin(path: str, source: str, config, stats: ReadStats) -> Iterator[Document]:
    """Documents of one work unit: one per help topic, or one per stdlib module."""
    if path == f"{PREFIX}/topics":
        for key in sorted(topics):
            doc = _document(f"{source}#{key}", source, topics[key], config)
            if doc is None:
                stats.drop("no_text")
            else:
                yield doc
        return
    file = stdlib_dir() / path[len(f"{PREFIX}/stdlib/"):]
    try:
        text = "\n\n".join(_docstrings(file))
    except (SyntaxError, ValueError, OSError):
        return  # not parseable by this interpreter (e.g. a template file): not part of the corpus
    doc = _document(f"{source}#0", source, text, config)
    if doc is None:
        stats.drop("no_text")
    else:
        yield doc


def _document(doc_id: str, source: str, text: str, config) -> Document | None:
    sentences = [s for p in prose_paragraphs(text) for s in split_paragraph(p, config.sentence_splitter)]
    return Document(doc_id, source, sentences) if sentences else None
