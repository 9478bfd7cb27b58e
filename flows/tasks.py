"""Prefect tasks: each calls one function of data_jobs or bert_core, after checking whether its output
already exists for this exact config (then it says so and returns the existing result).

Tasks are called directly from the flows (not ``.submit``): they run one after another in the flow's
own thread, so the data jobs start or join Ray from an ordinary process, which is what works with
Prefect's ephemeral API (a Ray task runner would give every Ray worker its own throw-away server).
"""
from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any, Optional

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from contracts.common import UserError, write_json_atomic
from contracts.schema import MANIFEST_NAME, Manifest

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


def finished_manifest(directory: str | Path, config_hash: str) -> Optional[Manifest]:
    """The manifest of ``directory`` if it was produced by a config with this hash, else None."""
    if not (Path(directory) / MANIFEST_NAME).is_file():
        return None
    try:
        manifest = Manifest.read(directory)
    except UserError:
        return None  # corrupt: redo the stage
    return manifest if manifest.config_hash == config_hash else None


@task(name="data-job", cache_policy=NO_CACHE, retry_condition_fn=_not_user_error)
def data_job(job: str, config: Any, ray_job_address: Optional[str] = None, job_python: str = "python") -> Manifest:
    """Run data job ``job`` (shard | vocab | instances) locally on Ray, or as a Ray Job at an address."""
    log = get_run_logger()
    out = Path(config.output_dir)
    done = finished_manifest(out, config.config_hash())
    if done is not None:
        log.info(f"stage {job} already complete (manifest matches), skipping: {out}")
        return done
    _maybe_inject_fault(job, out)
    if ray_job_address:
        from flows.ray_jobs import submit_or_attach

        cfg_file = out.parent / f".{out.name}.job.yaml"
        outcome = submit_or_attach(ray_job_address, job, config, cfg_file, python=job_python, log=log.info)
        log.info(f"ray job {outcome.submission_id} {outcome.status} ({outcome.log_lines} log lines)")
        manifest = Manifest.read(out)
    else:
        module = importlib.import_module(f"data_jobs.{job}_job")
        log.info(f"stage {job}: running {module.__name__}.run -> {out}")
        manifest = module.run(config)
    log.info(f"stage {job} done: {len(manifest.files)} files, totals {manifest.totals}")
    return manifest


def _run_complete(config) -> Optional[dict]:
    """The record of a finished training run for exactly this config, else None."""
    marker = Path(config.output_dir) / "pipeline_complete.json"
    if not marker.is_file():
        return None
    import json

    try:
        record = json.loads(marker.read_text(encoding="utf-8"))
    except ValueError:
        return None
    return record if record.get("resume_hash") == config.resume_hash() else None


def _launch(config, resume: bool, log):
    """Train by the config's launcher: this process, Ray Train workers, or a torchrun/deepspeed launch."""
    from bert_core import train

    if config.launcher == "local":
        return train.run(config, resume=resume)
    if config.launcher == "ray":
        from bert_core.ray_train import launch

        return launch(config, resume=resume)
    return _launch_subprocess(config, resume, log)


def _launch_subprocess(config, resume: bool, log):
    """``torchrun``/``deepspeed`` starting ``bert_core.train`` ranks (hostfile for multi-node)."""
    if config.launcher == "deepspeed" and config.hostfile:
        from bert_core.hostfile import read_hostfile

        read_hostfile(config.hostfile)  # an unknown host: one clear error, not an ssh timeout later
    import shutil
    import subprocess
    import sys

    import yaml

    from bert_core import train
    from bert_core.checkpoint import CheckpointManager
    from flows.artifacts import read_metrics

    run_dir = Path(config.output_dir)
    cfg_file = run_dir.parent / f".{run_dir.name}.launch.yaml"
    cfg_file.parent.mkdir(parents=True, exist_ok=True)
    cfg_file.write_text(yaml.safe_dump(config.model_dump(mode="json")), encoding="utf-8")
    script = ["-m", "bert_core.train", "--config", str(cfg_file)] + (["--resume"] if resume else [])
    bindir = Path(sys.executable).parent
    if config.launcher == "torchrun":
        cmd = [str(bindir / "torchrun"), f"--nproc_per_node={config.num_workers}", *script]
    else:  # deepspeed launcher; on CPU it starts one process unless told the number of accelerators
        ds = shutil.which("deepspeed", path=str(bindir)) or "deepspeed"
        cmd = [ds] + (["--hostfile", config.hostfile] if config.hostfile else [f"--num_accelerators={config.num_workers}"])
        cmd += ["--module", *script[1:]]
    log.info("launching: " + " ".join(cmd))
    proc = subprocess.run(cmd, capture_output=True, text=True)
    for line in (proc.stdout + proc.stderr).splitlines()[-200:]:
        log.info(line)
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[0]} exited {proc.returncode}")
    rows = read_metrics(run_dir / train.METRICS_FILE)
    return train.TrainResult(run_dir, CheckpointManager(run_dir).latest(), run_dir / train.METRICS_FILE,
                             rows[-1] if rows else {})


@task(name="pretrain-phase", cache_policy=NO_CACHE, retry_condition_fn=_not_user_error)
def train_phase(phase: str, config: Any) -> dict:
    """Train one phase; resumes from the run's last checkpoint if an earlier attempt was killed."""
    log = get_run_logger()
    done = _run_complete(config)
    if done is not None:
        log.info(f"stage train:{phase} already complete (manifest matches), skipping: {config.output_dir}")
        return done
    from bert_core.checkpoint import CheckpointManager
    from bert_core.train import RUN_CONFIG

    run_dir = Path(config.output_dir)
    # An earlier attempt (killed, crashed, or a failed retry) left its config: continue that run.
    resume = (run_dir / RUN_CONFIG).is_file()
    if resume:
        latest = CheckpointManager(run_dir).latest()
        log.info(f"stage train:{phase}: resuming {run_dir} from {latest.name if latest else 'the start (no checkpoint yet)'}")
    else:
        log.info(f"stage train:{phase}: starting {config.model} for {config.max_steps} steps -> {run_dir}")
    _maybe_inject_fault(f"train:{phase}", run_dir)
    result = _launch(config, resume, log)
    record = {
        "phase": phase,
        "run_dir": str(result.run_dir),
        "last_checkpoint": str(result.last_checkpoint),
        "metrics_file": str(result.metrics_file),
        "final_metrics": dict(result.final_metrics or {}),
        "resumed": resume,
        "resume_hash": config.resume_hash(),
    }
    write_json_atomic(run_dir / "pipeline_complete.json", record)
    log.info(f"stage train:{phase} done: {record['final_metrics']}")
    return record


@task(name="export", cache_policy=NO_CACHE, retry_condition_fn=_not_user_error)
def export_model(run_dir: str, out_dir: str) -> str:
    """Export the run's last checkpoint as a Hugging Face BERT directory (skipped if already there)."""
    log = get_run_logger()
    out = Path(out_dir)
    stamp = out / "exported_from.json"
    if stamp.is_file() and stamp.read_text(encoding="utf-8").strip() == str(run_dir):
        log.info(f"stage export already complete (manifest matches), skipping: {out}")
        return str(out)
    _maybe_inject_fault("export", out)
    from bert_core.export import export_checkpoint

    path = export_checkpoint(run_dir, out)
    stamp.write_text(str(run_dir) + "\n", encoding="utf-8")
    log.info(f"stage export done: {path}")
    return str(path)


@task(name="evaluate-task", cache_policy=NO_CACHE, retry_condition_fn=_not_user_error)
def evaluate_task(kind: str, config: Any) -> dict:
    """Run one evaluation (intrinsic | glue | squad | ner); skipped if its results match the config."""
    import json

    log = get_run_logger()
    out = Path(config.output_dir)
    stamp, results_file = out / "pipeline_config_hash.txt", out / "results.json"
    if results_file.is_file() and stamp.is_file() and stamp.read_text().strip() == config.config_hash():
        log.info(f"stage eval:{kind} already complete (manifest matches), skipping: {out}")
        return json.loads(results_file.read_text(encoding="utf-8"))
    import evaluation

    results = getattr(evaluation, f"run_{kind}")(config)
    if not results_file.is_file():  # the evaluation writes it; keep the pipeline's view regardless
        write_json_atomic(results_file, results)
    stamp.write_text(config.config_hash() + "\n", encoding="utf-8")
    log.info(f"stage eval:{kind} done -> {out}")
    return results
