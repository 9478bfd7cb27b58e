"""What Prefect orchestration costs: the demo pipeline as plain function calls (baseline) against the
same stages as ``pretraining_pipeline`` under Prefect's ephemeral API, plus the all-skipped rerun.

    .venv/bin/python bench/bench_flows.py [--max-steps 20] [--reps 2] [--out FILE]

Both variants do the same work in fresh output roots (same config, so the same data and steps), in
rounds whose order alternates (ABBA: this machine is noisy); each flow run is followed by its all-skipped
rerun. The ratios are against the direct calls of the same round, on this machine's current load.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def direct(cfg) -> float:
    """Every stage called directly: data jobs, training, export, intrinsic evaluation."""
    import evaluation
    from bert_core import train
    from bert_core.export import export_checkpoint
    from data_jobs import instances_job, shard_job, vocab_job
    from flows.config import make_plan

    t0 = time.perf_counter()
    plan = make_plan(cfg)
    shard_job.run(plan.shard)
    vocab_job.run(plan.vocab)
    for icfg in [*plan.instances.values(), plan.heldout]:
        instances_job.run(icfg)
    for tcfg in plan.train.values():
        result = train.run(tcfg)
    export_checkpoint(result.run_dir, plan.export_dir)
    evaluation.run_intrinsic(plan.evals["intrinsic"])
    return time.perf_counter() - t0


def flow(cfg) -> tuple[float, float]:
    from flows.pipeline import pretraining_pipeline

    t0 = time.perf_counter()
    pretraining_pipeline(cfg)
    t1 = time.perf_counter()
    pretraining_pipeline(cfg)
    return t1 - t0, time.perf_counter() - t1


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--max-steps", type=int, default=20)
    p.add_argument("--reps", type=int, default=2, help="rounds, each running both variants (default 2)")
    p.add_argument("--out", help="also write the report to this file")
    args = p.parse_args()
    from flows.config import demo_config

    lines: list[str] = []

    def say(text: str) -> None:
        print(text, flush=True)
        lines.append(text)

    base = Path(tempfile.mkdtemp(prefix="bench_flows_"))
    load = os.getloadavg()
    say(f"bench_flows {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: demo pipeline, tiny model, "
        f"{args.max_steps} steps; {os.cpu_count()} cores, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    rows = []
    try:
        # Ray starts once per process: start it before either variant so neither pays for it. The
        # flow's first run of the process does include starting Prefect's temporary API.
        from data_jobs.ray_util import ensure_ray

        ensure_ray()
        for r in range(args.reps):
            got = {}
            for variant in (["direct", "flow"] if r % 2 == 0 else ["flow", "direct"]):
                cfg = demo_config(str(base / f"{variant}-{r}"), max_steps=args.max_steps)
                got[variant] = direct(cfg) if variant == "direct" else flow(cfg)
            t_direct, (t_flow, t_rerun) = got["direct"], got["flow"]
            rows.append((t_direct, t_flow, t_rerun))
            say(f"  round {r + 1}: direct function calls (baseline) {t_direct:6.1f} s 1.00x; "
                f"pretraining_pipeline {t_flow:6.1f} s {t_flow / t_direct:.2f}x; "
                f"its rerun (every stage skipped) {t_rerun:6.1f} s {t_rerun / t_direct:.2f}x")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    say(f"median over {len(rows)} rounds: pipeline/direct {statistics.median(f / d for d, f, _ in rows):.2f}x, "
        f"rerun/direct {statistics.median(x / d for d, _, x in rows):.2f}x")
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
