"""What Prefect orchestration costs: the demo pipeline as plain function calls (baseline) against the
same stages as ``pretraining_pipeline`` under Prefect's ephemeral API, plus the all-skipped rerun.

    .venv/bin/python bench/bench_flows.py [--max-steps 20] [--keep DIR]

Both variants do the same work in fresh output roots (same config, so the same data and steps); the
ratio is measured in this run, on this machine's current load.
"""
from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def direct(cfg) -> float:
    """Every stage called directly: data jobs, training, export, intrinsic evaluation."""
    import evaluation, train
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
    p.add_argument("--keep", help="keep outputs here instead of a temporary directory")
    args = p.parse_args()
    from flows.config import demo_config

    base = Path(args.keep or tempfile.mkdtemp(prefix="bench_flows_"))
    try:
        # Ray starts once per process: start it before either variant so neither pays for it. The
        # flow's first run does include starting Prefect's temporary API: that is orchestration cost.
        from data_jobs.ray_util import ensure_ray

        ensure_ray()
        t_direct = direct(demo_config(str(base / "direct"), max_steps=args.max_steps))
        t_flow, t_rerun = flow(demo_config(str(base / "flow"), max_steps=args.max_steps))
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    print(f"bench_flows: demo pipeline, tiny model, {args.max_steps} steps")
    print(f"  direct function calls (baseline)       {t_direct:7.1f} s   1.00x")
    print(f"  pretraining_pipeline (Prefect, 1st)    {t_flow:7.1f} s   {t_flow / t_direct:.2f}x")
    print(f"  pretraining_pipeline rerun (skips all) {t_rerun:7.1f} s   {t_rerun / t_direct:.2f}x")


if __name__ == "__main__":
    main()
