"""Generated edits of the records the program writes and reads back (issue 24): dataset manifests, stage
and work records, output locks (local and leases), trainer state, checkpoint markers, model configs, run
configs, metrics logs, HF ``config.json`` and the loader cache, read in-process (no training, no Ray).

Each record is written valid, then edited as a user, a disk or a killed writer would: truncated, bytes
scrambled, a key missing or extra, a value of the wrong type, the wrong shape (a list, a scalar), nested
too deeply, Latin-1, an integer too long for JSON. The invariant on every case: the reader's answer (a
parsed record, a status, a lock held) or one UserError line naming the file or directory; never another
exception; nothing else on disk changed (a stage removes only what its records vouch for, a lock only
itself); a damaged cached copy is fetched again. Settings: tests/fuzz_settings.py.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from bert_core import checkpoint, loader_cache
from bert_core.config import preset
from bert_core.hf import read_hf
from bert_core.stage import TrainResult, latest_checkpoint
from bert_core.train import _prepare_run_dir
from bert_core.train_config import TrainConfig
from contracts import lease, lock
from contracts.common import UserError
from contracts.schema import MANIFEST_NAME, Manifest, file_entry
from contracts.stage import RECORD, WORK, StageDir
from contracts.storage import LocalLocation, Location
from evaluation.config import IntrinsicConfig
from evaluation.finetuned import read_record
from evaluation.intrinsic import checkpoints_of
from fuzz_settings import fuzz

HOSTILE = st.sampled_from([None, True, 0, -1, 2**70, 1.5, float("nan"), "", "x", "../../x", [], [1], {}, {"a": []}])


def deep(n: int) -> bytes:
    return b"[" * n + b"]" * n


@st.composite
def edited(draw, valid: dict) -> bytes:
    """The bytes of ``valid`` as JSON, edited one way (or not at all)."""
    how = draw(st.sampled_from(["valid", "truncate", "scramble", "retype", "retype", "missing", "extra", "shape",
                                "deep", "latin1", "huge_int", "empty"]))
    obj = json.loads(json.dumps(valid))
    keys = list(obj)
    if how == "retype" and keys:
        key = draw(st.sampled_from(keys))
        inner = obj[key]
        if isinstance(inner, dict) and inner and draw(st.booleans()):
            inner[draw(st.sampled_from(sorted(inner)))] = draw(HOSTILE)
        elif isinstance(inner, list) and inner and draw(st.booleans()):
            inner[draw(st.integers(0, len(inner) - 1))] = draw(HOSTILE)
        else:
            obj[key] = draw(HOSTILE)
    elif how == "missing" and keys:
        del obj[draw(st.sampled_from(keys))]
    elif how == "extra":
        obj[draw(st.sampled_from(["zz", "files", "kind", "pid"]))] = draw(HOSTILE)
    elif how == "shape":
        return json.dumps(draw(st.sampled_from([[obj], list(obj), "x", 7, None, True]))).encode()
    elif how == "deep":
        return deep(draw(st.sampled_from([50, 3000])))
    elif how == "latin1":
        return json.dumps({**obj, "note": "café"}, ensure_ascii=False).encode("latin-1")
    elif how == "huge_int":
        return json.dumps(obj).replace("{", '{"n": ' + "9" * 5000 + ", ", 1).encode()
    elif how == "empty":
        return b""
    data = json.dumps(obj).encode()
    # Places as fractions of the length: a record holding a temporary path differs in length between runs.
    if how == "truncate":
        return data[: int(draw(st.floats(0, 1, exclude_max=True)) * len(data))]
    if how == "scramble":
        data = bytearray(data)
        for _ in range(draw(st.integers(1, 4))):
            data[int(draw(st.floats(0, 1, exclude_max=True)) * len(data))] = draw(st.integers(0, 255))
        return bytes(data)
    return data


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def one_line(err: UserError, *names: object) -> None:
    text = str(err)
    assert "\n" not in text and text.strip(), text
    assert any(str(n) in text for n in names), f"{text!r} names none of {names}"


# --- dataset manifests --------------------------------------------------------------------------------

def manifest_dir(root: Path) -> tuple[Path, dict]:
    d = root / "docs"
    d.mkdir()
    (d / "part-00000.parquet").write_bytes(b"not really parquet, but checksummed")
    m = Manifest(kind="documents", config={"a": 1}, config_hash="0" * 16, files=[file_entry(d / "part-00000.parquet", 1)],
                 totals={"documents_read": 1})
    return d, m.model_dump(mode="json")


@given(edit=st.data())
@fuzz(200)
@example(edit=None)  # (the valid manifest: read and verified)
@example(edit='{"kind": "café"}'.encode("latin-1"))  # UnicodeDecodeError traceback (found)
def test_manifest(tmp_path_factory, edit):
    root = tmp_path_factory.mktemp("manifest")
    d, valid = manifest_dir(root)
    data = json.dumps(valid).encode() if edit is None else edit if isinstance(edit, bytes) else edit.draw(edited(valid))
    (d / MANIFEST_NAME).write_bytes(data)
    before = snapshot(root)
    try:
        m = Manifest.read(d, "documents")
        m.verify_files(d)
        m.identity()
    except UserError as err:
        one_line(err, d)
    assert snapshot(root) == before


@pytest.mark.parametrize("data", [b"\xff\xfe{}", deep(100_000), ('{"kind": ' + "9" * 5000 + "}").encode()])
def test_manifest_found_cases(tmp_path, data):
    """Found: a manifest not in UTF-8 (UnicodeDecodeError) and one nested 100,000 deep (RecursionError, at
    the default recursion limit, which Hypothesis raises) escaped as tracebacks."""
    d, _ = manifest_dir(tmp_path)
    (d / MANIFEST_NAME).write_bytes(data)
    with pytest.raises(UserError) as err:
        Manifest.read(d, "documents")
    one_line(err.value, d)


# --- stage records and work records -------------------------------------------------------------------

STAGE = {"kind": "eval:glue", "config_hash": "h", "inputs": {"model": "m1"}, "files": ["results.json"]}
WORK_REC = {"kind": "eval:glue", "config_hash": "h", "inputs": {"model": "m1"}, "names": ["cells"]}


@given(which=st.sampled_from([RECORD, WORK]), edit=st.data())
@fuzz(200)
@example(which=RECORD, edit=deep(3000))  # RecursionError traceback (found; Hypothesis's recursion limit)
@example(which=WORK, edit=b'{"kind": "eval:glue", "names": ["..", "/etc", "notes.txt/x", ""]}')
def test_stage_records(tmp_path_factory, which, edit):
    root = tmp_path_factory.mktemp("stage")
    d = root / "out"
    d.mkdir()
    (root / "outside.txt").write_text("a sibling of the output: never touched")
    (d / "notes.txt").write_text("the user's")
    (d / "results.json").write_text("{}")
    (d / "report.md").write_text("ours once a record is there")
    (d / RECORD).write_text(json.dumps(STAGE))
    (d / WORK).write_text(json.dumps(WORK_REC))
    valid = STAGE if which == RECORD else WORK_REC
    (d / which).write_bytes(edit if isinstance(edit, bytes) else edit.draw(edited(valid)))
    stage = StageDir.at(d, "eval:glue", owns=frozenset({"report.md"}))
    before = snapshot(root)
    status = stage.status("h", {"model": "m1"})
    assert status.state in ("done", "partial", "absent")
    owned = stage.owned()
    assert all(isinstance(n, str) and "/" not in n and n not in ("", ".", "..") for n in owned), owned
    assert "notes.txt" in stage.foreign()
    with pytest.raises(UserError) as err:
        stage.refuse_foreign()
    one_line(err.value, d)
    assert snapshot(root) == before
    stage.remove_owned()
    after = snapshot(root)
    removed = set(before) - set(after)
    assert removed <= {f"out/{n}" for n in (RECORD, WORK, "results.json", "report.md")}, removed
    assert all(after[k] == before[k] for k in after) and "outside.txt" in after and "out/notes.txt" in after


# --- output locks: a local lock file and a lease ------------------------------------------------------

def holder(pid: int) -> dict:
    return {"host": socket.gethostname(), "pid": pid, "start": "1", "argv": ["bertflow"], "owner": "o",
            "expires": 4e9}


@given(edit=st.data(), pid=st.sampled_from([os.getpid(), 2**22 + 7]), kind=st.sampled_from(["lock", "lease"]))
@fuzz(200)
@example(edit=None, pid=0, kind="lock")  # AttributeError: a lock that is a JSON list (found)
def test_output_locks(tmp_path_factory, edit, pid, kind):
    root = tmp_path_factory.mktemp("lock")
    d = root / "out"
    d.mkdir()
    (d / "data.txt").write_text("kept")
    data = b"[1, 2]" if edit is None else edit.draw(edited(holder(pid)))
    (d / lock.LOCK_NAME).write_bytes(data)
    before = snapshot(root)
    try:
        if kind == "lock":
            with lock.output_lock(d):
                assert (d / lock.LOCK_NAME).is_file()
        else:
            lease.acquire(LocalLocation(d), ttl=60).release()
    except UserError as err:
        one_line(err, d)
        assert snapshot(root) == before, "a refused lock changed a file"
        return
    after = snapshot(root)
    assert {k: v for k, v in after.items() if k != f"out/{lock.LOCK_NAME}"} == \
           {k: v for k, v in before.items() if k != f"out/{lock.LOCK_NAME}"}


@pytest.mark.parametrize("data", [deep(100_000), json.dumps(holder(10**30)).encode(), b'"x"'])
def test_lock_found_cases(tmp_path, data):
    """Found: a lock nested 100,000 deep (RecursionError), a pid no process can have (OverflowError from
    os.kill) and a lock that is a JSON string (AttributeError) escaped as tracebacks. Each is an unknown
    holder: refused in one line, never taken over."""
    for take in (lambda d: lock.output_lock(d).__enter__(), lambda d: lease.acquire(LocalLocation(d))):
        d = tmp_path / f"out{take.__code__.co_firstlineno}{len(list(tmp_path.iterdir()))}"
        d.mkdir()
        (d / lock.LOCK_NAME).write_bytes(data)
        with pytest.raises(UserError) as err:
            take(d)
        one_line(err.value, d)
        assert (d / lock.LOCK_NAME).read_bytes() == data


# --- a run directory: trainer state, checkpoint marker, model config, run config, metrics log ---------

TINY = preset("tiny").model_dump(mode="json")
RUN_FILES = ["trainer_state.json", "COMPLETE", "model_config.json", "train_config.json", "metrics.jsonl"]


def run_dir(root: Path) -> tuple[Path, Path, TrainConfig, dict]:
    """A run with one finished checkpoint (no weights: reading stops there with a UserError)."""
    run, data = root / "run", root / "instances"
    ckpt = run / "checkpoints" / "step_00000010"
    ckpt.mkdir(parents=True)
    data.mkdir()
    config = TrainConfig(data_dir=str(data), output_dir=str(run), max_steps=20)
    valid = {"trainer_state.json": {"step": 10, "engine": "torch", "zero_stage": 0},
             "model_config.json": TINY,
             "train_config.json": {"config": config.model_dump(mode="json"), "inputs": {"data_dir": "missing"}}}
    for name, obj in valid.items():
        (run / name if name == "train_config.json" else ckpt / name).write_text(json.dumps(obj))
    (run / "metrics.jsonl").write_text('{"step": 5, "loss": 7.5}\n{"step": 10, "loss": 7.0}\n')
    files = {n: {"bytes": (ckpt / n).stat().st_size, "sha256": checkpoint.sha256_file(ckpt / n)}
             for n in ("trainer_state.json", "model_config.json")}
    valid["COMPLETE"] = {"step": 10, "files": files}
    (ckpt / "COMPLETE").write_text(json.dumps(valid["COMPLETE"]))
    return run, ckpt, config, valid


def read_run(run: Path, ckpt: Path, config: TrainConfig) -> None:
    """Everything that reads a run directory back without training (each may refuse in one line)."""
    result = TrainResult.from_run_dir(run)
    assert isinstance(result.final_metrics, dict)
    assert latest_checkpoint(run) in (ckpt, None) and checkpoint.CheckpointManager(run).all() in ([ckpt], [])
    intrinsic = IntrinsicConfig(model_path=str(ckpt), output_dir=str(run.parent / "eval"), instances_dir=str(run))
    for read in (lambda: checkpoint.read_state(ckpt), lambda: checkpoint.verify(ckpt),
                 lambda: dict(checkpoints_of(intrinsic)),
                 lambda: checkpoint.load_model_from_checkpoint(run),
                 lambda: _prepare_run_dir(config, run, resume=True), lambda: _prepare_run_dir(config, run, False)):
        try:
            out = read()
            assert out is None or isinstance(out, dict)
        except UserError as err:
            one_line(err, run)


@given(name=st.sampled_from(RUN_FILES), edit=st.data())
@fuzz(120)
@example(name="trainer_state.json", edit=b"[10]")  # AttributeError downstream: a state that is a list (found)
@example(name="COMPLETE", edit=b'{"files": [1]}')  # TypeError: an inventory that is a list (found)
@example(name="train_config.json", edit=b"[1]")  # TypeError on --resume: a run config that is a list (found)
@example(name="metrics.jsonl", edit=b'{"step": 1}\n\xff\xfe\n')  # UnicodeDecodeError (found)
@example(name="trainer_state.json", edit=b'{"step": "ten"}')  # ValueError from int("ten") in intrinsic (found)
def test_run_directory_records(tmp_path_factory, name, edit):
    root = tmp_path_factory.mktemp("run")
    run, ckpt, config, valid = run_dir(root)
    path = run / name if name in ("train_config.json", "metrics.jsonl") else ckpt / name
    if isinstance(edit, bytes):
        data = edit
    elif name == "metrics.jsonl":
        data = edit.draw(st.lists(edited({"step": 3, "loss": 1.0}), max_size=3).map(b"\n".join))
    else:
        data = edit.draw(edited(valid[name]))
    path.write_bytes(data)
    before = snapshot(root)
    read_run(run, ckpt, config)
    assert snapshot(root) == before


def test_run_directory_found_cases(tmp_path):
    """Found outside Hypothesis (default recursion limit): records nested 100,000 deep, and a directory
    step_final beside the checkpoints (ValueError from int("final"))."""
    run, ckpt, config, _ = run_dir(tmp_path)
    shutil.copytree(ckpt, ckpt.with_name("step_final"))
    assert latest_checkpoint(run) == ckpt and checkpoint.CheckpointManager(run).all() == [ckpt]
    for name in RUN_FILES:
        path = run / name if name in ("train_config.json", "metrics.jsonl") else ckpt / name
        saved = path.read_bytes()
        path.write_bytes(deep(100_000))
        before = snapshot(tmp_path)
        read_run(run, ckpt, config)
        assert snapshot(tmp_path) == before
        path.write_bytes(saved)


# --- a model directory's config.json (HF export, a kept fine-tuned model) -----------------------------

@given(edit=st.data(), which=st.sampled_from(["hf", "finetuned"]))
@fuzz(100)
@example(edit=b"[1, 2]", which="hf")  # AttributeError: a config.json that is a list (issue 24)
@example(edit=b"3", which="finetuned")
def test_model_directory_config(tmp_path_factory, edit, which):
    root = tmp_path_factory.mktemp("model")
    d = root / "model"
    d.mkdir()
    (d / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n")
    hf_config = {"model_type": "bert", "architectures": ["BertForPreTraining"], **TINY}
    if which == "finetuned":
        (d / "bertflow_finetuned.json").write_text(json.dumps({"format": "bertflow-glue-finetuned/1"}))
    name = "config.json" if which == "hf" or isinstance(edit, bytes) else "bertflow_finetuned.json"
    (d / "config.json").write_text(json.dumps(hf_config))
    data = edit if isinstance(edit, bytes) else edit.draw(edited(hf_config if name == "config.json" else
                                                                  {"format": "bertflow-glue-finetuned/1"}))
    (d / name).write_bytes(data)
    before = snapshot(root)
    with pytest.raises(UserError) as err:  # no weights: at best the reader stops there, in one line
        if which == "hf":
            read_hf(d)
        else:
            from evaluation.finetuned import load_finetuned
            load_finetuned(d) if name == "config.json" else read_record(d)
    one_line(err.value, d)
    assert snapshot(root) == before


# --- the loader's cache of an object store's files ----------------------------------------------------

class Store(Location):
    """An object store as the loader cache sees one: files it downloads (not read in place)."""

    def __init__(self, root: Path):
        self.root, self.uri = root, f"store://{root.name}"
        self.downloads = 0

    def download(self, name: str, local) -> None:
        self.downloads += 1
        shutil.copyfile(self.root / name, local)


@given(cached=st.one_of(st.none(), st.binary(max_size=64), st.data()))
@fuzz(150)
@example(cached="scramble")  # found: a cached copy damaged in place, same size, read as the data
def test_loader_cache_rebuilds_a_damaged_copy(tmp_path_factory, cached):
    root = tmp_path_factory.mktemp("cache")
    (root / "store").mkdir()
    original = bytes(range(256)) * 4
    (root / "store" / "instances-00000.parquet").write_bytes(original)
    entry = file_entry(root / "store" / "instances-00000.parquet", 10)
    local = root / "cache" / "ident" / entry.name
    local.parent.mkdir(parents=True)
    if cached == "scramble":
        cached = original[:100] + bytes([original[100] ^ 1]) + original[101:]
    elif cached is not None and not isinstance(cached, bytes):
        cached = cached.draw(edited({"rows": list(range(40))}).map(lambda b: (b + original)[: len(original)]))
    if cached is not None:
        local.write_bytes(cached)
    store, old = Store(root / "store"), os.environ.get(loader_cache.ENV)
    os.environ[loader_cache.ENV] = str(root / "cache")
    try:
        source = loader_cache.FileSource(store, "ident")
        assert source.path(entry).read_bytes() == original
        source.close()
    finally:
        os.environ.pop(loader_cache.ENV) if old is None else os.environ.__setitem__(loader_cache.ENV, old)
    assert store.downloads == (0 if cached == original else 1)
    assert (root / "store" / entry.name).read_bytes() == original
