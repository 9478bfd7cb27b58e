"""The hostile battery's one case type, its runner and its one checker (issue 10).

A case is data: the entry point it goes through, the command a user would type, what must come out
(the exit code and text of the one error line, or a successful exit), the user's files that must stay
byte-identical and the output directory that must not look finished. ``run_all`` runs every case a few
at a time (subprocesses; the flow cases in one Prefect driver process), snapshotting every user path
before the first case starts and after the last one ends; ``verify`` asserts everything, for every case:

  * the expected exit code (a flow case: the flow run's final state, Failed for a refusal);
  * exactly one ``bertflow: error:`` line naming the file or field (entry point forms: the CLI and
    ``python -m`` print it on stderr; ``ray job submit`` shows the job's log, which Ray may print twice:
    one distinct line; a flow run ends Failed and its one-line state message holds ``UserError: <line>``);
  * no ``Traceback`` anywhere in the output (a flow case: in the state message);
  * every user path byte-identical (files, trees, links; planted locks and foreign files included);
  * nothing new in the output directory that looks finished (a manifest, a COMPLETE checkpoint, an
    export record, results).
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from scale_support import BIN, REPO, base_env
from hang import HANG_S  # noqa: E402  (the suite's one hang guard)

CLI = ["-m", "flows.cli"]
ENTRIES = ("cli", "flow", "ray-job-submit", "python -m")
ERROR = "bertflow: error:"
FLOW_ERROR = "UserError: "  # a flow run's state message: "Flow run encountered an exception: UserError: ..."
FINISHED = ("manifest.json", "COMPLETE", "results.json", "export.json", "summary.json")
OUTPUT_FLAGS = ("--output-dir", "--out")
# Outcome counts per entry point, printed by conftest.pytest_terminal_summary.
TALLY: dict[str, dict[str, int]] = {e: {"passed": 0, "failed": 0, "skipped": 0} for e in ENTRIES}
SECONDS: dict[str, float] = {}  # wall seconds per case run in its own process: where the battery's time goes


@dataclass
class Case:
    argv: list[str]  # after `python` (cli / python -m / ray-job-submit); a flow case: [stage, config.yaml]
    expect: str = ""  # text the one error line must hold ("" and rc 0: the run must succeed)
    rc: int = 2  # expected exit code (a flow: 2 = ends Failed, 0 = ends Completed)
    entry: str = ""  # one of ENTRIES; derived from argv when empty
    out: Optional[Path] = None  # must not look finished afterwards (default: argv's --output-dir / --out)
    user: list[Path] = field(default_factory=list)  # more user paths that must stay byte-identical
    check: Optional[Callable[["Case", dict], None]] = None  # a further assertion on the outcome
    bare: bool = False  # the one line is all of stderr (argparse errors: no usage block)
    prefix: list[str] = field(default_factory=list)  # e.g. setpriv (root that obeys file modes)
    env: dict[str, str] = field(default_factory=dict)
    skip: str = ""  # why this case cannot run on this machine
    cwd: Optional[Path] = None  # the user's directory (default: the repository)
    ray: bool = False  # runs against the shared two-node Ray cluster (its address and token)
    name: str = ""

    def __post_init__(self) -> None:
        if not self.entry:
            self.entry = "cli" if self.argv[:2] == CLI else "python -m"
        assert self.entry in ENTRIES, self.entry
        self.ray = self.ray or self.entry == "ray-job-submit"
        if self.out is None:
            for flag in OUTPUT_FLAGS:
                if flag in self.argv:
                    self.out = Path(self.argv[self.argv.index(flag) + 1])

    def user_paths(self) -> list[Path]:
        """Every existing path named on the command line (inputs, configs) but the output (and the
        directories holding it), and the case's planted files: what the run may read and never change."""
        named = [Path(a) for a in self.argv if a.startswith("/") and Path(a).exists()]
        out = self.out.resolve() if self.out else None
        return [p for p in named if out is None or not out.is_relative_to(p.resolve())] + list(self.user)


def digest(p: Path) -> object:
    """Content of a path, links not followed: a file's hash, a link's target, a tree of both."""
    if p.is_symlink():
        return "link:" + os.readlink(p)
    if p.is_dir():
        out = {}
        for root, dirs, names in os.walk(p):
            for n in names + [d for d in dirs if Path(root, d).is_symlink()]:
                f = Path(root, n)
                out[os.fsencode(f.relative_to(p)).hex()] = digest(f)
        return out
    if not p.exists():
        return None
    return hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "special"


def finished_markers(d: Optional[Path]) -> set[str]:
    if d is None or not d.is_dir():
        return set()
    return {str(x) for x in d.rglob("*") if x.name in FINISHED}


def ray_job_submit(dashboard: str, entry: list[str]) -> list[str]:
    """The README's command (run from the repository): ray job submit --runtime-env ... -- python ..."""
    return [str(BIN / "ray"), "job", "submit", "--address", dashboard, "--runtime-env",
            "cluster/ray/runtime_env.yaml", "--", "python", *entry]


def _run_one(case: Case, ray_env: dict[str, str], dashboard: str) -> dict:
    if case.entry == "ray-job-submit":  # against the shared cluster's dashboard
        cmd = ray_job_submit(dashboard, case.argv)
    else:
        cmd = [*case.prefix, sys.executable, *case.argv]
    env = {**(ray_env if case.ray else base_env()), **case.env}
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, env=env, cwd=case.cwd or REPO, capture_output=True, timeout=HANG_S)
    except subprocess.TimeoutExpired as err:  # this case fails alone; the battery's other cases still count
        out = (err.stdout or b"").decode("utf-8", "replace")
        return {"rc": f"no exit after {HANG_S:.0f} s (hung?)", "stdout": out,
                "stderr": (err.stderr or b"").decode("utf-8", "replace")}
    SECONDS[case.name] = time.monotonic() - t0  # reported, never asserted (the machine is shared)
    return {"rc": proc.returncode, "stderr": proc.stderr.decode("utf-8", "replace"),
            "stdout": proc.stdout.decode("utf-8", "replace")}


def _run_flows(cases: dict[str, Case], work: Path) -> dict[str, dict]:
    """Every flow case in one driver process under one Prefect test harness (its start costs ~9 s)."""
    spec = work / "flow_cases.json"
    spec.write_text(json.dumps({n: c.argv for n, c in cases.items()}))
    result = work / "flow_results.json"
    try:
        proc = subprocess.run([sys.executable, str(Path(__file__).with_name("hostile_flow_driver.py")), str(spec),
                               str(result)], env=base_env(), cwd=REPO, capture_output=True, timeout=HANG_S)
        rc, out, err = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as e:  # the flow cases fail; the battery's other cases still count
        rc, out, err = f"no exit after {HANG_S:.0f} s (hung?)", e.stdout or b"", e.stderr or b""
    found = json.loads(result.read_text()) if result.is_file() else {}
    missing = {"rc": -1, "stdout": out.decode(errors="replace")[-3000:],
               "stderr": f"flow driver exited {rc}:\n{err.decode(errors='replace')[-3000:]}"}
    return {n: found.get(n, missing) for n in cases}


def run_all(cases: dict[str, Case], work: Path, ray_env: dict[str, str] | None = None, dashboard: str = "",
            workers: int = 3) -> dict[str, dict]:
    """Run every case (skipped ones excepted); each outcome carries its user-path and output snapshots."""
    for name, c in cases.items():
        c.name = name
    before = {n: ([digest(p) for p in c.user_paths()], finished_markers(c.out)) for n, c in cases.items()}
    paths = {n: c.user_paths() for n, c in cases.items()}
    flows = {n: c for n, c in cases.items() if c.entry == "flow" and not c.skip}
    with ThreadPoolExecutor(workers) as pool:
        flow_future = pool.submit(_run_flows, flows, work) if flows else None
        futures = {n: pool.submit(_run_one, c, ray_env or {}, dashboard) for n, c in cases.items()
                   if not c.skip and c.entry != "flow"}
        outcomes = {n: f.result() for n, f in futures.items()}
        if flow_future:
            outcomes.update(flow_future.result())
    for n, c in cases.items():
        if c.skip:
            outcomes[n] = {"skip": c.skip}
            continue
        outcomes[n]["user_changed"] = [str(p) for p, d in zip(paths[n], before[n][0]) if digest(p) != d]
        outcomes[n]["new_finished"] = sorted(finished_markers(c.out) - before[n][1])
    return outcomes


def error_lines(case: Case, res: dict) -> list[str]:
    if case.entry == "flow":
        msg = res.get("message") or ""
        return [msg[msg.index(FLOW_ERROR):]] if FLOW_ERROR in msg else []
    if case.entry == "ray-job-submit":  # the job's log, tailed and then repeated in the status message
        text = res["stdout"] + res["stderr"]
        return sorted({x[x.index(ERROR):] for x in text.splitlines() if ERROR in x})
    return [x for x in res["stderr"].splitlines() if x.startswith(ERROR)]


def verify(case: Case, res: dict) -> None:
    """Every assertion of the battery, for one case and its outcome."""
    text = res["stdout"] + res["stderr"] + (res.get("message") or "")
    tail = text[-3000:]
    assert "Traceback" not in (res.get("message", "") if case.entry == "flow" else text), tail
    assert res["rc"] == case.rc, f"exit {res['rc']}, want {case.rc}:\n{tail}"
    lines = error_lines(case, res)
    if case.rc:
        assert len(lines) == 1, f"{len(lines)} error lines:\n{tail}"
        assert lines[0].startswith(FLOW_ERROR if case.entry == "flow" else ERROR) and "\n" not in lines[0], lines[0]
        assert case.expect in lines[0], f"{case.expect!r} not named in: {lines[0]}"
        if case.bare:
            assert res["stderr"].strip() == lines[0], res["stderr"][-2000:]
        assert not res["new_finished"], f"looks finished: {res['new_finished']}"
    else:
        assert not lines, f"error lines in a run that should succeed:\n{tail}"
    assert not res["user_changed"], f"user files changed: {res['user_changed']}"
    if case.check is not None:
        case.check(case, res)
