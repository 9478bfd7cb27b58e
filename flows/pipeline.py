"""The Prefect flows: ``pretraining_pipeline`` and each stage as a flow of its own.

    prepare_data   shard -> vocab -> instances for each phase (+ held-out instances for intrinsic eval)
    pretrain       phase 1 -> phase 2 ... (each from the previous phase's weights) -> export
    evaluate       the configured evaluations of the exported model (or of any model_path given)

Every flow takes the typed ``PipelineConfig`` (the Prefect UI renders it as a form; the CLI loads it
from YAML) and derives every path from it, so each stage can run alone and finds its inputs where the
previous stage put them. Flows only sequence tasks and publish artifacts; tasks do the work.
"""
from __future__ import annotations

import argparse
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

from prefect import flow, get_run_logger

from contracts.common import ArgParser, UserError, write_json_atomic
from contracts.storage import is_uri, location
from data_jobs.job_output import publish, staged
from flows import artifacts as art
from flows.config import PipelineConfig, Plan, demo_config, join, make_plan
from flows.tasks import DataStage, EvalStage, ExportStage, TrainStage, run_stage


def _retrying(orch, retries: Optional[int] = None):
    """The stage task with the config's retry count and backoff (Prefect repeats the last delay)."""
    return run_stage.with_options(
        retries=orch.retries if retries is None else retries,
        retry_delay_seconds=list(orch.retry_delay_s) or 0,
    )


@flow(name="prepare-data", log_prints=True)
def prepare_data(config: PipelineConfig) -> dict[str, str]:
    """Document shards, vocab and instances for every phase; publishes a data statistics table."""
    plan = make_plan(config)
    orch = config.orchestration
    run = _retrying(orch)

    def job(name: str, cfg):
        return cfg.output_dir, run(DataStage(name, cfg, orch.ray_job_address, orch.job_python))

    manifests = {"documents": job("shard", plan.shard), "vocab": job("vocab", plan.vocab)}
    for name, icfg in plan.instances.items():
        manifests[f"instances:{name}"] = job("instances", icfg)
    if plan.heldout is not None:
        manifests["instances:heldout"] = job("instances", plan.heldout)
    art.publish_table(art.KEY_DATA, art.stats_rows(manifests), "bertflow data statistics (one row per dataset)")
    return {stage: str(directory) for stage, (directory, _) in manifests.items()}


@flow(name="pretrain", log_prints=True)
def pretrain(config: PipelineConfig) -> dict[str, Any]:
    """Every pretraining phase in order, then export; publishes metrics table and loss curve."""
    plan = make_plan(config)
    orch = config.orchestration
    records = {}
    for name, tcfg in plan.train.items():
        records[name] = _retrying(orch, orch.train_retries)(TrainStage(name, tcfg))
    last = records[list(records)[-1]]
    exported = _retrying(orch)(ExportStage(last["run_dir"], str(plan.export_dir)))
    rows = []
    for name, rec in records.items():
        rows += [{"phase": name, **r} for r in art.read_metrics(rec["metrics_file"])]
    curve = str(join(plan.report_dir, "loss_curve.png"))
    with staged(str(plan.report_dir)) as reports:  # an object-store report dir: written here, uploaded
        png = reports / "loss_curve.png"
        art.plot_loss_png(art.loss_series(rows), png, f"pretraining loss ({', '.join(records)})")
        art.publish_table(art.KEY_TRAIN, art.metrics_rows(rows), "bertflow training metrics (sampled)")
        art.publish_loss_curve(png, f"loss curve; file: {curve}")
        publish(str(plan.report_dir), [png])
    return {"phases": records, "export_dir": exported, "loss_curve": curve}


@flow(name="evaluate", log_prints=True)
def evaluate(config: PipelineConfig, model_path: Optional[str] = None) -> dict[str, Any]:
    """The configured evaluations of the exported model, or of ``model_path`` (any checkpoint/HF dir)."""
    plan = make_plan(config)
    results = {}
    for kind, ecfg in plan.evals.items():
        if model_path:  # another model: results go beside the pipeline's (the plan names where)
            ecfg = plan.eval_of(kind, model_path)
        results[kind] = _retrying(config.orchestration, 0)(EvalStage(kind, ecfg))
    if results:
        art.publish_table(art.KEY_EVAL, art.eval_rows(results), "bertflow evaluation results")
    else:
        get_run_logger().info("no evaluation configured (evaluation: {} in the config)")
    return results


@flow(name="pretraining-pipeline", log_prints=True)
def pretraining_pipeline(config: PipelineConfig) -> dict[str, Any]:
    """Data -> pretraining phases -> export -> evaluation, then a markdown summary of every output."""
    plan = make_plan(config)
    data = prepare_data(config)
    trained = pretrain(config)
    results = evaluate(config)
    publish_on_top(data, trained, results)
    summary = write_summary(plan, data, trained, results)
    return {"data": data, "train": trained, "eval": results, "summary": str(summary)}


def publish_on_top(data: dict, trained: dict, results: dict) -> None:
    """The sub-runs' tables and loss curve again on the top-level run, whose Artifacts tab is where a
    user looks first (issue 10); the same keys, so each key's latest version is this run's."""
    from contracts.schema import Manifest

    manifests = {stage: (directory, Manifest.read(directory)) for stage, directory in data.items()}
    art.publish_table(art.KEY_DATA, art.stats_rows(manifests), "bertflow data statistics (one row per dataset)")
    rows = [{"phase": name, **r} for name, rec in trained["phases"].items() for r in art.read_metrics(rec["metrics_file"])]
    art.publish_table(art.KEY_TRAIN, art.metrics_rows(rows), "bertflow training metrics (sampled)")
    with readable(trained["loss_curve"]) as png:
        if png is not None:
            art.publish_loss_curve(png, f"loss curve; file: {trained['loss_curve']}")
    if results:
        art.publish_table(art.KEY_EVAL, art.eval_rows(results), "bertflow evaluation results")


@contextmanager
def readable(where: str) -> Iterator[Optional[Path]]:
    """A local copy of the file ``where`` (the file itself where local; an object fetched to scratch and
    removed afterwards), or None where there is none."""
    if not is_uri(where):
        yield Path(where) if Path(where).is_file() else None
        return
    parent, _, name = where.rpartition("/")
    with staged(parent) as work:
        try:
            location(parent).download(name, work / name)
        except FileNotFoundError:
            yield None
            return
        yield work / name


def write_summary(plan: Plan, data: dict, trained: dict, results: dict) -> Path | str:
    """summary.json + summary.md in the report dir, and the same markdown as a Prefect artifact."""
    last = trained["phases"][list(trained["phases"])[-1]]
    paths = {**{f"data: {k}": v for k, v in data.items()}}
    paths.update({
        "checkpoint": last["last_checkpoint"],
        "metrics": last["metrics_file"],
        "exported model (Hugging Face)": trained["export_dir"],
        "loss curve": trained["loss_curve"],
    })
    paths.update({f"eval: {k}": str(plan.evals[k].output_dir) for k in results})
    notes = [f"final metrics: {last['final_metrics']}"]
    notes += [f"{k}: {v}" for k, v in sorted(_flat(results).items())][:30]
    md = art.summary_markdown("bertflow pretraining pipeline", paths, notes)
    with staged(str(plan.report_dir)) as reports:
        (reports / "summary.md").write_text(md, encoding="utf-8")
        write_json_atomic(reports / "summary.json", {"paths": paths, "final_metrics": last["final_metrics"],
                                                     "eval": results})
        publish(str(plan.report_dir), [reports / "summary.json", reports / "summary.md"])
    art.publish_markdown(art.KEY_SUMMARY, md, "bertflow run summary with output paths")
    return join(plan.report_dir, "summary.md")


def _flat(obj: Any, prefix: str = "") -> dict[str, Any]:
    out = {}
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k == "config":  # evaluations echo their settings: not results
                continue
            out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool):
        out[prefix] = round(obj, 4) if isinstance(obj, float) else obj
    return out


FLOWS = {"all": pretraining_pipeline, "data": prepare_data, "train": pretrain, "eval": evaluate}


def build_parser() -> argparse.ArgumentParser:
    p = ArgParser(
        prog="bertflow pipeline",
        description="Run the pretraining pipeline (or one stage) as a Prefect flow. Without PREFECT_API_URL "
        "Prefect starts a temporary local API; with it, runs show up in that server's UI.",
    )
    p.add_argument("--config", help="PipelineConfig YAML (see docs/flows.md); default: the demo preset")
    p.add_argument("--stage", choices=sorted(FLOWS), default="all", help="run one stage's flow (default: all)")
    p.add_argument("--output-root", help="override output_root (every output lands under it)")
    p.add_argument("--model-path", help="with --stage eval: evaluate this checkpoint/HF directory instead")
    p.add_argument("--print-config", action="store_true", help="print the resolved config as YAML and exit")
    return p


def load_pipeline_config(path: Optional[str], output_root: Optional[str] = None) -> PipelineConfig:
    if path:
        return PipelineConfig.from_yaml(path, {"output_root": output_root})
    return demo_config(output_root or "runs/demo")


def preflight(cfg: PipelineConfig, stage: str, model_path: Optional[str] = None) -> None:
    """A stage run on its own needs the previous stage's outputs: say so in one line before any flow
    starts, instead of a failed flow run with a traceback in its log."""
    from contracts.schema import MANIFEST_NAME

    plan = make_plan(cfg)
    root = Path(plan.root) if isinstance(plan.root, Path) else None
    if root is not None and root.exists() and not root.is_dir():
        raise UserError(f"output_root: {root} is a file, not a directory")
    if stage in ("all", "eval"):  # the task data, checked before hours of training, not after
        from evaluation.runner import check_locations

        for kind, ecfg in plan.evals.items():
            check_locations(ecfg)
            for name in sorted(type(ecfg).input_fields - {"model_path", "instances_dir"}):
                value = getattr(ecfg, name)
                if value and is_uri(value):
                    from contracts.views import check_exists

                    check_exists(value, f"evaluation.{kind}.{name}")
                elif value and not Path(value).exists():
                    raise UserError(f"evaluation.{kind}.{name}: {value} not found")
    if stage in ("all", "data"):
        from data_jobs.readers import expand_inputs

        if not location(plan.shard.output_dir).exists(MANIFEST_NAME):
            expand_inputs(plan.shard)  # raises a UserError naming a missing or unreadable input
        if plan.vocab.vocab_file and not Path(plan.vocab.vocab_file).is_file():
            raise UserError(f"vocab.vocab_file: {plan.vocab.vocab_file} not found")
    if stage == "train":
        for name, icfg in plan.instances.items():
            if not location(icfg.output_dir).exists(MANIFEST_NAME):
                raise UserError(f"--stage train: no instances for phase {name} at {icfg.output_dir}; "
                                "run --stage data first (same config)")
    if stage == "eval":
        if model_path and not is_uri(model_path) and not Path(model_path).exists():
            raise UserError(f"--model-path: {model_path} not found")
        if model_path and is_uri(model_path):
            from bert_core.remote_run import checkpoint_uri

            if checkpoint_uri(model_path) is None and not location(model_path.rstrip("/")).exists("config.json"):
                raise UserError(f"--model-path: {model_path} holds no complete bertflow checkpoint and no Hugging "
                                "Face directory (config.json)")
        if not model_path and not location(str(plan.export_dir)).exists("config.json"):
            raise UserError(f"--stage eval: no exported model at {plan.export_dir}; run --stage train "
                            "first (same config) or give --model-path")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    cfg = load_pipeline_config(args.config, args.output_root)
    if args.print_config:
        import yaml

        print(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
        return 0
    if args.model_path and args.stage != "eval":
        raise UserError("--model-path: only with --stage eval")
    preflight(cfg, args.stage, args.model_path)
    kwargs = {"model_path": args.model_path} if args.model_path else {}
    result = FLOWS[args.stage](cfg, **kwargs)
    print(f"bertflow pipeline ({args.stage}) finished; outputs under {make_plan(cfg).root}")
    if isinstance(result, dict) and result.get("summary"):
        with readable(result["summary"]) as summary:
            print(summary.read_text(encoding="utf-8") if summary else f"{result['summary']}: missing")
    return 0


if __name__ == "__main__":
    from contracts.common import run_main

    sys.exit(run_main(main))
