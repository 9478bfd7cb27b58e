"""The one Prefect task that runs any stage (``flows.stages``): it asks the stage's own ``status()``
(the same answer the CLI gets), logs why the stage is skipped or (re)done, skips a done one, and
otherwise produces it with the stage's own job function.

Tasks are called directly from the flows (not ``.submit``): they run one after another in the flow's
own thread, so the data jobs run their local processes, or start or join Ray, from an ordinary
process, which is what works with Prefect's ephemeral API (a Ray task runner would give every Ray
worker its own throw-away server).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from contracts.common import UserError
from flows.stages import CompareStage, DataStage, EvalStage, ExportStage, TrainStage  # noqa: F401 (re-exported)
from flows import signals

signals.install()  # SIGTERM in a flow starts run_main's deadline; the temporary server outlives a group's signal

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


def _run_name(parameters: dict) -> str:
    """The task run's name in the UI: the stage's ("data-job-vocab", "pretrain-phase-phase1", ...)."""
    return parameters["stage"].run_name


@task(name="stage", task_run_name=_run_name, cache_policy=NO_CACHE, retry_condition_fn=_not_user_error)
def run_stage(stage: Any) -> Any:
    """Run ``stage`` unless its own status says its output is done for this config and these inputs:
    status -> one log line -> skip if done -> (test fault) -> produce. A retry asks the status again, so
    an attempt killed half-way is resumed or redone as the stage itself decides."""
    log = get_run_logger()
    state = stage.status()
    log.info(state.line(stage.name) + f": {stage.out}")
    if state.done:
        return stage.result()
    _maybe_inject_fault(stage.name, stage.out)
    result = stage.run(state, log.info)
    log.info(f"stage {stage.name} done: {stage.summary(result)}")
    return result
