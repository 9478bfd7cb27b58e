"""bert_core.hostfile: the check run before a multi-node DeepSpeed launch."""
from __future__ import annotations

import pytest

from bert_core.hostfile import read_hostfile
from contracts.common import UserError


def test_reads_hosts_slots_and_comments(tmp_path):
    p = tmp_path / "hostfile"
    p.write_text("# two nodes\nlocalhost slots=8\n\n127.0.0.1 slots=4  # the same machine, by address\n")
    assert read_hostfile(p) == [("localhost", 8), ("127.0.0.1", 4)]


@pytest.mark.parametrize("text, message", [
    ("localhost slots=8\ngpu-node-99.invalid slots=8\n", "line 2: unknown host 'gpu-node-99.invalid'"),
    ("localhost 8\n", "line 1: expected '<host> slots=<n>'"),
    ("localhost slots=0\n", "line 1: slots must be >= 1"),
    ("localhost slots=8\nlocalhost slots=8\n", "line 2: host 'localhost' listed twice"),
    ("# nothing\n\n", "lists no hosts"),
])
def test_problems_are_one_line_naming_file_and_line(tmp_path, text, message):
    p = tmp_path / "hostfile"
    p.write_text(text)
    with pytest.raises(UserError) as err:
        read_hostfile(p)
    assert str(err.value).startswith(f"{p}: ") and message in str(err.value) and "\n" not in str(err.value)


def test_missing_hostfile(tmp_path):
    with pytest.raises(UserError, match="hostfile not found"):
        read_hostfile(tmp_path / "nope")
