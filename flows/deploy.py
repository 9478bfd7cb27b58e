"""``bertflow deploy`` and ``bertflow serve``: the pipeline's deployments, from Python.

``deploy`` registers them against the Prefect API in ``PREFECT_API_URL`` for a *process* work pool
(created if missing); a ``prefect worker start --pool <pool>`` on a machine with bertflow installed
then runs whatever is triggered (UI Run button, schedule, REST). ``serve`` needs no pool or worker:
this process polls for runs of the same deployments and executes them itself (one machine).

Entrypoints are module paths (``flows.pipeline.pretraining_pipeline``), so a worker loads the installed
package instead of a copy of the source tree. The same deployments are declared in ``prefect.yaml``
for ``prefect deploy --all``; tests keep both in step.
"""
from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from contracts.common import ArgParser, UserError

DEFAULT_POOL = "bertflow-process"
# Shipped switched off: a nightly retrain is an example to switch on, not something to start by
# surprise. Off is the *schedule's* own flag (active: false), which `prefect deployment schedule ls`
# shows and `prefect deployment schedule resume/pause` switch; the deployment itself is not paused.
EXAMPLE_CRON = "0 2 * * *"


CONTINUAL_CRON = "0 3 * * *"


@dataclass(frozen=True)
class DeploymentSpec:
    flow: str  # attribute of flows.<module>
    name: str
    description: str
    cron: Optional[str] = None  # in UTC
    schedule_active: bool = True  # False: the schedule is registered switched off
    tags: tuple[str, ...] = field(default_factory=tuple)
    module: str = "pipeline"  # flows.pipeline (parameter: a PipelineConfig) or flows.continual (a ContinualConfig)
    concurrency_limit: Optional[int] = None  # runs of this deployment at once (None: no limit)

    def load(self):
        import importlib

        return getattr(importlib.import_module(f"flows.{self.module}"), self.flow)


DEPLOYMENTS = (
    DeploymentSpec("pretraining_pipeline", "default", "data -> pretraining -> export -> evaluation", tags=("bertflow",)),
    DeploymentSpec("prepare_data", "default", "document shards, vocab and instances", tags=("bertflow", "data")),
    DeploymentSpec("pretrain", "default", "pretraining phases and export", tags=("bertflow", "train")),
    DeploymentSpec("evaluate", "default", "evaluations of the exported model", tags=("bertflow", "eval")),
    DeploymentSpec(
        "pretraining_pipeline", "scheduled", f"nightly pipeline (cron {EXAMPLE_CRON} UTC), schedule shipped inactive",
        cron=EXAMPLE_CRON, schedule_active=False, tags=("bertflow", "scheduled"),
    ),
    # Continual pretraining: each firing continues the promoted model on every new snapshot, gated.
    # A firing with no new snapshot ends in seconds, so the schedule is also the poll for new data.
    # One run at a time (Prefect's deployment concurrency limit; the writer lock refuses a second one anyway).
    DeploymentSpec(
        "continual_pretraining", "scheduled", f"continual pretraining (cron {CONTINUAL_CRON} UTC), schedule shipped "
        "inactive", cron=CONTINUAL_CRON, schedule_active=False, tags=("bertflow", "continual"), module="continual",
        concurrency_limit=1,
    ),
)


DEFAULT_OUTPUT_ROOT = "runs/prefect"  # output_root of the deployments registered without --config


def _parser(prog: str, what: str) -> argparse.ArgumentParser:
    p = ArgParser(prog=prog, description=what)
    p.add_argument("--config", help="PipelineConfig YAML used as the deployments' default parameters (default: demo preset)")
    p.add_argument("--output-root", help="override output_root in the default parameters")
    p.add_argument("--continual-config", help="ContinualConfig YAML: the continual deployment's default parameters "
                   "(default: snapshots under runs/snapshots, outputs under runs/continual)")
    p.add_argument("--only", action="append", metavar="FLOW/NAME",
                   help="only these deployments, e.g. prepare-data/default (repeatable)")
    return p


def _runner_deployments(args, work_pool: Optional[str], working_dir: Optional[str]) -> list:
    """RunnerDeployment objects for DEPLOYMENTS with the config as their default parameters."""
    from prefect.deployments.runner import EntrypointType
    from prefect.schedules import Cron

    from flows import continual, pipeline

    # Without a config, the demo preset under runs/prefect: the folder prefect.yaml's deployments use.
    output_root = args.output_root or (None if args.config else DEFAULT_OUTPUT_ROOT)
    cfg = pipeline.load_pipeline_config(args.config, output_root)
    ccfg = (continual.ContinualConfig.from_yaml(args.continual_config) if args.continual_config
            else continual.demo_continual_config())
    params = {"pipeline": {"config": cfg.model_dump(mode="json")}, "continual": {"config": ccfg.model_dump(mode="json")}}
    out = []
    for spec in DEPLOYMENTS:
        fl = spec.load()
        if args.only and f"{fl.name}/{spec.name}" not in args.only:
            continue
        kw: dict[str, Any] = dict(
            name=spec.name, description=spec.description, tags=list(spec.tags), parameters=params[spec.module],
            entrypoint_type=EntrypointType.MODULE_PATH, concurrency_limit=spec.concurrency_limit,
        )
        if spec.cron:
            kw["schedules"] = [Cron(spec.cron, timezone="UTC", active=spec.schedule_active)]
        if work_pool:
            kw["work_pool_name"] = work_pool
            kw["job_variables"] = {"working_dir": working_dir} if working_dir else {}
        out.append(fl.to_deployment(**kw))
    if not out:
        raise UserError(f"--only: no deployment named {args.only}; have "
                        + ", ".join(f"{s.load().name}/{s.name}" for s in DEPLOYMENTS))
    return out


def ensure_process_pool(name: str) -> None:
    """Create a process work pool called ``name`` unless it exists."""
    from prefect import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            client.read_work_pool(name)
            return
        except ObjectNotFound:
            pass
        try:
            client.create_work_pool(WorkPoolCreate(name=name, type="process"))
        except ObjectAlreadyExists:
            pass


def _require_api() -> str:
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    if not url:
        raise UserError("PREFECT_API_URL: not set; start a server (prefect server start) and export "
                        "PREFECT_API_URL=http://127.0.0.1:4200/api (see docs/flows.md)")
    return url


def main_deploy(argv: Sequence[str] | None = None) -> int:
    p = _parser("bertflow deploy", "Register the bertflow deployments against PREFECT_API_URL (process work pool).")
    p.add_argument("--pool", default=DEFAULT_POOL, help=f"process work pool (created if missing; default {DEFAULT_POOL})")
    p.add_argument("--working-dir", default=os.getcwd(),
                   help="directory the worker runs flows in; relative output_root resolves here (default: cwd)")
    args = p.parse_args(argv)
    url = _require_api()
    from prefect import deploy

    ensure_process_pool(args.pool)
    deployments = _runner_deployments(args, args.pool, os.path.abspath(args.working_dir))
    ids = deploy(*deployments, work_pool_name=args.pool, build=False, push=False, print_next_steps_message=False,
                 ignore_warnings=True)
    print(f"registered {len(ids)} deployments on {url} (pool {args.pool}); start a worker with:")
    print(f"  bertflow worker --pool {args.pool}    (= prefect worker start --pool {args.pool}; one SIGTERM stops it)")
    return 0


def main_worker(argv: Sequence[str] | None = None) -> int:
    """``prefect worker start --pool POOL``, started so that one SIGTERM stops it however it was launched.

    Prefect's worker turns a SIGTERM into a SIGINT to itself and relies on Python's Ctrl-C handling.
    A process started in the background of a script (``cmd &`` in a non-interactive shell) inherits
    SIGINT *ignored*, and an ignored signal stays ignored across exec: such a worker ignores the
    first SIGTERM and SIGKILLs itself on the second (docs/flows.md, "Stopping a worker"). This resets
    SIGINT to its default, then replaces itself with the worker (same pid, so signals reach it)."""
    import shutil
    import signal
    import sys
    from pathlib import Path

    p = ArgParser(prog="bertflow worker",
                  description="Start a Prefect process worker (prefect worker start --pool POOL) that a single "
                  "SIGTERM or Ctrl-C stops, even when started in the background of a script.")
    p.add_argument("--pool", default=DEFAULT_POOL, help=f"work pool to take runs from (default {DEFAULT_POOL})")
    p.add_argument("--limit", type=int, help="flow runs executed at the same time (default: no limit)")
    args = p.parse_args(argv)
    _require_api()
    beside = Path(sys.executable).parent / "prefect"  # the prefect of this installation
    prefect = str(beside) if beside.is_file() else shutil.which("prefect")
    if not prefect:
        raise UserError("prefect: command not found next to this Python or on PATH (pip install prefect)")
    cmd = [prefect, "worker", "start", "--pool", args.pool] + (["--limit", str(args.limit)] if args.limit else [])
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # an inherited SIG_IGN would survive the exec
    sys.stdout.flush()
    os.execv(prefect, cmd)
    return 0  # not reached


def main_serve(argv: Sequence[str] | None = None) -> int:
    p = _parser("bertflow serve", "Serve the bertflow deployments from this process (no work pool or worker needed).")
    p.add_argument("--limit", type=int, default=1, help="flow runs executed at the same time (default 1)")
    args = p.parse_args(argv)
    _require_api()
    from prefect import serve

    deployments = _runner_deployments(args, None, None)
    resume_served(deployments)
    serve(*deployments, limit=args.limit)
    return 0


def resume_served(deployments: Sequence[Any]) -> list[str]:
    """Prepare the deployments this process is about to serve against what the server holds.

    - Resume those paused: ``prefect.serve`` stopped gracefully (Ctrl-C, a SIGTERM turned into one)
      pauses every deployment it served (../shared/ENVIRONMENT.md), and a restarted serve would
      otherwise poll deployments that never schedule a run.
    - Keep each schedule's on/off switch as it is on the server: the nightly schedule ships inactive
      and a user switches it with ``prefect deployment schedule resume/pause`` (docs/flows.md);
      ``serve`` re-registers its deployments, which would otherwise reset the switch on every restart.

    Returns the names resumed; a deployment not registered yet is created by ``serve`` itself."""
    from prefect import get_client
    from prefect.exceptions import ObjectNotFound

    resumed = []
    with get_client(sync_client=True) as client:
        for dep in deployments:
            name = f"{dep.flow_name}/{dep.name}"
            try:
                current = client.read_deployment_by_name(name)
            except ObjectNotFound:
                continue
            switches = {_schedule_key(s.schedule): s.active for s in current.schedules}
            for sched in dep.schedules or []:
                if _schedule_key(sched.schedule) in switches:
                    sched.active = switches[_schedule_key(sched.schedule)]
            if current.paused and not dep.paused:
                client.resume_deployment(current.id)
                resumed.append(name)
    if resumed:
        print("resumed (paused by a previous serve's shutdown): " + ", ".join(resumed), flush=True)
    return resumed


def _schedule_key(schedule: Any) -> str:
    """A schedule's identity across registrations (its definition: cron, timezone, ...)."""
    return repr(sorted(schedule.model_dump(mode="json").items()))
