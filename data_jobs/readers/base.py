"""What every reader yields and counts: Document, the unit of work, and per-reason drop statistics."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from contracts.common import UserError

# Reasons that mean "the input is damaged", as opposed to content policy (redirects, duplicates, ...).
# With on_bad_input="fail" the first of these stops the run with one line naming the file.
BAD_INPUT_REASONS = {
    "invalid_utf8": "invalid UTF-8 bytes",
    "line_too_long": "a line longer than max_line_bytes",
    "truncated": "the file ends early (truncated download or archive?)",
    "malformed_xml": "malformed XML",
    "markup_too_deep": "wikitext nested too deeply to parse",
    "bad_json": "a line that is not a JSON object",
    "missing_text": "a record without a text value",
    "missing_id": "a record without an id value",
    "empty": "empty file (or only whitespace)",
    "binary": "binary data (NUL bytes), not text",
    "corrupt_compression": "the decompressor cannot read it",
    "compression_bomb": "expands over 200 times its compressed size (a decompression bomb?)",
    "corrupt_parquet": "not a readable Parquet file",
    "bad_surrogate": "a lone surrogate escape (not encodable as UTF-8)",
    "file_name_not_utf8": "a file name that is not valid UTF-8",
    "unclosed_doc": "a <doc> without its </doc> (the next <doc> starts inside it)",
    "text_outside_doc": "text outside any <doc>...</doc>",
    "no_documents": "no <doc> tags at all (not WikiExtractor output? check --format)",
}
MAX_PROBLEM_LINES = 100


def printable(text: str) -> str:
    """``text`` safe to print and to write as JSON: undecodable bytes and lone surrogates escaped."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def encodable(text: str) -> bool:
    """False for a str holding a lone surrogate (a non-UTF-8 file name, a JSON "\\udc80" escape)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@dataclass(frozen=True)
class Document:
    """One document: a stable unique id, where it came from, and its sentences in order."""

    doc_id: str
    source: str
    sentences: list[str]


@dataclass(frozen=True)
class Unit:
    """One piece of input a worker reads on its own: a file (or a built-in corpus part)."""

    path: str  # filesystem path, or "builtin:<name>/<part>"
    source: str  # stable name used in doc_ids: relative to the common input root
    fmt: str  # an InputFormat, or "auto" (detected from the file itself)


@dataclass
class ReadStats:
    """Counts of what the readers did; additive, so per-worker stats merge into corpus totals."""

    strict: bool = False
    kept: int = 0
    files_read: int = 0
    dropped: Counter = field(default_factory=Counter)
    files_skipped: Counter = field(default_factory=Counter)
    problems: Counter = field(default_factory=Counter)  # "path: what" -> count

    def drop(self, reason: str) -> None:
        """A document left out by policy (redirect, too short, duplicate...)."""
        self.dropped[reason] += 1

    def bad_document(self, path: str, reason: str, detail: str = "") -> None:
        """A document dropped because the input is damaged; raises UserError in strict mode."""
        self._problem(path, reason, detail)
        self.dropped[reason] += 1

    def bad_file(self, path: str, reason: str, detail: str = "") -> None:
        """A whole file skipped (empty, binary, unreadable); raises UserError in strict mode."""
        self._problem(path, reason, detail)
        self.files_skipped[reason] += 1

    def _problem(self, path: str, reason: str, detail: str) -> None:
        path, detail = printable(path), printable(detail)
        what = BAD_INPUT_REASONS.get(reason, reason) + (f": {detail}" if detail else "")
        if self.strict:
            raise UserError(f"{path}: {what}")
        key = f"{path}: {what}"
        if key in self.problems or len(self.problems) < MAX_PROBLEM_LINES:
            self.problems[key] += 1

    @property
    def documents_read(self) -> int:
        return self.kept + sum(self.dropped.values())

    def to_dict(self) -> dict[str, Any]:
        return {
            "documents_read": self.documents_read,
            "documents_kept_by_readers": self.kept,
            "files_read": self.files_read,
            "dropped": dict(sorted(self.dropped.items())),
            "files_skipped": dict(sorted(self.files_skipped.items())),
            "problems": [f"{k} (x{n})" if n > 1 else k for k, n in sorted(self.problems.items())],
        }
