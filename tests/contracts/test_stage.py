"""The one Stage contract (contracts.stage): foreign files refused and left alone, the names a stage
owns, status transitions, the record written last, and a writer killed between begin and commit that
never leaves a directory looking finished. Real files in tmp directories, no mocks."""
from __future__ import annotations

import json
import re
import string
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contracts.common import NO_OUTPUT, UserError
from contracts.lock import LOCK_NAME
from contracts.stage import RECORD, WORK, StageDir

INPUTS = {"model_path": "abc123", "vocab": None}
H = "0123456789abcdef"


def _write(d: Path, name: str, body: bytes = b"user data, do not touch\n") -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(body)
    return d / name


def _finished(d: Path, files=("results.json", "report.md"), **kw) -> StageDir:
    sd = StageDir.at(d, "eval:glue", **kw)
    sd.begin(H, INPUTS, files)
    for name in files:
        _write(d, name, b"ours\n")
    sd.commit(files, H, INPUTS)
    return sd


def test_user_file_in_a_fresh_dir_is_refused_in_one_line_and_untouched(tmp_path):
    d = tmp_path / "out"
    user = _write(d, "report.md")
    sd = StageDir.at(d, "eval:glue", owns=frozenset({"report.md", "results.json"}))
    with pytest.raises(UserError) as err:
        sd.refuse_foreign()
    msg = str(err.value)
    assert "\n" not in msg and "report.md" in msg and str(d) in msg
    assert user.read_bytes() == b"user data, do not touch\n"
    assert sorted(p.name for p in d.iterdir()) == ["report.md"]  # nothing written by the refusal


def test_foreign_names_the_first_and_counts_the_rest(tmp_path):
    d = tmp_path / "out"
    for name in ("b.txt", "a.txt", "c.txt"):
        _write(d, name)
    with pytest.raises(UserError, match=r"\(a\.txt and 2 more\)"):
        StageDir.at(d, "x").refuse_foreign()


def test_lock_and_scratch_temporaries_are_not_foreign(tmp_path):
    d = tmp_path / "out"
    sd = StageDir.at(d, "x")
    with sd.lock():
        _write(d, ".tmp-results.json.abc")
        assert (d / LOCK_NAME).is_file()
        assert sd.foreign() == []
        assert sd.refuse_foreign() == set()


def test_owned_names_follow_the_records(tmp_path):
    d = tmp_path / "out"
    sd = StageDir.at(d, "eval:glue", owns=frozenset({"cells"}))
    assert sd.owned() == set()
    sd.begin(H, INPUTS, ["results.json", "report.md"])
    assert sd.owned() == {WORK, "results.json", "report.md", "cells"}
    _write(d, "results.json", b"{}")
    sd.commit(["results.json"], H, INPUTS)
    assert sd.owned() == {RECORD, "results.json", "cells"}  # the work record is gone, the record lists what exists
    assert not (d / WORK).exists()
    _write(d, "notes.txt")
    assert sd.foreign() == ["notes.txt"]


def test_begin_keeps_the_names_a_killed_run_announced(tmp_path):
    d = tmp_path / "out"
    sd = StageDir.at(d, "x")
    sd.begin(H, INPUTS, ["part-1"])
    _write(d, "part-1", b"half")  # killed here
    sd.begin(H, INPUTS, ["part-2"])  # the next run announces other names
    assert {"part-1", "part-2"} <= sd.owned()
    assert sd.foreign() == []


def test_record_that_is_not_a_json_object_is_not_ours(tmp_path):
    d = tmp_path / "out"
    user = _write(d, RECORD, b"my own stage notes\n")
    sd = StageDir.at(d, "x", owns=frozenset({"report.md"}))
    assert sd.read_record() is None and sd.foreign() == [RECORD]
    with pytest.raises(UserError, match=RECORD):
        sd.refuse_foreign()
    assert user.read_bytes() == b"my own stage notes\n"


@pytest.mark.parametrize("bad", ["..", ".", "", "../x", "a/b", "/etc/passwd"])
def test_a_record_never_vouches_for_anything_outside(tmp_path, bad):
    d = tmp_path / "out"
    outside = _write(tmp_path, "x")
    _write(d, RECORD, json.dumps({"kind": "x", "config_hash": H, "files": [bad]}).encode())
    sd = StageDir.at(d, "x")
    assert sd.owned() == {RECORD}
    sd.remove_owned()
    assert outside.is_file() and d.is_dir()


def test_status_transitions(tmp_path):
    d = tmp_path / "out"
    sd = StageDir.at(d, "eval:glue")
    assert sd.status(H, INPUTS).state == "absent" and sd.status(H, INPUTS).fresh  # nothing there
    sd.begin(H, INPUTS, ["results.json"])
    s = sd.status(H, INPUTS)
    assert (s.state, s.reason) == ("partial", "an earlier run was interrupted")
    assert sd.status("another", INPUTS).state == "absent"  # another config's interrupted run: not continued
    _write(d, "results.json", b"{}")
    sd.commit(["results.json"], H, INPUTS)
    assert (sd.status(H, INPUTS).state, sd.status(H, INPUTS).reason) == ("done", "complete")
    assert sd.status("fedcba9876543210", INPUTS).reason == "config differs"
    s = sd.status(H, {**INPUTS, "model_path": "other"})
    assert (s.state, s.reason) == ("absent", "inputs changed: model_path")
    s = sd.status(H, {**INPUTS, "glue_dir": "new"})
    assert s.reason == "inputs changed: glue_dir"
    assert StageDir.at(d, "eval:squad").status(H, INPUTS).reason == "config differs"  # another kind's record
    (d / "results.json").unlink()
    s = sd.status(H, INPUTS)
    assert (s.state, s.reason) == ("partial", "1 of 1 files missing")


def test_leftovers_without_a_record_are_absent_but_not_fresh(tmp_path):
    d = tmp_path / "out"
    _write(d, "results.json", b"{}")
    s = StageDir.at(d, "x").status(H, INPUTS)
    assert s.state == "absent" and s.reason == "no stage record" and not s.fresh


def test_record_is_written_last_and_begin_removes_the_old_one(tmp_path):
    d = tmp_path / "out"
    sd = _finished(d)
    first = json.loads((d / RECORD).read_text())
    assert first == {"kind": "eval:glue", "config_hash": H, "inputs": INPUTS, "files": ["report.md", "results.json"]}
    sd.begin(H, INPUTS, ["results.json"])
    assert not (d / RECORD).exists()  # a directory being rewritten never looks finished
    assert sd.status(H, INPUTS).state == "partial"
    # Both files stay ours while rewritten: the work record names what the old record listed.
    assert {"results.json", "report.md"} <= sd.owned()
    extra = sd.commit(["results.json"], H, INPUTS, source="abc")
    assert json.loads((d / RECORD).read_text()) == extra and extra["source"] == "abc"


def test_remove_owned_keeps_what_is_not_ours(tmp_path):
    d = tmp_path / "out"
    sd = _finished(d, owns=frozenset({"cells"}))
    _write(d / "cells", "c1.json", b"{}")
    user = _write(d, "notes.txt")
    sd.remove_owned()
    assert sorted(p.name for p in d.iterdir()) == ["notes.txt"]
    assert user.read_bytes() == b"user data, do not touch\n"


def test_older_records_without_kind_or_with_another_hash_field(tmp_path):
    d = tmp_path / "run"
    _write(d, "train_config.json", json.dumps({"config": {}, "resume_hash": H, "inputs": INPUTS}).encode())
    sd = StageDir.at(d, "train", record="train_config.json", hash_field="resume_hash",
                     owns=frozenset({"metrics.jsonl", "checkpoints"}))
    assert sd.status(H, INPUTS).done
    _write(d, "metrics.jsonl", b"{}\n")
    assert sd.foreign() == []


# ---------------------------------------------------------------- properties

NAMES = st.text(string.ascii_lowercase + string.digits + "._-", min_size=1, max_size=12).filter(
    lambda n: n not in (".", "..") and not n.startswith((".tmp-", ".stage", ".bertflow")) and n != RECORD)


@settings(max_examples=40, deadline=None)
@given(user=st.sets(NAMES, min_size=1, max_size=5), ours=st.sets(NAMES, max_size=4))
def test_any_user_file_is_refused_and_never_changed(tmp_path_factory, user, ours):
    """Whatever our finished output holds, a name no record of ours lists is refused, byte for byte kept."""
    d = tmp_path_factory.mktemp("prop") / "out"
    ours = ours - user
    _finished(d, files=tuple(sorted(ours)))
    bodies = {n: _write(d, n, f"user {n}\n".encode()).read_bytes() for n in user}
    sd = StageDir.at(d, "eval:glue")
    assert sd.foreign() == sorted(user)
    with pytest.raises(UserError, match=re.escape(f"({sorted(user)[0]}")):
        sd.refuse_foreign()
    sd.remove_owned()
    assert {n: (d / n).read_bytes() for n in user} == bodies
    assert set(p.name for p in d.iterdir()) == user


OPS = st.lists(st.sampled_from(["begin", "write", "commit", "begin-other"]), min_size=1, max_size=8)


@settings(max_examples=60, deadline=None)
@given(ops=OPS)
def test_done_only_right_after_a_commit(tmp_path_factory, ops):
    """A writer killed after any prefix of begin/write/commit steps: done iff the last step that
    touched the directory was a commit of this config (never after a begin without its commit)."""
    d = tmp_path_factory.mktemp("kill") / "out"
    sd = StageDir.at(d, "x")
    committed = False
    for op in ops:
        if op in ("begin", "begin-other"):
            sd.begin(H if op == "begin" else "other", INPUTS, ["f"])
            committed = False
        elif op == "write" and (d / WORK).exists():  # a stage writes only after its begin
            _write(d, "f", b"data")
        elif op == "commit" and (d / "f").exists():
            sd.commit(["f"], H, INPUTS)
            committed = True
    assert sd.status(H, INPUTS).done == committed
    assert sd.foreign() == []  # whatever was left is ours


def test_inputs_are_computed_only_against_a_record_of_this_config(tmp_path):
    """Checksumming inputs can be costly: with nothing (or another config's output) there, it is skipped."""
    d = tmp_path / "out"

    def never() -> dict:
        raise AssertionError("inputs computed for nothing to compare with")

    sd = StageDir.at(d, "x")
    assert sd.status(H, never).fresh
    _finished(d)
    assert StageDir.at(d, "eval:glue").status("another", never).reason == "config differs"
    assert StageDir.at(d, "eval:glue").status(H, lambda: INPUTS).done


def test_a_manifest_is_a_record_and_another_kinds_files_are_not_ours(tmp_path):
    """A dataset's manifest (files as entries with a name) is a record; a record of another stage's
    kind vouches for that stage's files, not ours."""
    d = tmp_path / "ds"
    manifest = {"kind": "vocab", "config_hash": H, "files": [{"name": "vocab.txt", "rows": 7, "sha256": "x"}]}
    _write(d, "manifest.json", json.dumps(manifest).encode())
    _write(d, "vocab.txt")
    assert StageDir.at(d, "vocab", record="manifest.json").foreign() == []
    assert StageDir.at(d, "instances", record="manifest.json").foreign() == ["vocab.txt"]


def test_claimed_record_and_in_progress_names(tmp_path):
    d = tmp_path / "ds"
    _write(d, "manifest.json", b"{cut short")
    _write(d, "part-00000.done.json")
    plain = StageDir.at(d, "instances", record="manifest.json")
    assert plain.foreign() == ["manifest.json", "part-00000.done.json"]
    claimed = StageDir.at(d, "instances", record="manifest.json", claim_record=True,
                          in_progress=lambda: {"part-00000.done.json"})
    assert claimed.foreign() == []


def test_a_failed_writer_leaves_no_bookkeeping_that_vouches_for_nothing(tmp_path):
    d = tmp_path / "out"
    sd = StageDir.at(d, "x")
    with pytest.raises(UserError):
        with sd.writing(H, INPUTS, ["results.json"]):
            raise UserError("bad input found late")
    assert not (d / WORK).exists()
    with pytest.raises(UserError):
        with sd.writing(H, INPUTS, ["results.json"]):
            _write(d, "results.json", b"half")
            raise UserError("failed after writing")
    assert (d / WORK).exists() and sd.foreign() == []  # the half-written file stays ours to redo
    assert sd.status(H, INPUTS).state == "partial"
