"""Prefect tasks: each asks its stage's own ``status(config)`` (the same answer the CLI gets), logs
why the stage is skipped or (re)done, and calls one function of data_jobs or bert_core.

Tasks are called directly from the flows (not ``.submit``): they run one after another in the flow's
own thread, so the data jobs run their local processes, or start or join Ray, from an ordinary
process, which is what works with Prefect's ephemeral API (a Ray task runner would give every Ray
worker its own throw-away server).
"""
from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any, Optional

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from contracts.common import UserError
from contracts.schema import Manifest

# Set to a stage name to make that stage's task fail once with a transient error (the next attempt,
# i.e. Prefect's retry, succeeds). Used by the tests to exercise retries with real stages; harmless
# when unset. The marker file beside the stage output records that the fault was injected.
FAULT_ENV = "BERTFLOW_INJECT_FAULT"


def _maybe_inject_fault(stage: str, out_dir: str | Path) -> None:
    if os.environ.get(FAULT_ENV) != stage:
        return
    marker = Path(out_dir).parent / f".fault-injected-{stage}-{Path(out_dir).name}"
    if not marker.exists():
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text("1")
        raise OSError(f"injected transient fault in stage {stage} ({FAULT_ENV})")


def _not_user_error(task, task_run, state) -> bool:
    """Retry condition: a UserError (bad config, missing input) will not fix itself; anything else may."""
    try:
        state.result()
    except UserError:
        return False
    except Exception:
        return True
    return True


@task(name="data-job", cache_policy=NO_CACHE, retry_condition_fn=_not_user_error)
def data_job(job: str, config: Any, ray_job_address: Optional[str] = None, job_python: str = "python") -> Manifest:
    """Run data job ``job`` (shard | vocab | instances) here (local processes or Ray, as its config's
    ``engine`` decides: data_jobs/fanout.py), or as a Ray Job at an address,
    unless the job's own ``status`` says its output is done for this config and these inputs."""
    log = get_run_logger()
    out = Path(config.output_dir)
    module = importlib.import_module(f"data_jobs.{job}_job")
    state = module.status(config)
    log.info(state.line(job) + f": {out}")
    if state.done:
        return Manifest.read(out)
    _maybe_inject_fault(job, out)
    if ray_job_address:
        from flows.ray_jobs import submit_or_attach

        cfg_file = out.parent / f".{out.name}.job.yaml"
        outcome = submit_or_attach(ray_job_address, job, config, cfg_file, python=job_python, log=log.info)
        log.info(f"ray job {outcome.submission_id} {outcome.status} ({outcome.log_lines} log lines)")
        manifest = Manifest.read(out)
    else:
        manifest = module.run(config)
    log.info(f"stage {job} done: {len(manifest.files)} files, totals {manifest.totals}")
    return manifest


def _record(phase: str, result, resumed: bool) -> dict:
    return {
        "phase": phase,
        "run_dir": str(result.run_dir),
        "last_checkpoint": str(result.last_checkpoint),
        "metrics_file": str(result.metrics_file),
        "final_metrics": dict(result.final_metrics or {}),
        "resumed": resumed,
    }


@task(name="pretrain-phase", cache_policy=NO_CACHE, retry_condition_fn=_not_user_error)
def train_phase(phase: str, config: Any) -> dict:
    """Train one phase (skipped when done; resumed when an earlier attempt was killed; started afresh
    when the run there was made from another config or other inputs)."""
    from bert_core import stage as train_stage  # = bert_core.train's status, without importing torch

    log = get_run_logger()
    stage = f"train:{phase}"
    state = train_stage.status(config)
    log.info(state.line(stage) + f": {config.output_dir}")
    if state.done:
        return _record(phase, train_stage.TrainResult.from_run_dir(config.output_dir), False)
    if state.state == "absent":
        train_stage.discard(config)  # a stale run (other config or inputs) is not continued
    _maybe_inject_fault(stage, config.output_dir)
    from bert_core.launch import launch

    resume = state.state == "partial"
    result = launch(config, resume, log=log.info)
    log.info(f"stage {stage} done: {dict(result.final_metrics or {})}")
    return _record(phase, result, resume)


@task(name="export", cache_policy=NO_CACHE, retry_condition_fn=_not_user_error)
def export_model(run_dir: str, out_dir: str) -> str:
    """Export the run's last checkpoint as a Hugging Face BERT directory (skipped if already there)."""
    from bert_core.stage import export_status  # = bert_core.export.status, without importing torch

    log = get_run_logger()
    state = export_status(run_dir, out_dir)
    log.info(state.line("export") + f": {out_dir}")
    if state.done:
        return str(out_dir)
    _maybe_inject_fault("export", out_dir)
    from bert_core.export import export_checkpoint

    path = export_checkpoint(run_dir, out_dir)  # locked; never deletes a user's file in out_dir
    log.info(f"stage export done: {path}")
    return str(path)


@task(name="evaluate-task", cache_policy=NO_CACHE, retry_condition_fn=_not_user_error)
def evaluate_task(kind: str, config: Any) -> dict:
    """Run one evaluation (intrinsic | glue | squad | ner); skipped when its status is done."""
    from evaluation import runner

    log = get_run_logger()
    stage = f"eval:{kind}"
    state = runner.status(kind, config)
    log.info(state.line(stage) + f": {config.output_dir}")
    if state.done:
        return runner.read_results(config)
    results = runner.evaluate(kind, config, state)
    log.info(f"stage {stage} done -> {config.output_dir}")
    return results
