"""Submit a data stage to an existing Ray cluster as a Ray Job, and follow it to the end.

The submission id is derived from the stage and its config hash, so submitting the same stage twice
(a Prefect retry, a rerun after the orchestrator died, two users) attaches to the job that is already
pending, running or finished instead of starting a second copy. A job that failed or was stopped is
resubmitted under the next id (``...-r1``, ``-r2``): Ray never reuses a submission id.

The job runs ``python -m data_jobs.<job> --config <yaml>``; the YAML lives beside the stage's output
(the cluster must see the same file system, as it must to write the output at all) and carries
``ray_address: auto`` so the job's driver joins the cluster it was submitted to instead of starting
a private one. No job-level runtime_env is set, so nothing is uploaded: the data jobs set their
workers' environment in ``ray.init`` (``data_jobs.ray_util``), and Ray refuses to merge two that name
the same variables. A submission that does carry one (``bertflow submit``, ``flows.submit``) goes
through the same ``_submit``, which first checks what its ``working_dir`` would upload
(``flows.upload``). Ray 2.60 authenticates clients with a token: set ``RAY_AUTH_MODE=token`` and
``RAY_AUTH_TOKEN`` (or ``~/.ray/auth_token``) as on the cluster's nodes.
"""
from __future__ import annotations

import logging
import shlex
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import yaml

from contracts.common import UserError, atomic_path
from contracts.storage import is_uri, location
from flows.upload import DEFAULT_LIMIT_MB, check_runtime_env

ACTIVE = {"PENDING", "RUNNING"}
MAX_RESUBMITS = 5


@dataclass(frozen=True)
class JobOutcome:
    submission_id: str
    status: str
    attached: bool  # True when an existing job was followed instead of submitting a new one
    log_lines: int


def submission_id(job: str, config_hash: str, attempt: int = 0) -> str:
    """Deterministic id: the same stage and config always map to the same first id."""
    base = f"bertflow-{job}-{config_hash}"
    return base if attempt == 0 else f"{base}-r{attempt}"


def job_key(job: str, config) -> str:
    """What names one run of a data job: its config hash and its inputs' content identity (from the
    job's own status), so a job over edited inputs is a new job, never the finished one re-attached."""
    import importlib

    from contracts.common import stable_hash

    state = importlib.import_module(f"data_jobs.{job}_job").status(config)
    return stable_hash([config.config_hash(), state.inputs])


def _client(address: str):
    from ray.job_submission import JobSubmissionClient

    try:
        return JobSubmissionClient(address)
    except Exception as err:  # connection refused, auth failure: both are the user's setup
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UserError(f"ray job address {address}: cannot connect: {first}") from None


def _job_status(client, sid: str) -> Optional[str]:
    """Status name of job ``sid``, or None when no such job was ever submitted."""
    try:
        return str(client.get_job_info(sid).status.value)
    except RuntimeError as err:  # the SDK raises RuntimeError('... does not exist') on 404
        if "does not exist" in str(err) or "404" in str(err):
            return None
        raise


def write_job_config(config, path: str | Path) -> str | Path:
    """The stage config as YAML for the job's ``--config``; it joins the cluster it runs on. ``path``
    may be an object-store URI: the job, on whichever node, reads its config from there."""
    data = config.model_dump(mode="json")
    if "ray_address" in data:
        data["ray_address"] = "auto"  # excluded from the config hash: the manifest still matches
    text = yaml.safe_dump(data, sort_keys=True)
    if is_uri(path):
        location(str(path)).write("", text.encode("utf-8"))
        return path
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return path


def job_config_path(output: str) -> str:
    """Where a data job's submitted config lies: ``.<name>.job.yaml`` beside its output, on the same
    storage (an object-store output gets an object-store config; no shared file system needed)."""
    if is_uri(output):
        parent, _, name = output.rstrip("/").rpartition("/")
        return f"{parent}/.{name}.job.yaml"
    out = Path(output)
    return str(out.parent / f".{out.name}.job.yaml")


def submit_or_attach(
    address: str,
    job: str,
    config,
    config_file: str | Path,
    python: str = "python",
    log: Callable[[str], None] | None = None,
    poll_s: float = 1.0,
    timeout_s: float = 24 * 3600,
) -> JobOutcome:
    """Run data job ``job`` (shard | vocab | instances) for ``config`` as a Ray Job and wait for it.

    Streams the job's log lines through ``log`` while it runs. Raises RuntimeError if the job fails
    (Prefect's retry then resubmits under the next id).
    """
    log = log or logging.getLogger(__name__).info
    client = _client(address)
    chash = job_key(job, config)
    for attempt in range(MAX_RESUBMITS + 1):
        sid = submission_id(job, chash, attempt)
        status = _job_status(client, sid)
        if status in ("FAILED", "STOPPED"):
            continue  # that attempt is over: try the next id
        attached = status is not None
        if attached:
            log(f"ray job {sid} already {status}: attaching instead of submitting again")
        else:
            write_job_config(config, config_file)
            entrypoint = f"{shlex.quote(python)} -m data_jobs.{job}_job --config {shlex.quote(str(config_file))}"
            _submit(client, entrypoint, sid, {"bertflow_stage": job, "config_hash": chash}, log)
            log(f"submitted ray job {sid}: {entrypoint}")
        status, lines = _follow(client, sid, log, poll_s, timeout_s)
        if status != "SUCCEEDED":
            info = client.get_job_info(sid)
            tail = " | ".join(client.get_job_logs(sid).strip().splitlines()[-3:])
            raise RuntimeError(f"ray job {sid} ended {status}: {info.message or ''} {tail}".strip())
        return JobOutcome(sid, status, attached, lines)
    raise RuntimeError(f"ray job for {job} {chash} failed {MAX_RESUBMITS + 1} times; giving up")


def _submit(client, entrypoint: str, sid: str, metadata: dict, log, patience_s: float = 90.0,
            runtime_env: Optional[dict] = None, runtime_env_source: str = "runtime env",
            max_upload_mb: float = DEFAULT_LIMIT_MB) -> None:
    """Submit, waiting out the head's start-up: its job agent answers 500 'No available agent' for a
    while after the dashboard is already up. Other errors are raised at once. A ``runtime_env`` whose
    local ``working_dir`` would upload more than ``max_upload_mb`` is refused (one-line UserError naming
    the biggest entries) before anything is sent."""
    check_runtime_env(runtime_env, runtime_env_source, max_upload_mb)
    delay, deadline = 1.0, time.monotonic() + patience_s
    while True:
        try:
            client.submit_job(entrypoint=entrypoint, submission_id=sid, metadata=metadata, runtime_env=runtime_env)
            return
        except RuntimeError as err:
            if "No available agent" not in str(err) or time.monotonic() > deadline:
                raise
            if _job_status(client, sid) is not None:
                return  # an earlier attempt got through after all
            log(f"ray job agent not ready yet; retrying the submission in {delay:.0f} s")
            time.sleep(delay)
            delay = min(delay * 2, 10.0)


def _follow(client, sid: str, log: Callable[[str], None], poll_s: float, timeout_s: float) -> tuple[str, int]:
    """Poll the job until it ends, forwarding each new log line once. Returns (status, lines seen)."""
    seen = 0
    deadline = time.monotonic() + timeout_s
    while True:
        status = _job_status(client, sid) or "PENDING"
        lines = client.get_job_logs(sid).splitlines()
        for line in lines[seen:]:
            log(f"[{sid}] {line}")
        seen = max(seen, len(lines))
        if status not in ACTIVE:
            return status, seen
        if time.monotonic() > deadline:
            raise TimeoutError(f"ray job {sid} still {status} after {timeout_s:.0f} s")
        time.sleep(poll_s)
