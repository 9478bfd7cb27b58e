"""Every stage as the one generic Prefect task (``flows.tasks.run_stage``) sees it: a name, an output
location, its own ``status()``, how to produce its output, and how to read back a finished one.

Each stage here only wires its job's own functions (data_jobs, bert_core, evaluation): the status
answer is the same one the CLI gets, and every stage writes through its job's contracts.stage
location (one writer, foreign files refused, the record last). Frozen dataclasses of configs, so a
Prefect task takes them as a parameter like any other value.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from contracts.common import Status, stable_hash

Log = Callable[[str], None]


@dataclass(frozen=True)
class DataStage:
    """shard | vocab | instances: run locally (Ray or local processes), or as a Ray Job at an address."""

    job: str
    config: Any
    ray_job_address: Optional[str] = None
    job_python: str = "python"

    name = property(lambda self: self.job)
    run_name = property(lambda self: f"data-job-{self.job}")
    out = property(lambda self: str(self.config.output_dir))

    def _module(self):
        return importlib.import_module(f"data_jobs.{self.job}_job")

    def status(self) -> Status:
        return self._module().status(self.config)

    def result(self) -> Any:
        from contracts.schema import Manifest

        return Manifest.read(self.out)

    def run(self, state: Status, log: Log) -> Any:
        if not self.ray_job_address:
            return self._module().run(self.config)
        from flows.ray_jobs import job_config_path, submit_or_attach

        cfg_file = job_config_path(self.out)
        outcome = submit_or_attach(self.ray_job_address, self.job, self.config, cfg_file, python=self.job_python, log=log)
        log(f"ray job {outcome.submission_id} {outcome.status} ({outcome.log_lines} log lines)")
        return self.result()

    def summary(self, manifest) -> str:
        return f"{len(manifest.files)} files, totals {manifest.totals}"


@dataclass(frozen=True)
class TrainStage:
    """One pretraining phase: skipped when done, resumed when an earlier attempt was killed, started
    afresh (the stale run removed, never a user's file) when made from another config or other inputs."""

    phase: str
    config: Any

    name = property(lambda self: f"train:{self.phase}")
    run_name = property(lambda self: f"pretrain-phase-{self.phase}")
    out = property(lambda self: str(self.config.output_dir))

    def status(self) -> Status:
        from bert_core import stage  # = bert_core.train's status, without importing torch

        return stage.status(self.config)

    def result(self) -> dict:
        from bert_core.stage import TrainResult

        return self._record(TrainResult.from_run_dir(self.out), False)

    def run(self, state: Status, log: Log) -> dict:
        from bert_core import stage

        if state.state == "absent":
            stage.discard(self.config)  # a stale run (other config or inputs) is not continued
        from bert_core.launch import launch

        resume = state.state == "partial"
        return self._record(launch(self.config, resume, log=log), resume)

    def _record(self, result, resumed: bool) -> dict:
        return {"phase": self.phase, "run_dir": str(result.run_dir), "last_checkpoint": str(result.last_checkpoint),
                "metrics_file": str(result.metrics_file), "final_metrics": dict(result.final_metrics or {}),
                "resumed": resumed}

    def summary(self, record: dict) -> str:
        return str(record["final_metrics"])


@dataclass(frozen=True)
class ExportStage:
    """The run's last checkpoint as a Hugging Face BERT directory."""

    run_dir: str
    out_dir: str
    name = "export"
    run_name = "export"

    @property
    def out(self) -> str:
        return str(self.out_dir)

    def status(self) -> Status:
        from bert_core.stage import export_status  # = bert_core.export.status, without importing torch

        return export_status(self.run_dir, self.out_dir)

    def result(self) -> str:
        return self.out

    def run(self, state: Status, log: Log) -> str:
        from bert_core.export import export_checkpoint

        return str(export_checkpoint(self.run_dir, self.out_dir))  # locked; never deletes a user's file

    def summary(self, path: str) -> str:
        return path


@dataclass(frozen=True)
class EvalStage:
    """One evaluation (intrinsic | glue | squad | ner)."""

    kind: str
    config: Any

    name = property(lambda self: f"eval:{self.kind}")
    run_name = property(lambda self: f"evaluate-{self.kind}")
    out = property(lambda self: str(self.config.output_dir))

    def status(self) -> Status:
        from evaluation import runner

        return runner.status(self.kind, self.config)

    def result(self) -> dict:
        from evaluation import runner

        return runner.read_results(self.config)

    def run(self, state: Status, log: Log) -> dict:
        from evaluation import runner

        return runner.evaluate(self.kind, self.config, state)

    def summary(self, results: dict) -> str:
        return f"-> {self.out}"


@dataclass(frozen=True)
class CompareStage:
    """The recipe's comparison: every row's GLUE grid (resumable cell by cell) and the report."""

    rows: list
    glue: dict
    output_dir: str
    intrinsic: dict = field(default_factory=dict)
    sentence_task: str = "nsp"
    cross: dict = field(default_factory=dict)
    curve: dict = field(default_factory=dict)  # a LearningCurveSpec's dump, or {} for none
    name = "compare"
    run_name = "compare-models"

    @property
    def out(self) -> str:
        return str(self.output_dir)

    def _config_hash(self) -> str:
        rows = [{k: v for k, v in r.items() if k != "model_path"} for r in self.rows]
        curve = {"curve": self.curve} if self.curve else {}  # a comparison without one keeps its hash
        return stable_hash({"rows": rows, "glue": self.glue, "sentence_task": self.sentence_task, **curve})

    def _inputs(self) -> dict:
        from bert_core.identity import identity

        return {**{f"model: {r['name']}": identity(r["model_path"]) for r in self.rows},
                "held-out scores": stable_hash([self.intrinsic, self.cross])}

    def status(self) -> Status:
        from evaluation.compare import compare_stage

        return compare_stage(self.out, self.rows, self.curve).status(self._config_hash(), self._inputs)

    def result(self) -> dict:
        from evaluation.compare import read_comparison

        return read_comparison(self.out)

    def run(self, state: Status, log: Log) -> dict:
        from evaluation.compare import run_comparison

        return run_comparison(self.rows, self.glue, self.out, self.intrinsic, self.sentence_task, self.cross,
                              self._config_hash(), self._inputs(), self.curve)

    def summary(self, comparison: dict) -> str:
        return comparison["markdown"]
