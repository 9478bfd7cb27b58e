"""Many tiny files (issue 24, resource limits): the shard job keeps a record of every input file, so its
memory grows with their number. ``max_input_files`` bounds it: past the limit the job is refused in one
line, while listing (ten million files are refused after the limit is seen, not after all are listed),
before anything is read or written; at the limit it runs."""
from __future__ import annotations

from pathlib import Path

import pytest

from data_jobs.shard_job import main


def _tiny(root: Path, n: int) -> Path:
    for i in range(n):
        sub = root / f"d{i % 3}"
        sub.mkdir(parents=True, exist_ok=True)
        (sub / f"{i:03d}.txt").write_text(f"Document {i} begins here.\nIt ends here.\n", encoding="utf-8")
    return root


@pytest.mark.parametrize("inputs", ["dir", "glob", "files"])
def test_more_files_than_the_limit_is_one_line_before_any_work(tmp_path, capsys, inputs):
    corpus = _tiny(tmp_path / "corpus", 7)
    args = {"dir": [str(corpus)], "glob": [str(corpus / "*" / "*.txt")],
            "files": [str(p) for p in sorted(corpus.rglob("*.txt"))]}[inputs]
    out = tmp_path / "docs"
    code = main(["--inputs", *args, "--output-dir", str(out), "--engine", "local", "--num-workers", "1",
                 "--max-input-files", "6"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith("bertflow: error: inputs: more than 6 files (max_input_files)"), err
    assert not out.exists() or not any(out.iterdir())  # nothing written


def test_at_the_limit_every_file_is_read(tmp_path, capsys):
    import json

    corpus = _tiny(tmp_path / "corpus", 6)
    out = tmp_path / "docs"
    assert main(["--inputs", str(corpus), "--output-dir", str(out), "--engine", "local", "--num-workers", "1",
                 "--max-input-files", "6", "--input-format", "bert"]) == 0
    totals = json.loads((out / "manifest.json").read_text())["totals"]
    assert totals["files_read"] == 6 and totals["documents_kept"] == 6
