"""Run a command and measure its whole process tree: wall time, CPU time and peak RSS of the driver
plus every worker it starts (``/usr/bin/time`` on the driver misses workers that are not its reaped
children: a fork server's, Ray's raylet's).

CPU time is the sum, over every process seen in the tree, of its last sampled user+system time (or
the kernel's total for the reaped tree, if larger); peak RSS is the largest sum of the tree's RSS
over the samples (every 20 ms).
"""
from __future__ import annotations

import resource
import subprocess
import threading
import time
from dataclasses import dataclass

import psutil

SAMPLE_S = 0.02


@dataclass
class TreeRun:
    wall_s: float
    cpu_s: float
    peak_rss_mb: float
    returncode: int
    stdout: str
    stderr: str


def run_tree(cmd: list[str], env: dict | None = None, cwd: str | None = None, timeout: float = 3600) -> TreeRun:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    root = psutil.Process(proc.pid)
    cpu: dict[int, float] = {}
    peak = 0
    out_chunks: list[str] = []
    # Read the pipes in threads so a chatty child never blocks on a full pipe while we sample.
    def drain(stream, sink):
        sink.append(stream.read())

    err_chunks: list[str] = []
    threads = [threading.Thread(target=drain, args=(proc.stdout, out_chunks), daemon=True),
               threading.Thread(target=drain, args=(proc.stderr, err_chunks), daemon=True)]
    for t in threads:
        t.start()
    while proc.poll() is None:
        if time.perf_counter() - t0 > timeout:
            proc.kill()
            break
        rss = 0
        try:
            procs = [root] + root.children(recursive=True)
        except psutil.NoSuchProcess:
            procs = []
        for p in procs:
            try:
                with p.oneshot():
                    times = p.cpu_times()
                    cpu[p.pid] = max(cpu.get(p.pid, 0.0), times.user + times.system)
                    rss += p.memory_info().rss
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        peak = max(peak, rss)
        time.sleep(SAMPLE_S)
    wall = time.perf_counter() - t0
    proc.wait()
    for t in threads:
        t.join()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    reaped = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return TreeRun(wall, max(sum(cpu.values()), reaped), peak / 2**20, proc.returncode,
                   "".join(out_chunks), "".join(err_chunks))


def emit(lines: list[str], out: str | None) -> None:
    """Print a benchmark's report; with ``out`` (its --out), also write it there: the committed result."""
    from pathlib import Path

    report = "\n".join(lines)
    print(report)
    if out:
        Path(out).write_text(report + "\n", encoding="utf-8")
