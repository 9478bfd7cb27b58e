"""The hostile battery (issue 10): every hostile case, through every entry point, one checker, one tally.

The cases are data, in sibling modules (each builds its inputs under a temp dir and returns
``{case id: hostile_check.Case}``):

    hostile_cases_input    damaged or odd input: names, JSONL, WikiExtractor, Gutenberg, manifests, GLUE
    hostile_cases_safety   never lose a user's data: the one-writer lock, output ownership, non-finite
                           numbers and loss, the vocab hash, --resume previous-good
    hostile_cases_battery  malformed input to every command (against the shared two-node Ray cluster)
    hostile_cases_flow     the same refusals inside Prefect flow runs (one driver, one test harness)
    hostile_cases_cluster  relative paths on a cluster, `ray job submit` user errors, torchrun, python -m

Every selected case runs once, a few at a time, in one module fixture (the entry points' import time
dominates); each test then checks one outcome with ``hostile_check.verify``: exit code, the one error
line, no traceback, the user's files byte-identical, nothing that looks finished. The tally per entry
point is printed at the end of the session (conftest.pytest_terminal_summary).
"""
from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

import pytest

import hostile_cases_battery as battery
import hostile_cases_cluster as cluster
import hostile_cases_flow as flow
import hostile_cases_input as hostile_input
import hostile_cases_safety as safety
from hostile_check import TALLY, run_all, verify

pytestmark = pytest.mark.slow

GROUPS = {"input": hostile_input, "safety": safety, "battery": battery, "flow": flow, "cluster": cluster}
GROUP_OF = {name: g for g, module in GROUPS.items() for name in module.IDS}
assert len(GROUP_OF) == sum(len(m.IDS) for m in GROUPS.values()), "a case id is used twice"
RAY_IDS = set(battery.IDS) | {n for n in cluster.IDS if n.startswith(("cluster-", "rjs-"))}
# Known failures: case id -> reason (strict xfail: the test fails once the entry point is fixed).
KNOWN: dict[str, str] = {}


def _params():
    for name in GROUP_OF:
        marks = [pytest.mark.ray] if name in RAY_IDS else []
        if name == "torchrun-rank-user-error":
            marks.append(pytest.mark.deepspeed)
        if name in flow.IDS:
            marks.append(pytest.mark.prefect)
        if name in KNOWN:
            marks.append(pytest.mark.xfail(strict=True, reason=KNOWN[name]))
        yield pytest.param(name, id=name, marks=marks)


def _selected(session) -> set[str]:
    """The case ids this session runs (only their groups are built, only they run)."""
    return {item.callspec.params["name"] for item in session.items
            if item.module.__name__ == __name__ and getattr(item, "callspec", None)}


@pytest.fixture(scope="module")
def outcomes(request, tmp_path_factory):
    selected = _selected(request.session)
    groups = {GROUP_OF[n] for n in selected}
    ray_env, dashboard, address = {}, "", ""
    if selected & RAY_IDS:
        c = request.getfixturevalue("two_node_cluster")
        ray_env, dashboard, address = c.env, f"http://127.0.0.1:{c.dashboard_port}", c.address
    t = tmp_path_factory.mktemp("hostile")
    holder = subprocess.Popen(["sleep", "3600"])  # a live process on this host "holding" some locks
    battery_dir = Path(tempfile.mkdtemp(prefix="battery", dir="/tmp"))  # short, 0755 (see battery.build)
    try:
        built = {}
        for g in sorted(groups):
            root = t / g
            root.mkdir()
            built[g] = {"input": lambda: hostile_input.build(root), "safety": lambda: safety.build(root, holder.pid),
                        "battery": lambda: battery.build(battery_dir, address),
                        "flow": lambda: flow.build(root, holder.pid),
                        "cluster": lambda: cluster.build(root, holder.pid, address)}[g]()
        cases = {n: c for g in built.values() for n, c in g.items() if n in selected}
        for n, c in cases.items():
            c.ray = c.ray or n in RAY_IDS
        results = run_all(cases, t, ray_env, dashboard)
        yield {"built": {g: sorted(b) for g, b in built.items()},
               "cases": {n: (cases[n], results[n]) for n in cases}}
    finally:
        holder.kill()
        holder.wait()
        battery.cleanup(battery_dir)


@pytest.mark.timeout(3600)  # the first test waits for every case of the battery (module fixture)
@pytest.mark.parametrize("name", list(_params()))
def test_hostile_case(outcomes, name):
    case, res = outcomes["cases"][name]
    tally = TALLY[case.entry]
    if "skip" in res:
        tally["skipped"] += 1
        pytest.skip(res["skip"])
    try:
        verify(case, res)
    except AssertionError:
        tally["failed"] += 1
        raise
    tally["passed"] += 1


def test_every_case_is_listed(outcomes):
    """Each case module builds exactly the cases its IDS list names (pytest parametrizes from the lists)."""
    for g, names in outcomes["built"].items():
        assert names == sorted(GROUPS[g].IDS), g
