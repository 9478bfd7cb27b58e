"""``make demo`` / ``python -m flows.demo``: the whole pipeline on the built-in corpus with the tiny model.

No server to start: Prefect uses its temporary local API (unless PREFECT_API_URL points at a server,
then the run shows up in its UI). No Ray either: the data jobs run as local processes (the fan-out
helper, data_jobs/fanout.py, picks them when no Ray address is given and $RAY_ADDRESS is unset),
training in this process, the evaluation one job after another. A second run finds every stage's
output for the same config and skips it.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Sequence

from contracts.common import run_main
from contracts.storage import location
from flows.config import demo_config, make_plan

# Offline, quiet defaults (set before Prefect is imported: it reads settings at import).
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m flows.demo", description=__doc__.splitlines()[0])
    p.add_argument("--output-root", default="runs/demo",
                   help="where everything lands: a directory or an s3:// prefix (default runs/demo)")
    p.add_argument("--max-steps", type=int, default=300, help="pretraining steps of the tiny model (default 300)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)

    from flows.pipeline import pretraining_pipeline

    cfg = demo_config(args.output_root, max_steps=args.max_steps)
    t0 = time.monotonic()
    result = pretraining_pipeline(cfg)
    plan = make_plan(cfg)
    last = result["train"]["phases"][list(result["train"]["phases"])[-1]]
    print()
    print(f"bertflow demo finished in {time.monotonic() - t0:.0f} s; everything is under {plan.root}")
    print(f"  checkpoint       {last['last_checkpoint']}")
    print(f"  metrics          {last['metrics_file']}")
    print(f"  loss curve       {result['train']['loss_curve']}")
    print(f"  exported model   {result['train']['export_dir']}  (loads with transformers.BertForPreTraining)")
    for kind, ecfg in plan.evals.items():
        name = "report.md" if location(ecfg.output_dir).exists("report.md") else "results.json"
        print(f"  {kind + ' report':<16} {str(ecfg.output_dir).rstrip('/')}/{name}")
    print(f"  summary          {result['summary']}")
    print("Run it again: every finished stage is skipped.")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
