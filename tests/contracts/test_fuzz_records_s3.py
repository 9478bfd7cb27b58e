"""The records read back from an object store, edited (issue 24: the S3 variants of
tests/contracts/test_fuzz_records.py), on a real S3-compatible server (moto's on 127.0.0.1): a dataset's
manifest, a stage's record and work record, a prefix's lease, a checkpoint's COMPLETE marker and a
registry entry, each written valid and then edited as a user, a torn upload or another tool would. The
invariant on every case: the reader's answer or one UserError line naming the prefix; never another
exception; no object touched but those the records vouch for (a stage), or the lease itself.
Settings: tests/fuzz_settings.py (each example is a few HTTP requests)."""
from __future__ import annotations

import json
import uuid

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from contracts.common import UserError
from contracts.schema import MANIFEST_NAME, Manifest
from contracts.stage import RECORD, WORK, StageDir
from contracts.storage import location
from fuzz_settings import fuzz
from test_fuzz_records import STAGE, WORK_REC, deep, edited, holder, one_line

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


@pytest.fixture(scope="module")
def bucket(s3_server):
    import os

    saved = {k: os.environ.get(k) for k in s3_server.env()}
    os.environ.update(s3_server.env())
    try:
        yield f"s3://{s3_server.new_bucket()}"
    finally:
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)


def objects(uri: str) -> dict[str, bytes]:
    loc = location(uri)
    return {m.name: loc.read(m.name) for m in loc.list()}


def fresh(bucket: str) -> str:
    return f"{bucket}/{uuid.uuid4().hex[:12]}"


VALID_MANIFEST = Manifest(kind="documents", config={"a": 1}, config_hash="0" * 16, files=[], totals={}).model_dump(mode="json")


@given(edit=st.data())
@fuzz(30)
@example(edit=b"\xff\xfe{}")
@example(edit=deep(100_000))
def test_manifest_on_s3(bucket, edit):
    uri = fresh(bucket)
    location(uri).write(MANIFEST_NAME, edit if isinstance(edit, bytes) else edit.draw(edited(VALID_MANIFEST)))
    before = objects(uri)
    try:
        Manifest.read(uri, "documents").identity()
    except UserError as err:
        one_line(err, uri)
    assert objects(uri) == before


@given(which=st.sampled_from([RECORD, WORK]), edit=st.data())
@fuzz(30)
@example(which=WORK, edit=b'{"kind": "eval:glue", "names": ["..", "/etc", "notes.txt/x", ""]}')
@example(which=RECORD, edit=deep(3000))  # RecursionError traceback from the object store's reader (found)
def test_stage_records_on_s3(bucket, which, edit):
    uri = fresh(bucket)
    loc = location(uri)
    for name, data in [("notes.txt", b"the user's"), ("results.json", b"{}"), ("report.md", b"ours"),
                       (RECORD, json.dumps(STAGE).encode()), (WORK, json.dumps(WORK_REC).encode())]:
        loc.write(name, data)
    loc.write(which, edit if isinstance(edit, bytes) else edit.draw(edited(STAGE if which == RECORD else WORK_REC)))
    stage = StageDir.at(uri, "eval:glue", owns=frozenset({"report.md"}))
    before = objects(uri)
    assert stage.status("h", {"model": "m1"}).state in ("done", "partial", "absent")
    assert "notes.txt" in stage.foreign()
    with pytest.raises(UserError) as err:
        stage.refuse_foreign()
    one_line(err.value, uri)
    assert objects(uri) == before
    with stage.lock():
        stage.remove_owned()
    after = objects(uri)
    assert set(before) - set(after) <= {RECORD, WORK, "results.json", "report.md"}, set(before) - set(after)
    assert all(after[k] == before[k] for k in after) and after["notes.txt"] == b"the user's"


@given(edit=st.data())
@fuzz(30)
@example(edit=b"[1, 2]")
def test_lease_on_s3(bucket, edit):
    from contracts import lease

    uri = fresh(bucket)
    loc = location(uri)
    loc.write("data.txt", b"kept")
    loc.write(lease.LOCK_NAME, edit if isinstance(edit, bytes) else edit.draw(edited({**holder(2**22 + 7)})))
    before = objects(uri)
    try:
        lease.acquire(loc, ttl=60).release()
    except UserError as err:
        one_line(err, uri)
        assert objects(uri) == before, "a refused lease changed an object"
        return
    after = objects(uri)
    assert {k: v for k, v in after.items() if k != lease.LOCK_NAME} == \
           {k: v for k, v in before.items() if k != lease.LOCK_NAME}


MARKER = {"step": 40, "files": {"model_config.json": {"bytes": 2, "sha256": "0" * 64}}}


@given(edit=st.data(), where=st.sampled_from(["run", "checkpoint"]))
@fuzz(30)
def test_checkpoint_marker_on_s3(bucket, edit, where, tmp_path_factory, monkeypatch):
    from bert_core.remote_run import cached_checkpoint, remote_checkpoints, remote_identity

    monkeypatch.setenv("BERTFLOW_SCRATCH", str(tmp_path_factory.mktemp("scratch")))
    run = fresh(bucket)
    ckpt = f"{run}/checkpoints/step_00000040"
    location(ckpt).write("model_config.json", b"{}")
    location(ckpt).write("COMPLETE", edit.draw(edited(MARKER)))
    before = objects(run)
    target = run if where == "run" else ckpt
    try:
        found = remote_checkpoints(target)
        assert all(isinstance(s, int) and u.startswith(run) for s, u in found), found
        remote_identity(target)
        cached_checkpoint(target)  # the listed sizes and checksums never match {}: refused, or no files
    except UserError as err:
        one_line(err, run)
    assert objects(run) == before


@given(edit=st.data())
@fuzz(25)
@example(edit=deep(3000))  # RecursionError traceback from the registry's parser (found)
def test_registry_entry_on_s3(bucket, edit):
    from flows.registry import Registry

    root = fresh(bucket)
    reg = Registry(root)
    m = reg.register(export=f"{root}/export/a", parent=None, snapshots=["s1"], config_hashes={"train": "h"},
                     metrics={"heldout_loss_new": 2.5}, gate=None)
    name = next(x for x in objects(root) if x.startswith("models/"))
    valid = json.loads(location(root).read(name))
    location(root).write(name, edit if isinstance(edit, bytes) else edit.draw(edited(valid)))
    before = objects(root)
    try:
        entries = reg.list()
        assert all(e.id for e in entries)
        reg.get(m.id)
    except UserError as err:
        one_line(err, root)
    assert objects(root) == before
