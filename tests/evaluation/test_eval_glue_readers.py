"""GLUE readers against hand-written files (BOM, no header, no final newline, stray quotes, bad rows)
and against the real GLUE files' official row and label counts."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from contracts.common import UserError
from evaluation import glue


def _write(path: Path, text: str, bom: bool = False) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + text.encode("utf-8"))
    return path


def test_cola_without_header_and_final_newline(tmp_path):
    p = _write(tmp_path / "dev.tsv", "gj04\t1\t\tThe sailors rode.\ngj04\t0\t*\tRode the the.")
    ex = glue.read_examples(glue.get_task("CoLA"), p)
    assert [(e.text_a, e.text_b, e.label) for e in ex] == [("The sailors rode.", None, 1), ("Rode the the.", None, 0)]
    assert ex[1].guid.endswith("dev.tsv:2")


def test_mrpc_bom_and_unbalanced_quotes(tmp_path):
    text = 'Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n1\t1\t2\tHe said "hi.\tShe said "bye".\n'
    p = _write(tmp_path / "train.tsv", text, bom=True)
    (ex,) = glue.read_examples(glue.get_task("MRPC"), p)
    # quoting disabled: the stray quote stays part of the text, the row is not merged with the next
    assert (ex.text_a, ex.text_b, ex.label) == ('He said "hi.', 'She said "bye".', 1)


def test_stsb_regression_labels_and_crlf(tmp_path):
    header = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore"
    p = _write(tmp_path / "dev.tsv", header + "\r\n0\tg\tf\t2012\t1\tn\tn\tA cat.\tA dog.\t2.500\r\n")
    (ex,) = glue.read_examples(glue.get_task("sts-b"), p)
    assert (ex.text_a, ex.text_b, ex.label) == ("A cat.", "A dog.", 2.5)
    assert isinstance(ex.label, float)


def test_mnli_columns_found_by_header_name(tmp_path):
    """MNLI dev has 16 columns, train 12: the reader must use header names, not positions."""
    names = ["index", "promptID", "pairID", "genre", "s1b", "s2b", "s1p", "s2p", "sentence1", "sentence2"]
    train = names + ["label1", "gold_label"]
    dev = names + [f"label{i}" for i in range(1, 6)] + ["gold_label"]
    row = lambda n, gold: "\t".join(["0"] * 8 + ["A man.", "A person."] + ["x"] * (n - 11) + [gold])
    spec = glue.get_task("MNLI")
    t = glue.read_examples(spec, _write(tmp_path / "train.tsv", "\t".join(train) + "\n" + row(12, "neutral") + "\n"))
    d = glue.read_examples(spec, _write(tmp_path / "dev_matched.tsv", "\t".join(dev) + "\n" + row(16, "entailment")))
    assert (t[0].text_a, t[0].text_b, t[0].label) == ("A man.", "A person.", spec.labels.index("neutral"))
    assert d[0].label == spec.labels.index("entailment")
    assert set(spec.dev_files) == {"MNLI-m", "MNLI-mm"}


def test_wrong_column_count_names_file_and_line(tmp_path):
    p = _write(tmp_path / "train.tsv", "sentence\tlabel\ngood .\t1\nbad row without label\n")
    with pytest.raises(UserError, match=r"train\.tsv:3: expected 2 tab-separated columns, found 1"):
        glue.read_examples(glue.get_task("SST-2"), p)


def test_a_file_is_parsed_once_per_content_and_an_edit_is_seen_at_once(tmp_path, monkeypatch):
    """Every cell of a comparison reads the same task files: the parse is kept per content (not per
    modification time, which a same-size edit within one clock tick would not change)."""
    parses = []
    real = glue._parse_all
    monkeypatch.setattr(glue, "_parse_all", lambda *a: parses.append(a[1]) or real(*a))
    spec = glue.get_task("SST-2")
    p = _write(tmp_path / "train.tsv", "sentence\tlabel\ngood .\t1\nbad .\t0\nworse .\t7\n")
    first = glue.read_examples(spec, p, 2)
    first.append("a caller's own change")
    assert [e.label for e in glue.read_examples(spec, p, 2)] == [1, 0] and len(parses) == 1
    with pytest.raises(UserError, match=r"train\.tsv:4: label '7'"):  # past the limit: still said in full
        glue.read_examples(spec, p)
    assert len(parses) == 1
    p.write_bytes(p.read_bytes().replace(b"\t1\n", b"\t0\n"))  # same size, same path, at once
    assert [e.label for e in glue.read_examples(spec, p, 2)] == [0, 0] and len(parses) == 2
    assert [e.label for e in glue.read_examples(glue.get_task("CoLA"), _write(tmp_path / "c.tsv", "s\t1\t\tok .\n"))] == [1]


def test_bad_label_missing_file_unknown_task(tmp_path):
    p = _write(tmp_path / "train.tsv", "sentence\tlabel\ngood .\t7\n")
    with pytest.raises(UserError, match=r"train\.tsv:2: label '7' is not one of 0, 1"):
        glue.read_examples(glue.get_task("SST-2"), p)
    with pytest.raises(UserError, match="task file not found"):
        glue.read_examples(glue.get_task("RTE"), tmp_path / "nope.tsv")
    with pytest.raises(UserError, match="unknown GLUE task 'SST-3'"):
        glue.get_task("SST-3")
    assert glue.get_task("sst2").name == "SST-2" and glue.get_task("qnli").name == "QNLI"


def test_all_nine_tasks_have_specs():
    assert list(glue.TASKS) == ["CoLA", "SST-2", "MRPC", "STS-B", "QQP", "MNLI", "QNLI", "RTE", "WNLI"]
    assert glue.get_task("STS-B").num_labels == 1 and glue.get_task("MNLI").num_labels == 3


def test_submission_format(tmp_path):
    spec = glue.get_task("RTE")
    ex = [glue.Example("t:2", "a", "b", None, index="0"), glue.Example("t:3", "c", "d", None, index="1")]
    glue.write_submission(tmp_path / "RTE.tsv", spec, ex, [1, 0])
    assert (tmp_path / "RTE.tsv").read_text() == "index\tprediction\n0\tnot_entailment\n1\tentailment\n"
    glue.write_submission(tmp_path / "STS-B.tsv", glue.get_task("STS-B"), ex, [5.7, 1.23456])
    assert (tmp_path / "STS-B.tsv").read_text().splitlines()[1:] == ["0\t5.000", "1\t1.235"]


# Official dev counts (GLUE) and label distributions, as documented in shared/data/README.md.
REAL = [
    ("CoLA", "dev.tsv", 1043, {1: 721, 0: 322}),
    ("SST-2", "dev.tsv", 872, {0: 428, 1: 444}),
    ("MRPC", "dev.tsv", 408, {1: 279, 0: 129}),
    ("RTE", "dev.tsv", 277, {0: 146, 1: 131}),
    ("QNLI", "dev.tsv", 5463, {0: 2702, 1: 2761}),
    ("MRPC", "train.tsv", 3668, {1: 2474, 0: 1194}),
]


@pytest.mark.shared_data
@pytest.mark.parametrize("task,fname,rows,labels", REAL)
def test_real_glue_files(shared_data, task, fname, rows, labels):
    ex = glue.read_examples(glue.get_task(task), shared_data / "glue" / task / fname)
    assert len(ex) == rows
    assert dict(Counter(e.label for e in ex)) == labels


@pytest.mark.shared_data
def test_real_stsb_and_test_files(shared_data):
    stsb = glue.read_examples(glue.get_task("STS-B"), shared_data / "glue/STS-B/dev.tsv")
    assert len(stsb) == 1500 and all(0.0 <= e.label <= 5.0 for e in stsb)
    test = glue.read_test_examples(glue.get_task("SST-2"), shared_data / "glue/SST-2/test.tsv")
    assert len(test) == 1821 and test[0].index == "0" and test[-1].index == "1820" and test[0].label is None
    mrpc = glue.read_test_examples(glue.get_task("MRPC"), shared_data / "glue/MRPC/test.tsv")
    assert len(mrpc) == 1725 and mrpc[0].text_b
