"""Hostile battery cases: damaged or odd input (file names, JSONL, WikiExtractor, Gutenberg, hand-edited
manifests, GLUE files, non-models), each run as a user would run it (``bertflow ...`` or ``python -m``).

Every case ends one of two ways, and the case says which:
  * counted: exit 0, the reason in the manifest (``totals.dropped`` / ``totals.files_skipped``) and in
    the end-of-run report on stderr, the documents that should survive kept (no silent merge or drop);
  * refused: exit 2 and exactly one ``bertflow: error:`` line naming the file or field, nothing in the
    output directory that looks finished.
The data jobs run with ``--engine local`` (no Ray start-up); evaluation with ``--no-use-ray``.
Checked by hostile_check.verify, with the rest of the battery (tests/scale/test_hostile.py).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable, Optional

import pyarrow as pa
import pyarrow.parquet as pq

from hostile_check import CLI, Case
from scale_support import REPO, base_env

sys.path.insert(0, str(REPO / "tests" / "bert_core"))
from train_helpers import write_dataset, write_vocab  # noqa: E402


def docs(tag: str) -> str:
    """Two documents of BERT-format text, unique per tag (dedup would otherwise drop repeats)."""
    return f"The {tag} sentence is here.\nAnd a second one follows.\n\nAnother {tag} document starts.\nIt ends now.\n"


DOCS = docs("first")
PG = "*** START OF THE PROJECT GUTENBERG EBOOK {0} ***\n{1}\n*** END OF THE PROJECT GUTENBERG EBOOK {0} ***\n"
LICENCE = "Licence boilerplate that is not part of any book.\n"


def _counted(where: str, reason: Optional[str], kept: Optional[int], extra: Optional[Callable[[Path], str]]):
    """A run that succeeds and accounts for what it dropped: the reason counted in the manifest and in
    the end-of-run report, the documents kept, and any further check of the output."""
    def check(case: Case, res: dict) -> None:
        totals = json.loads((case.out / "manifest.json").read_text())["totals"]
        if reason:
            assert totals[where].get(reason, 0) >= 1, f"{reason} not counted in totals.{where}: {totals[where]}"
            assert f"{reason}=" in res["stderr"], f"{reason} not in the end-of-run report:\n{res['stderr'][-2000:]}"
        if kept is not None:
            assert totals["documents_kept"] == kept, f"kept {totals['documents_kept']}, want {kept}: {totals}"
        problem = extra(case.out) if extra else ""
        assert not problem, problem
    return check


def _w(p: Path, body: str | bytes) -> Path:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(body if isinstance(body, bytes) else body.encode("utf-8", "surrogateescape"))
    return p


def _sentences(out: Path) -> list[str]:
    return [s for f in sorted(out.glob("shard-*.parquet")) for row in pq.read_table(f).to_pylist()
            for s in row["sentences"]]


def _without(*texts: str) -> Callable[[Path], str]:
    def check(out: Path) -> str:
        bad = [s for s in _sentences(out) if any(t in s for t in texts)]
        return f"sentences hold {texts}: {bad[:3]}" if bad else ""
    return check


def _no_reason(reason: str) -> Callable[[Path], str]:
    def check(out: Path) -> str:
        totals = json.loads((out / "manifest.json").read_text())["totals"]
        return f"{reason} counted: {totals['dropped']}" if reason in totals["dropped"] else ""
    return check


def _edit_manifest(src: Path, dst: Path, edit: Callable[[dict], None]) -> Path:
    shutil.copytree(src, dst)
    m = json.loads((dst / "manifest.json").read_text())
    edit(m)
    (dst / "manifest.json").write_text(json.dumps(m))
    return dst


def _run_prep(argv: list[str]) -> None:
    subprocess.run([sys.executable, *CLI, *argv], env=base_env(), cwd=REPO, check=True, capture_output=True)


def _tiny_hf(t: Path) -> Path:
    """A 2-layer random BERT as a Hugging Face directory (a real model for --model)."""
    import torch

    from bert_core.config import preset
    from bert_core.hf import save_hf
    from bert_core.model import BertForPreTraining

    torch.manual_seed(0)
    config = preset("tiny", vocab_size=100)
    return save_hf(BertForPreTraining(config), config, write_vocab(t / "hf_vocab.txt", 100), t / "hf")


def _glue(d: Path, test_body: str, dev_body: bytes | None = None) -> Path:
    rows = "".join(f"{i}\tw{i} w{i + 1} .\tw{i + 2} .\t{'entailment' if i % 2 else 'not_entailment'}\n" for i in range(8))
    _w(d / "RTE" / "train.tsv", "index\tsentence1\tsentence2\tlabel\n" + rows)
    _w(d / "RTE" / "dev.tsv", dev_body if dev_body is not None else "index\tsentence1\tsentence2\tlabel\n" + rows)
    _w(d / "RTE" / "test.tsv", test_body)
    return d


def build_cases(t: Path) -> dict[str, Case]:
    i, o = t / "in", t / "out"
    shard = [*CLI, "data", "shard", "--engine", "local", "--num-workers", "1", "--num-shards", "1"]
    strict = [*shard, "--on-bad-input", "fail"]
    c: dict[str, Case] = {}

    def counted(name, argv, reason=None, kept=None, check=None, where="dropped"):
        c[name] = Case([*argv, "--output-dir", str(o / name)], rc=0, check=_counted(where, reason, kept, check))

    def refused(name, argv, expect, out=True):
        c[name] = Case([*argv, *(["--output-dir", str(o / name)] if out else [])], expect)

    # --- file names and directory walking
    _w(i / "names" / b"bad\xffname.txt".decode("utf-8", "surrogateescape"), DOCS)
    _w(i / "names" / "good.txt", docs("opening"))
    counted("name-not-utf8-counted", [*shard, "--input", str(i / "names")], "file_name_not_utf8", 2, where="files_skipped")
    refused("name-not-utf8-strict", [*strict, "--input", str(i / "names")], "not valid UTF-8")
    _w(i / "dirname" / b"d\xfe".decode("utf-8", "surrogateescape") / "a.txt", DOCS)
    _w(i / "dirname" / "b.txt", docs("opening"))
    counted("dir-name-not-utf8-counted", [*shard, "--input", str(i / "dirname")], "file_name_not_utf8", 2, where="files_skipped")
    counted("name-with-newline", [*shard, "--input", str(_w(i / "nl" / "a\nb.txt", DOCS))], kept=2)
    _w(i / "real" / "sub" / "a.txt", DOCS)
    _w(i / "linked" / "own.txt", docs("opening"))
    os.symlink(i / "real" / "sub", i / "linked" / "sub")
    counted("symlinked-subdirectory-read", [*shard, "--input", str(i / "linked")], kept=4)
    _w(i / "loop" / "a.txt", DOCS)
    os.symlink(i / "loop", i / "loop" / "again")
    counted("symlink-loop-read-once", [*shard, "--input", str(i / "loop")], kept=2, check=_no_reason("duplicate"))
    _w(i / "twice" / "a.txt", DOCS)
    os.symlink(i / "twice" / "a.txt", i / "twice" / "b.txt")
    counted("two-links-one-file-read-once", [*shard, "--input", str(i / "twice")], kept=2, check=_no_reason("duplicate"))
    counted("glob-matching-a-directory", [*shard, "--input", str(i / "rea*")], kept=2)
    counted("glob-matching-dir-and-its-file", [*shard, "--input", str(i / "real" / "**"), str(i / "real" / "sub" / "a.txt")],
            kept=2, check=_no_reason("duplicate"))
    _w(i / "broken" / "a.txt", DOCS)
    os.symlink(i / "nowhere.txt", i / "broken" / "dangling.txt")
    refused("broken-symlink-in-directory", [*shard, "--input", str(i / "broken")], "broken symbolic link")
    _w(i / "fifo" / "a.txt", DOCS)
    os.mkfifo(i / "fifo" / "pipe.txt")
    refused("fifo-in-directory", [*shard, "--input", str(i / "fifo")], "not a regular file")
    refused("glob-matching-nothing", [*shard, "--input", str(i / "none*.txt")], "no files match")
    _w(i / "blank" / "a.txt", DOCS)
    _w(i / "blank" / "spaces.txt", " \n\t\n\n")
    counted("whitespace-only-file-counted", [*shard, "--input", str(i / "blank")], "empty", 2, where="files_skipped")
    refused("whitespace-only-file-strict", [*strict, "--input", str(i / "blank" / "spaces.txt")], "spaces.txt")

    # --- JSONL: lone surrogates, odd ids
    sur = _w(i / "sur_text.jsonl", '{"id": "a", "text": "Good text here. Another one."}\n'
                                   '{"id": "b", "text": "Bad \\udc80 text. More."}\n')
    counted("jsonl-surrogate-in-text", [*shard, "--input", str(sur), "--id-column", "id"], "bad_surrogate", 1)
    sid = _w(i / "sur_id.jsonl", '{"id": "a", "text": "Good text here. Another one."}\n'
                                 '{"id": "\\ud800", "text": "Fine doc. Yes."}\n')
    counted("jsonl-surrogate-in-id", [*shard, "--input", str(sid), "--id-column", "id"], "bad_surrogate", 1)
    refused("jsonl-surrogate-strict", [*strict, "--input", str(sur), "--id-column", "id"], "sur_text.jsonl")
    counted("jsonl-surrogate-in-unused-key", [*shard, "--input", str(_w(i / "sur_key.jsonl",
            '{"text": "Plain text. Fine.", "note": "\\udc80"}\n'))], kept=1)
    counted("jsonl-id-is-an-object", [*shard, "--id-column", "id", "--input", str(_w(i / "obj_id.jsonl",
            '{"id": {"a": [1]}, "text": "Plain text. Fine."}\n'))], kept=1)
    counted("jsonl-duplicate-ids", [*shard, "--id-column", "id", "--input", str(_w(i / "dup.jsonl",
            '{"id": "x", "text": "Alpha text. More."}\n{"id": "x", "text": "Beta text. Other."}\n'))], "duplicate_doc_id", 1)
    counted("jsonl-null-text", [*shard, "--input", str(_w(i / "null.jsonl",
            '{"text": null}\n{"text": "Plain text. Fine."}\n'))], "missing_text", 1)
    counted("jsonl-array-line", [*shard, "--input", str(_w(i / "arr.jsonl",
            '{"text": "Plain text. Fine."}\n["not", "an", "object"]\n'))], "bad_json", 1)
    counted("jsonl-bom-and-crlf", [*shard, "--input", str(_w(i / "bom.jsonl",
            b'\xef\xbb\xbf{"text": "One doc. Here."}\r\n{"text": "Two doc. There."}\r\n'))], kept=2)
    counted("jsonl-text-is-a-number", [*shard, "--input", str(_w(i / "num.jsonl",
            '{"text": 42}\n{"text": "Plain text. Fine."}\n'))], "missing_text", 1)
    pq.write_table(pa.table({"text": pa.array([b"Good text. Fine.", b"Bad \xff text. X."], pa.binary())}), i / "bin.parquet")
    counted("parquet-binary-text-bad-utf8", [*shard, "--input", str(i / "bin.parquet")], "invalid_utf8", 1)
    pq.write_table(pa.table({"text": pa.array([1, 2])}), i / "int.parquet")
    refused("parquet-text-column-of-numbers", [*shard, "--input", str(i / "int.parquet")], "holds int64")
    counted("mediawiki-invalid-char-reference", [*shard, "--input", str(_w(i / "sur.xml",
            "<mediawiki><page><title>A</title><ns>0</ns><id>1</id><revision><text>Text &#xDC80; here. More.</text>"
            "</revision></page></mediawiki>"))], "malformed_xml", 0)

    # --- WikiExtractor
    a = '<doc id="1" title="A">\nA\nFirst article text. It is here.\n'
    b = '<doc id="2" title="B">\nB\nSecond article. Has text.\n</doc>\n'
    cc = '<doc id="3" title="C">\nC\nThird article. Text.\n</doc>\n'
    unclosed = _w(i / "unclosed.txt", a + b + cc)
    counted("wiki-unclosed-doc", [*shard, "--format", "wikiextractor", "--input", str(unclosed)], "unclosed_doc", 2,
            check=_without("<doc", "First article"))
    refused("wiki-unclosed-doc-strict", [*strict, "--format", "wikiextractor", "--input", str(unclosed)], "unclosed.txt")
    a_closed = a + "</doc>\n"
    counted("wiki-text-between-docs", [*shard, "--format", "wikiextractor", "--input", str(_w(i / "between.txt",
            a_closed + "Stray text outside. Yes.\n" + b))], "text_outside_doc", 2, check=_without("Stray"))
    counted("wiki-text-before-first-doc", [*shard, "--format", "wikiextractor", "--input", str(_w(i / "before.txt",
            "Preamble text. Here.\n\n" + a_closed + b))], "text_outside_doc", 2)
    counted("wiki-text-after-last-doc", [*shard, "--input", str(_w(i / "after.txt", a_closed + b + "Trailer. Text.\n"))],
            "text_outside_doc", 2)
    plain = _w(i / "plain" / "book.txt", DOCS)
    counted("wiki-format-on-plain-text", [*shard, "--format", "wikiextractor", "--input", str(plain)], "no_documents", 0,
            where="files_skipped")
    refused("wiki-format-on-plain-text-strict", [*strict, "--format", "wikiextractor", "--input", str(plain)], "book.txt")
    counted("wiki-cut-inside-doc", [*shard, "--input", str(_w(i / "cut.txt", a_closed + b + cc[:30]))], "truncated", 2)

    # --- Project Gutenberg: several books in one file
    two = _w(i / "pg2.txt", PG.format("A", "Book one has text here.\nIt continues on.") + LICENCE
             + PG.format("B", "Book two is different.\nIt ends too.") + LICENCE)
    counted("gutenberg-two-books", [*shard, "--format", "books", "--input", str(two)], kept=2, check=_without("Licence"))
    three = _w(i / "pg3.txt", "".join(PG.format(n, f"Book {n} opens here.\nIt goes on.") + LICENCE for n in "XYZ"))
    counted("gutenberg-three-books-auto", [*shard, "--input", str(three)], kept=3, check=_without("Licence"))
    counted("gutenberg-trailing-licence", [*shard, "--format", "books", "--input", str(_w(i / "pg1.txt",
            "Header.\n" + PG.format("A", "Only book. Text.") + LICENCE * 3))], kept=1, check=_without("Licence", "Header"))
    counted("gutenberg-two-books-bert-format", [*shard, "--format", "bert", "--input", str(two)], kept=2,
            check=_without("Licence"))
    counted("python-m-shard-job-surrogate", ["-m", "data_jobs.shard_job", "--engine", "local", "--num-workers", "1",
            "--num-shards", "1", "--input", str(sur), "--id-column", "id"], "bad_surrogate", 1)
    return c


def build_dataset_cases(t: Path, c: dict[str, Case]) -> None:
    """Instances, inspect, train and eval cases over prepared (and then hand-edited) datasets."""
    i, o, p = t / "in", t / "out", t / "prep"
    vocab = p / "vocab"
    p.mkdir(parents=True, exist_ok=True)
    _run_prep(["data", "vocab", "--vocab-file", str(write_vocab(p / "vocab.txt", 100)), "--output-dir", str(vocab)])
    local = ["--engine", "local", "--num-workers", "1", "--num-shards", "1"]
    for name, body in (("good", DOCS), ("notoken", "\u0301\u0301\n\u0302\n\n\u0303\n")):
        _run_prep(["data", "shard", *local, "--format", "bert", "--input", str(_w(i / f"{name}.txt", body)),
                   "--output-dir", str(p / name)])
    _run_prep(["data", "shard", *local, "--input", str(i / "names" / b"bad\xffname.txt".decode("utf-8", "surrogateescape")),
               "--output-dir", str(p / "empty")])
    inst = [*CLI, "data", "instances", "--engine", "local", "--num-workers", "1", "--vocab-dir", str(vocab)]

    def rows(value):
        return lambda m: m["files"][0].update(rows=value)

    def refused(name, argv, expect, out=True):
        c[name] = Case([*argv, *(["--output-dir", str(o / name)] if out else [])], expect)

    refused("instances-empty-corpus", [*inst, "--shards-dir", str(p / "empty")], "holds no documents")
    refused("instances-no-usable-tokens", [*inst, "--shards-dir", str(p / "notoken")], "no document has a token")
    refused("instances-manifest-rows-edited", [*inst, "--shards-dir", str(_edit_manifest(p / "good", p / "rows7", rows(7)))],
            "manifest says 7")
    refused("instances-manifest-rows-not-a-number", [*inst, "--shards-dir",
            str(_edit_manifest(p / "good", p / "rowsx", rows("many")))], "rows")
    _edit_manifest(p / "good", p / "notjson", lambda m: None)
    (p / "notjson" / "manifest.json").write_text('{"schema_version": 1, "kind": "docu')
    refused("instances-manifest-not-json", [*inst, "--shards-dir", str(p / "notjson")], "manifest.json")
    refused("inspect-verify-rows-edited", [*CLI, "data", "inspect", "--verify", str(p / "rows7")], "manifest says 7", out=False)
    refused("python-m-inspect-verify-rows", ["-m", "data_jobs.inspect", "--verify", str(p / "rows7")], "manifest says 7", out=False)

    data = write_dataset(p / "instances", n=16, vocab_size=100, max_seq=32)
    train = [*CLI, "train", "--max-steps", "1", "--micro-batch-size", "4", "--model", "tiny"]

    def vocab_size(value):
        return lambda m: m["totals"].update(vocab_size=value)

    refused("train-totals-vocab-size-edited", [*train, "--data-dir", str(_edit_manifest(data, p / "vs3", vocab_size(3)))],
            "totals.vocab_size is 3")
    refused("train-totals-vocab-size-not-a-number", [*train, "--data-dir",
            str(_edit_manifest(data, p / "vsx", vocab_size("many")))], "vocab_size")
    for name, over, expect in (("train-model-overrides-wrong-type", {"hidden_size": "wide"}, "hidden_size"),
                               ("train-model-overrides-unknown-key", {"hiden_size": 64}, "hiden_size")):
        cfg = _w(p / f"{name}.yaml", json.dumps({"data_dir": str(data), "output_dir": str(o / name), "model": "tiny",
                                                 "model_overrides": over, "max_steps": 1}))
        c[name] = Case([*CLI, "train", "--config", str(cfg)], expect, out=o / name)

    hf = _tiny_hf(p)
    _w(i / "plain_dir" / "notes.txt", "my notes\n")
    good_test = "index\tsentence1\tsentence2\n0\tw1 .\tw2 .\n"
    glue = [*CLI, "eval", "glue", "--no-use-ray", "--tasks", "RTE", "--max-steps", "1", "--seeds", "1",
            "--learning-rates", "1e-3"]
    refused("glue-malformed-test-row", [*glue, "--model", str(hf), "--glue-dir",
            str(_glue(p / "g1", good_test + "1\tonly two columns\n"))], "test.tsv:3")
    # Checked before the model is even loaded (so before any fine-tuning): the model here is no model.
    refused("glue-test-row-checked-before-any-task", [*glue, "--model", str(i / "plain_dir"), "--glue-dir",
            str(_glue(p / "g5", good_test + "1\tonly two columns\n"))], "test.tsv:3")
    g6 = _glue(p / "g6", good_test)
    (g6 / "RTE" / "train.tsv").unlink()
    refused("glue-dev-test-only-task-dir", [*glue, "--model", str(hf), "--glue-dir", str(g6)], "dev+test-only")
    refused("glue-empty-test-file", [*glue, "--model", str(hf), "--glue-dir", str(_glue(p / "g2", ""))], "test.tsv")
    refused("glue-dev-not-utf8", [*glue, "--model", str(hf), "--glue-dir",
            str(_glue(p / "g3", good_test, b"index\tsentence1\tsentence2\tlabel\n0\t\xff\tb\tentailment\n"))], "dev.tsv")
    g = _glue(p / "g4", good_test)
    refused("eval-model-plain-directory", [*glue, "--glue-dir", str(g), "--model", str(i / "plain_dir")], "not a model")
    refused("eval-model-a-text-file", [*glue, "--glue-dir", str(g), "--model", str(i / "plain_dir" / "notes.txt")], "not a model")
    (i / "empty_dir").mkdir()
    refused("eval-model-empty-directory", [*glue, "--glue-dir", str(g), "--model", str(i / "empty_dir")], "not a model")
    _w(i / "half_ckpt" / "trainer_state.json", "{}")
    refused("eval-model-half-saved-checkpoint", [*glue, "--glue-dir", str(g), "--model", str(i / "half_ckpt")],
            "incomplete checkpoint")


def build(t: Path) -> dict[str, Case]:
    cases = build_cases(t)
    build_dataset_cases(t, cases)
    return cases


IDS = [
    "name-not-utf8-counted", "name-not-utf8-strict", "dir-name-not-utf8-counted", "name-with-newline",
    "symlinked-subdirectory-read", "symlink-loop-read-once", "two-links-one-file-read-once", "glob-matching-a-directory",
    "glob-matching-dir-and-its-file", "broken-symlink-in-directory", "fifo-in-directory", "glob-matching-nothing",
    "whitespace-only-file-counted", "whitespace-only-file-strict", "jsonl-surrogate-in-text", "jsonl-surrogate-in-id",
    "jsonl-surrogate-strict", "jsonl-surrogate-in-unused-key", "jsonl-id-is-an-object", "jsonl-duplicate-ids",
    "jsonl-null-text", "jsonl-array-line", "jsonl-bom-and-crlf", "jsonl-text-is-a-number",
    "parquet-binary-text-bad-utf8", "parquet-text-column-of-numbers", "mediawiki-invalid-char-reference",
    "wiki-unclosed-doc", "wiki-unclosed-doc-strict",
    "wiki-text-between-docs", "wiki-text-before-first-doc", "wiki-text-after-last-doc", "wiki-format-on-plain-text",
    "wiki-format-on-plain-text-strict", "wiki-cut-inside-doc", "gutenberg-two-books", "gutenberg-three-books-auto",
    "gutenberg-trailing-licence", "gutenberg-two-books-bert-format", "python-m-shard-job-surrogate",
    "instances-empty-corpus", "instances-no-usable-tokens", "instances-manifest-rows-edited",
    "instances-manifest-rows-not-a-number", "instances-manifest-not-json", "inspect-verify-rows-edited",
    "python-m-inspect-verify-rows", "train-totals-vocab-size-edited", "train-totals-vocab-size-not-a-number",
    "train-model-overrides-wrong-type", "train-model-overrides-unknown-key", "glue-malformed-test-row",
    "glue-test-row-checked-before-any-task", "glue-dev-test-only-task-dir", "glue-empty-test-file",
    "glue-dev-not-utf8", "eval-model-plain-directory", "eval-model-a-text-file",
    "eval-model-empty-directory", "eval-model-half-saved-checkpoint",
]
