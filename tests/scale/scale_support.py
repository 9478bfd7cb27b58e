"""Helpers for the scale-out and fault tests (a module of its own: conftest files are not importable).

``RayCluster`` starts a real two-node Ray cluster on 127.0.0.1 with ``ray start --block``: each node is
its own process group with its own ``--temp-dir`` and its own ports, so stopping (or killing) one node
touches exactly the processes it started. ``ray stop`` is never used: it stops every Ray process on the
machine, including the local clusters of other test sessions.
"""
from __future__ import annotations

import json
import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from free_ports import free_port  # noqa: E402,F401  (one port never handed out twice)
from hang import HANG_S  # noqa: E402  (the suite's one hang guard)

WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa "
         "quebec romeo sierra tango uniform victor whiskey xray yankee zulu river stone cloud light north "
         "south green paper table window garden summer winter market letter morning evening").split()


# DeepSpeed runs compared across launchers (torchrun 2 ranks, torchrun 2 nodes, Ray Train 2 nodes).
DS_ARGS = ["--engine", "deepspeed", "--zero-stage", "2", "--max-steps", "3", "--save-every", "3", "--log-every", "1",
           "--micro-batch-size", "4", "--lr", "1e-3", "--seed", "9"]
LOSS_KEYS = ("step", "loss", "mlm_loss", "nsp_loss", "grad_norm", "lr")


def losses(run_dir: Path) -> list[tuple]:
    """The logged trajectory of a run (floats compared exactly by the tests)."""
    rows = [json.loads(x) for x in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    return [tuple(r.get(k) for k in LOSS_KEYS) for r in rows]


def base_env(**extra: str) -> dict[str, str]:
    """Environment of every subprocess: repo importable, one thread, torch extensions cache kept."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "RAY_USAGE_STATS_ENABLED": "0", "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
           "TORCH_EXTENSIONS_DIR": os.environ.get("TORCH_EXTENSIONS_DIR",
                                                  str(Path.home() / ".cache" / "torch_extensions"))}
    env.pop("RAY_ADDRESS", None)
    env.update(extra)
    return env


def write_corpus(root: Path, files: int = 4, docs_per_file: int = 30, seed: int = 0) -> Path:
    """Synthetic text in BERT's format (one sentence per line, blank line between documents): no
    sentence splitter to run, so the data jobs take seconds. Deterministic for a seed."""
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    for f in range(files):
        docs = []
        for _ in range(docs_per_file):
            sents = []
            for _ in range(rng.randint(3, 12)):
                words = [rng.choice(WORDS) for _ in range(rng.randint(4, 14))]
                sents.append(" ".join(words).capitalize() + ".")
            docs.append("\n".join(sents))
        (root / f"part{f:02d}.txt").write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    return root


def run_cli(args: list[str], env: dict[str, str], timeout: float = HANG_S, cwd: Path | None = None
            ) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=timeout,
                          cwd=cwd or REPO)


def tree_bytes(d: Path, pattern: str = "*.parquet") -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(Path(d).glob(pattern))}


def kill_group(proc: subprocess.Popen, sig: int = signal.SIGKILL, wait: float = 30) -> None:
    """Signal a process we started with start_new_session=True, and everything in its group."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
    try:
        proc.wait(wait)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


# What `ray start` prints when one of its ports is taken.
PORT_TAKEN = ("is trying to use a port number", "already in use", "Failed to bind")


class RayCluster:
    """A head (1 CPU, resource ``head``) and a worker node (1 CPU, resource ``worker_node``) on 127.0.0.1,
    with Ray 2.60 token authentication on (``RAY_AUTH_MODE=token``, a fresh random token)."""

    def __init__(self, root: Path):
        # Ray's socket paths have a length limit: keep the temp dirs short, under /tmp.
        self.tmp = Path(tempfile.mkdtemp(prefix="rs", dir="/tmp"))
        self.root = root
        self.home = root / "home"  # the real ~/.ray is never touched
        self.home.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.dashboard_port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.env = base_env(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32), HOME=str(self.home),
                            # A killed node is declared dead after ~5 failed 1 s health checks instead of
                            # Ray's ~30 s default (a refused connection fails at once; 5 s timeout for load).
                            RAY_health_check_period_ms="1000", RAY_health_check_timeout_ms="5000",
                            RAY_health_check_failure_threshold="5")
        self.head: subprocess.Popen | None = None
        self.worker: subprocess.Popen | None = None

    def _node_ports(self) -> list[str]:
        return [f"--node-manager-port={free_port()}", f"--object-manager-port={free_port()}",
                f"--dashboard-agent-listen-port={free_port()}", f"--dashboard-agent-grpc-port={free_port()}",
                f"--runtime-env-agent-port={free_port()}", f"--metrics-export-port={free_port()}"]

    def _start(self, args: list[str], name: str) -> subprocess.Popen:
        log = open(self.root / f"{name}.log", "wb")
        cmd = [str(BIN / "ray"), "start", "--block", "--disable-usage-stats", "--node-ip-address=127.0.0.1",
               "--num-cpus=1", *args, *self._node_ports()]
        return subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def start(self) -> "RayCluster":
        def head_args() -> list[str]:
            return ["--head", f"--port={self.port}", '--resources={"head": 1}', f"--temp-dir={self.tmp / 'h'}",
                    "--include-dashboard=true", "--dashboard-host=127.0.0.1",
                    f"--dashboard-port={self.dashboard_port}", f"--ray-client-server-port={free_port()}"]

        def fresh_head_ports() -> None:
            self.port, self.dashboard_port = free_port(), free_port()
            self.address = f"127.0.0.1:{self.port}"

        self.head = self._start_node(head_args, "head", fresh_head_ports)
        self.start_worker()
        return self

    def start_worker(self) -> None:
        self.worker = self._start_node(lambda: [f"--address={self.address}", '--resources={"worker_node": 1}',
                                                f"--temp-dir={self.tmp / 'w'}"], "worker")
        self.wait_nodes(2, self.worker)

    def _start_node(self, args, name: str, on_retry=None) -> subprocess.Popen:
        """`ray start` one node and wait for it. A port taken by another process between being chosen and
        being bound (a shared CI machine) makes Ray exit at once: that start is retried with fresh ports,
        at most twice; any other failure is raised with the logs."""
        for attempt in range(3):
            proc = self._start(args(), name)
            try:
                self._wait_log(proc, name)
                return proc
            except RuntimeError:
                text = (self.root / f"{name}.log").read_text(errors="replace")
                if attempt == 2 or not any(m in text for m in PORT_TAKEN):
                    raise
                kill_group(proc, signal.SIGKILL)
                if on_retry is not None:
                    on_retry()
        raise AssertionError("unreachable")

    def _wait_log(self, proc: subprocess.Popen, name: str, timeout: float = HANG_S) -> None:
        """`ray start --block` prints "Ray runtime started." once the node is up: cheaper than a driver."""
        log, deadline = self.root / f"{name}.log", time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"ray start ({name}) exited {proc.returncode}:\n{self.logs()}")
            if "Ray runtime started" in log.read_text(errors="replace"):
                return
            time.sleep(0.3)
        raise TimeoutError(f"Ray {name} not up after {timeout} s:\n{self.logs()}")

    def nodes(self) -> list[dict]:
        """ray.nodes() of the cluster, read by a short driver subprocess (the test process stays Ray-free)."""
        code = ("import json, ray; ray.init(address=%r, log_to_driver=False); "
                "print('NODES ' + json.dumps([{'id': n['NodeID'], 'alive': n['Alive'], 'res': n['Resources']} "
                "for n in ray.nodes()]))" % self.address)
        proc = run_cli(["-c", code], self.env, timeout=HANG_S)
        line = [x for x in proc.stdout.splitlines() if x.startswith("NODES ")]
        return json.loads(line[0][6:]) if line else []

    def wait_nodes(self, n: int, proc: subprocess.Popen, timeout: float = HANG_S) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"ray start exited {proc.returncode}:\n{self.logs()}")
            if sum(x["alive"] for x in self.nodes()) >= n:
                return
            time.sleep(1)
        raise TimeoutError(f"{n} Ray nodes not up after {timeout} s:\n{self.logs()}")

    def node_ids(self) -> dict[str, str]:
        """{'head' | 'worker_node': node id} of the live nodes."""
        out = {}
        for n in self.nodes():
            if n["alive"]:
                out.update({k: n["id"] for k in ("head", "worker_node") if k in n["res"]})
        return out

    def tasks(self, state: str | None = "FINISHED") -> list[tuple[str, str, str, str]]:
        """(job id, task name, node id, state) of every task attempt (only ``state`` ones if given),
        from Ray's state API; task events reach it about once a second: polled until two reads agree."""
        flt = [("state", "=", state)] if state else []
        code = f"""
import json, time, ray
from ray.util.state import list_tasks
ray.init(address={self.address!r}, log_to_driver=False)
prev = None
for _ in range(20):
    rows = list_tasks(address="http://127.0.0.1:{self.dashboard_port}", filters={flt!r}, detail=True,
                      limit=10000, raise_on_missing_output=False)
    cur = sorted((t.job_id, t.name, t.node_id or "", t.state) for t in rows)
    if cur == prev:
        break
    prev = cur
    time.sleep(1.5)
print("TASKS " + json.dumps(cur))
"""
        proc = run_cli(["-c", code], self.env, timeout=HANG_S)
        line = [x for x in proc.stdout.splitlines() if x.startswith("TASKS ")]
        assert line, proc.stderr[-3000:]
        return [tuple(r) for r in json.loads(line[0][6:])]

    def task_nodes(self, exclude_jobs: set[str] = frozenset()) -> dict[str, set[tuple[str, str]]]:
        """{job id: {(task name, node id)}} of every finished task."""
        out: dict[str, set[tuple[str, str]]] = {}
        for job, name, node, _ in self.tasks():
            if job not in exclude_jobs:
                out.setdefault(job, set()).add((name, node))
        return out

    def actor_nodes(self, class_name: str) -> list[str]:
        """Node ids of every actor (alive or dead) of ``class_name``, from Ray's state API."""
        code = f"""
import json, ray
from ray.util.state import list_actors
ray.init(address={self.address!r}, log_to_driver=False)
rows = list_actors(address="http://127.0.0.1:{self.dashboard_port}", limit=10000, raise_on_missing_output=False)
print("ACTORS " + json.dumps([a.node_id for a in rows if a.class_name == {class_name!r}]))
"""
        proc = run_cli(["-c", code], self.env, timeout=HANG_S)
        line = [x for x in proc.stdout.splitlines() if x.startswith("ACTORS ")]
        assert line, proc.stderr[-3000:]
        return json.loads(line[0][7:])

    def kill_worker(self) -> None:
        """SIGKILL the worker node's whole process group (raylet, its workers, agents): a node failure."""
        if self.worker is not None:
            kill_group(self.worker, signal.SIGKILL)

    def _kill_strays(self) -> None:
        """Any process still naming this cluster's temp dir on its command line (one that left the
        process group) is ours: kill it by pid."""
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            try:
                cmd = (d / "cmdline").read_bytes()
            except OSError:
                continue
            if str(self.tmp).encode() in cmd:
                try:
                    os.kill(int(d.name), signal.SIGKILL)
                except OSError:
                    pass

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-2000:] for p in sorted(self.root.glob("*.log")))

    def stop(self) -> None:
        # SIGKILL, not SIGTERM: a graceful Ray node drains for up to 30 s, and nothing here needs saving.
        for proc in (self.worker, self.head):
            if proc is not None:
                kill_group(proc, signal.SIGKILL)
        self._kill_strays()
        # `ray start --head` records its address for ray.init(address="auto"); leave no stale pointer.
        current = Path(tempfile.gettempdir()) / "ray" / "ray_current_cluster"
        try:
            if current.read_text().strip() == self.address:
                current.unlink()
        except OSError:
            pass
        shutil.rmtree(self.tmp, ignore_errors=True)


def truncate_file(p: Path) -> None:
    """Cut a file in half (a write that stopped midway)."""
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])


def flip_bytes(p: Path) -> None:
    """Flip 8 bytes in the middle, keeping the size: only a checksum can tell."""
    data = bytearray(p.read_bytes())
    mid = len(data) // 2
    for i in range(mid, mid + 8):
        data[i] ^= 0xFF
    p.write_bytes(bytes(data))
