"""The model registry (flows.registry) and ``bertflow models``, on a local directory and on a real
S3-compatible server (moto's server mode): the same assertions for both, as for the storage seam."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from contracts.common import UserError
from contracts.storage import location
from flows.gate import GateConfig, decide
from flows.registry import POINTER, Registry, registry_markdown
from hang import HANG_S

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["local", "s3"])
def root(request, tmp_path) -> str:
    if request.param == "local":
        return str(tmp_path / "registry")
    return request.getfixturevalue("s3_env") + "/team/registry"


def _chain(reg: Registry, n: int = 3) -> list[str]:
    """n models, each continuing the previous, each gated against its parent; the first one promoted."""
    ids, parent_metrics = [], None
    for i in range(n):
        metrics = {"heldout_loss_new": 3.0 - 0.1 * i, "heldout_loss_old": 2.0}
        entry = reg.register(export=f"s3://exports/m{i}", parent=ids[-1] if ids else None,
                             snapshots=[f"s{j}" for j in range(i + 1)],
                             config_hashes={"train": f"h{i}"}, metrics=metrics,
                             gate=decide(metrics, parent_metrics, GateConfig()), model_id=f"m{i}")
        ids.append(entry.id)
        parent_metrics = metrics
    return ids


def test_register_list_show_promote_rollback_round_trip(root):
    reg = Registry(root)
    assert reg.list() == [] and reg.promoted() is None and reg.pointer() == (None, None)
    ids = _chain(reg)
    again = Registry(root)  # another process's view: everything comes from the store
    assert [e.id for e in again.list()] == ids
    m1 = again.get("m1")
    assert (m1.parent, m1.snapshots, m1.config_hashes, m1.export) == (
        "m0", ["s0", "s1"], {"train": "h1"}, "s3://exports/m1")
    assert m1.metrics == {"heldout_loss_new": pytest.approx(2.9), "heldout_loss_old": 2.0}
    assert m1.gate.promote and "dropped by 0.1" in m1.gate.reason and m1.created.endswith("Z")

    for i in ids:
        again.promote(i, reason=f"test {i}")
    ptr, _ = again.pointer()
    assert ptr.promoted == "m2" and ptr.stack == ids and [(e.action, e.model, e.previous) for e in ptr.history] == [
        ("promote", "m0", None), ("promote", "m1", "m0"), ("promote", "m2", "m1")]
    assert ptr.history[0].reason == "test m0" and "pid" in ptr.history[0].by

    assert reg.rollback(reason="bad release").promoted == "m1" and reg.promoted().id == "m1"
    assert reg.rollback().promoted == "m0"
    with pytest.raises(UserError, match="nothing to roll back to: m0 is the only model"):
        reg.rollback()
    assert reg.promote("m2").promoted == "m2" and reg.pointer()[0].stack == ["m0", "m2"]
    assert [e.action for e in reg.pointer()[0].history] == ["promote"] * 3 + ["rollback"] * 2 + ["promote"]
    with pytest.raises(UserError, match="m2 is already the promoted model"):
        reg.promote("m2")


def test_lineage_and_ids(root):
    reg = Registry(root)
    ids = _chain(reg, 4)
    assert [e.id for e in reg.lineage("m3")] == ["m3", "m2", "m1", "m0"]
    assert [e.id for e in reg.lineage("m0")] == ["m0"]
    reg.promote("m2")
    table = registry_markdown(reg).splitlines()
    assert len(table) == 6 and table[2].startswith("| m3 | m2 | ") and table[3].startswith("| **m2** (promoted) | m1 |")
    assert "| promote: heldout_loss_new dropped by 0.1; heldout_loss_old did not rise (0) |" in table[3]
    with pytest.raises(UserError, match="model 'nope': not registered in"):
        reg.register(export="x", parent="nope")  # a parent must be registered
    with pytest.raises(UserError, match="model m1 is already registered"):
        reg.register(export="x", model_id="m1")  # never overwritten
    assert reg.get("m1").export == "s3://exports/m1"
    auto = reg.register(export="x", parent="m3", metrics={"loss": float("nan")})
    assert re.fullmatch(r"\d{8}T\d{6}Z-[0-9a-f]{6}", auto.id) and reg.get(auto.id[:17]).id == auto.id
    child = reg.register(export="y", parent=auto.id[:17])  # a parent given by a unique prefix
    assert reg.get(child.id).parent == auto.id and [e.id for e in reg.lineage(child.id)][1:3] == [auto.id, "m3"]
    assert reg.get(auto.id).metrics == {"loss": None}  # JSON has no NaN: a non-finite value is stored as null
    with pytest.raises(UserError, match="ambiguous"):
        reg.get("m")
    assert ids == ["m0", "m1", "m2", "m3"]


def test_gate_keep_needs_force_and_expect_guards(root):
    reg = Registry(root)
    _chain(reg, 2)
    keep = reg.register(export="x", parent="m1", metrics={"heldout_loss_new": 5.0},
                        gate=decide({"heldout_loss_new": 5.0}, reg.get("m1").metrics, GateConfig()), model_id="bad")
    reg.promote("m0")
    with pytest.raises(UserError, match="its gate decided keep .*heldout_loss_new did not drop.*--force"):
        reg.promote("bad")
    with pytest.raises(UserError, match="expected m1 promoted model, found m0"):
        reg.promote("m1", expect="m1")
    reg.promote("m1", expect="m0")
    ptr = reg.promote(keep.id, force=True)
    assert ptr.promoted == "bad" and ptr.history[-1].reason.startswith("manual override of the gate")


@pytest.mark.parametrize("first", [True, False], ids=["first-promotion", "later-promotion"])
def test_racing_promoters_exactly_one_wins(root, first):
    reg = Registry(root)
    _chain(reg, 1)
    for attempt in range(5):
        cands = [reg.register(export=f"x{i}", parent="m0", model_id=f"c{attempt}-{i}").id for i in range(4)]
        before = reg.promoted_id()
        wins, errors, crashes = [], [], []
        barrier = threading.Barrier(len(cands))

        def go(model_id):
            mine = Registry(root)
            barrier.wait()
            try:  # each promoter decided against the model promoted before: a flow passes what its gate saw
                mine.promote(model_id, expect=before)
                wins.append(model_id)
            except UserError as err:
                errors.append(str(err))
            except BaseException as err:  # noqa: BLE001 - reported below, never swallowed
                crashes.append(repr(err))
        threads = [threading.Thread(target=go, args=(c,)) for c in cands]
        [t.start() for t in threads]
        [t.join(HANG_S) for t in threads]
        assert len(wins) == 1 and not crashes, (attempt, wins, errors, crashes)
        assert len(errors) == len(cands) - 1 and all(
            ("promoted model changed meanwhile" in e or f"expected {before or 'no'} promoted model, found {wins[0]}"
             in e) and "\n" not in e and POINTER in e for e in errors), errors
        ptr, _ = reg.pointer()
        assert ptr.promoted == wins[0] and ptr.history[-1].model == wins[0]
        if first:
            assert len(ptr.history) == 1
            reg.loc.delete(POINTER)  # the next try races for a first promotion again
        else:
            assert ptr.history[-1].previous == before and len(ptr.stack) == attempt + 1


def _corrupt(reg: Registry, name: str, edit) -> None:
    reg.loc.write(name, edit(reg.loc.read(name)))


@pytest.mark.parametrize("name, edit, problem", [
    ("models/m1.json", lambda b: b[:-20], "corrupt registry entry: not JSON"),
    ("models/m1.json", lambda b: b.replace(b'"h1"', b'"h9"'), "registry entry edited or corrupt (checksum mismatch)"),
    ("models/m1.json", lambda b: json.dumps({"id": "m1"}).encode(), "registry entry edited or corrupt (no checksum)"),
    ("promoted.json", lambda b: b.replace(b'"m1"', b'"m0"'), "promoted pointer edited or corrupt (checksum mismatch)"),
    ("promoted.json", lambda b: b"", "corrupt promoted pointer: not JSON"),
])
def test_corrupt_entry_or_pointer_is_one_line_naming_it(root, name, edit, problem):
    reg = Registry(root)
    _chain(reg, 2)
    reg.promote("m0")
    reg.promote("m1")
    _corrupt(reg, name, edit)
    where = f"{root}/{name}"
    calls = [reg.list, lambda: reg.get("m1"), lambda: reg.lineage("m1")] if name.startswith("models") else \
        [reg.promoted, reg.rollback, lambda: reg.promote("m0")]
    for call in calls:
        with pytest.raises(UserError) as err:
            call()
        assert str(err.value).startswith(f"{where}: ") and problem in str(err.value) and "\n" not in str(err.value)
    rc, out, errtext = _cli(root, "list") if name.startswith("models") else _cli(root, "rollback")
    assert rc == 2 and out == "" and errtext.startswith(f"bertflow: error: {where}: ") and problem in errtext
    assert errtext.count("\n") == 1 and "Traceback" not in errtext


def test_a_stray_object_among_entries_is_named_not_skipped(root):
    reg = Registry(root)
    _chain(reg, 1)
    reg.loc.write("models/notes.txt", b"hello")
    with pytest.raises(UserError, match=r"models/notes.txt: not a registry entry"):
        reg.list()


def test_entry_with_a_valid_checksum_but_another_id_is_refused(root):
    reg = Registry(root)
    _chain(reg, 2)
    reg.loc.write("models/m0.json", reg.loc.read("models/m1.json"))
    with pytest.raises(UserError, match=r"models/m0.json: corrupt registry entry: holds id 'm1'"):
        reg.get("m0")


def _cli(root: str, *args: str) -> tuple[int, str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("BERTFLOW_REGISTRY", None)
    proc = subprocess.run([sys.executable, "-m", "flows.cli", "models", *args, "--registry", root], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=HANG_S)
    return proc.returncode, proc.stdout, proc.stderr


@pytest.mark.parametrize("root", ["s3"], indirect=True)  # the CLI is backend-blind: the library tests cover both
def test_cli_models_commands(root):
    rc, out, err = _cli(root, "list")
    assert (rc, err) == (0, "") and out.startswith("no models registered in ")
    reg = Registry(root)
    _chain(reg, 3)

    rc, out, err = _cli(root, "promote", "m0", "--reason", "first release")
    assert (rc, err, out) == (0, "", f"promoted m0 (was none) in {root}\n")
    assert _cli(root, "promote", "m2")[:2] == (0, f"promoted m2 (was m0) in {root}\n")
    rc, out, err = _cli(root, "list")
    assert rc == 0 and err == "", err
    lines = out.splitlines()
    assert lines[0].split() == ["ID", "PARENT", "CREATED", "SNAPSHOTS", "GATE", "METRICS"]
    assert [line.split()[:2] for line in lines[1:]] == [["m0", "-"], ["m1", "m0"], ["*", "m2"]]
    assert "s0,s1,s2" in lines[3] and "promote" in lines[3] and "heldout_loss_new=2.8" in lines[3]

    rc, out, _ = _cli(root, "list", "--json")
    listed = json.loads(out)
    assert rc == 0 and [(e["id"], e["promoted"]) for e in listed] == [("m0", False), ("m1", False), ("m2", True)]

    rc, out, _ = _cli(root, "show", "m2")
    assert rc == 0 and "id:         m2  (promoted)" in out and "lineage:    m2 <- m1 <- m0" in out
    assert "  train: h2" in out and "gate:       promote: heldout_loss_new dropped by 0.1" in out
    assert "  ok   heldout_loss_new: 2.8 vs 2.9 (-0.1), rule drop >= 0.01" in out
    rc, out, _ = _cli(root, "show", "promoted", "--json")
    assert rc == 0 and json.loads(out)["lineage"] == ["m2", "m1", "m0"]

    assert _cli(root, "rollback", "--reason", "regression", "--expect", "m2")[:2] == (
        0, f"rolled back: promoted m0 (was m2) in {root}\n")
    assert reg.pointer()[0].history[-1].reason == "regression"
    rc, out, _ = _cli(root, "list", "--history")
    lines = out.splitlines()
    assert rc == 0 and lines[0].split() == ["AT", "ACTION", "MODEL", "PREVIOUS", "BY", "REASON"] and len(lines) == 4
    assert lines[1].split()[2:5] == ["promote", "m0", "-"] and lines[1].endswith("first release")
    assert lines[3].split()[2:5] == ["rollback", "m0", "m2"] and lines[3].endswith("regression")
    rc, out, _ = _cli(root, "list", "--history", "--json")
    assert rc == 0 and [e["action"] for e in json.loads(out)] == ["promote", "promote", "rollback"]

    for args, problem in [
        (("show", "nope"), f"model 'nope': not registered in {root}"),
        (("promote", "m0"), "model m0 is already the promoted model"),
        (("rollback",), "nothing to roll back to: m0 is the only model ever promoted"),
        (("promote",), "the following arguments are required: ID"),
        (("promote", "m1", "--expect", "m2"), "promoting m1 refused: expected m2 promoted model, found m0"),
        (("promote", "m1", "--expect", "none"), "expected no promoted model, found m0"),
        (("list", "--bogus"), "unrecognized arguments: --bogus"),
    ]:
        rc, out, err = _cli(root, *args)
        assert (rc, out) == (2, ""), (args, out, err)
        assert err.startswith("bertflow: error: ") and problem in err and err.count("\n") == 1, (args, err)


def test_cli_needs_a_registry(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "BERTFLOW_REGISTRY"}
    proc = subprocess.run([sys.executable, "-m", "flows.cli", "models", "list"], cwd=REPO, capture_output=True,
                          text=True, env={**env, "PYTHONPATH": str(REPO)}, timeout=HANG_S)
    assert (proc.returncode, proc.stderr) == (2, "bertflow: error: --registry: missing (or set BERTFLOW_REGISTRY)\n")
    proc = subprocess.run([sys.executable, "-m", "flows.cli", "models", "list"], cwd=REPO, capture_output=True,
                          text=True, env={**env, "PYTHONPATH": str(REPO), "BERTFLOW_REGISTRY": str(tmp_path / "r")},
                          timeout=HANG_S)
    assert proc.returncode == 0 and "no models registered" in proc.stdout


def test_registry_accepts_a_location_and_file_uri(tmp_path):
    reg = Registry(location(tmp_path / "r"))
    _chain(reg, 1)
    assert [e.id for e in Registry(f"file://{tmp_path / 'r'}").list()] == ["m0"]
    assert (tmp_path / "r" / "models" / "m0.json").is_file()
