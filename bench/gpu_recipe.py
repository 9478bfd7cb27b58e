"""A recipe's stages without Prefect or Ray, for a GPU machine that has only the training stack.

``bertflow recipe --config recipes/gpu-small.yaml`` is the one command on a machine with the whole
install. A lent GPU machine here has torch, transformers and pyarrow but neither Prefect nor Ray, and
cannot hold the corpus beside the repository. So the measurement runs the same recipe in two halves,
with the same stage objects the flow runs (``flows.stages``), each skipped when its own status says done:

    python bench/gpu_recipe.py prepare --config recipes/gpu-small.yaml   # CPU machine: the data stages
    python bench/gpu_recipe.py device --config recipes/gpu-small.yaml \\
        --glue-dir DIR --timings out.json                                 # GPU machine: everything after

``prepare`` runs shard, vocab, every phase's instances, the held-out instances and the other sentence
task's held-out instances (what ``compare_rows`` scores), then prints the directories made. The GPU
machine needs the document shards and the vocab (the instances are made again there in seconds; carried,
they would not fit). ``device`` runs the instances stages, the pretraining phases, the export, the intrinsic evaluation and
``flows.recipe_config.compare_rows`` (random init's held-out scores, cross-task scores, the GLUE grid
per row, the comparison report), and writes the seconds each stage took to ``--timings``.

    python bench/gpu_recipe.py finish --config recipes/gpu-small.yaml --no-minilm   # CPU machine again

``finish`` is for a GPU lease that ended inside the GLUE grid: with what came back from the GPU machine
unpacked in place (every JSON/markdown file of the run, not the weights), it reads the finished stages'
results back, takes a row whose GLUE grid finished there from its ``results.json`` (its cells are keyed
by the weights' content, which did not come back), runs the missing cells of a random-init row here
(keyed by shape and vocab only, so the GPU's cells are reused), and writes the comparison report without
the zero-shot STS-B table (it needs the weights). The report must then say which cells ran where.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flows.config import make_plan  # noqa: E402
from flows.recipe_config import OTHER_TASK, compare_rows, load_recipe, recipe_dirs  # noqa: E402
from flows.stages import DataStage, EvalStage, ExportStage, TrainStage  # noqa: E402


class PlainRun:
    """Runs one stage as ``flows.tasks.run_stage`` does (status -> skip if done -> run), without Prefect,
    and keeps the seconds each stage took."""

    def __init__(self, timings_path: Optional[str] = None) -> None:
        self.timings: list[dict[str, Any]] = []
        self.timings_path = timings_path

    def __call__(self, stage: Any) -> Any:
        state = stage.status()
        print(state.line(stage.name) + f": {stage.out}", flush=True)
        if state.done:
            self.timings.append({"stage": stage.run_name, "out": str(stage.out), "skipped": True, "seconds": 0.0})
            return stage.result()
        t0 = time.perf_counter()
        result = stage.run(state, lambda line: print(line, flush=True))
        seconds = time.perf_counter() - t0
        self.timings.append({"stage": stage.run_name, "out": str(stage.out), "skipped": False, "seconds": seconds})
        print(f"stage {stage.name} done in {seconds:.1f} s: {stage.summary(result)}", flush=True)
        self.save()
        return result

    def save(self, **extra: Any) -> None:
        if self.timings_path:
            Path(self.timings_path).write_text(json.dumps({**extra, "stages": self.timings}, indent=2))


def _cross_instances(config, plan):
    """The other sentence task's held-out instances, as ``compare_rows`` asks for them."""
    other = OTHER_TASK.get(config.phases[-1].instances.sentence_task)
    dirs = recipe_dirs(plan, config.comparison, config.phases[-1].instances.sentence_task)
    if other is None or dirs.cross_instances is None:
        return None
    return plan.heldout.model_copy(update={"sentence_task": other, "output_dir": dirs.cross_instances})


def prepare(config, run: PlainRun) -> list[str]:
    plan = make_plan(config.pipeline())
    orch = config.orchestration
    out = [run(DataStage("shard", plan.shard, orch.ray_job_address, orch.job_python)) and str(plan.shard.output_dir)]
    out.append(run(DataStage("vocab", plan.vocab, orch.ray_job_address, orch.job_python)) and str(plan.vocab.output_dir))
    for icfg in [*plan.instances.values(), plan.heldout, _cross_instances(config, plan)]:
        if icfg is not None:
            run(DataStage("instances", icfg, orch.ray_job_address, orch.job_python))
            out.append(str(icfg.output_dir))
    return out


def device(config, run: PlainRun) -> dict[str, Any]:
    pipe = config.pipeline()
    plan = make_plan(pipe)
    orch = config.orchestration
    for icfg in [*plan.instances.values(), plan.heldout]:  # from the carried document shards and vocab
        if icfg is not None:
            run(DataStage("instances", icfg, orch.ray_job_address, orch.job_python))
    records = {name: run(TrainStage(name, tcfg)) for name, tcfg in plan.train.items()}
    run(ExportStage(records[list(records)[-1]]["run_dir"], str(plan.export_dir)))
    results = {kind: run(EvalStage(kind, ecfg)) for kind, ecfg in plan.evals.items()}
    return compare_rows(config, plan, {"eval": results}, run)


def finish(config, run: PlainRun) -> dict[str, Any]:
    import evaluation.compare as compare
    from evaluation.runner import RESULTS
    from flows.stages import CompareStage

    real = compare.run_staged

    def glue_row(kind: str, cfg) -> dict:
        done = Path(cfg.output_dir) / RESULTS
        if not cfg.random_init:  # its grid finished on the GPU machine: read back, nothing re-run
            results = json.loads(done.read_text())
            return {**results, "cells": {"ran": [], "reused": sum(len(t["seeds"]) for t in results["tasks"].values())}}
        return real(kind, cfg)

    def read_back(stage: Any) -> Any:
        if isinstance(stage, CompareStage):
            print(f"comparison: {stage.out}", flush=True)
            return compare.compare_models(stage.rows, stage.glue, stage.out, stage.intrinsic, stage.sentence_task,
                                          stage.cross)
        print(f"read back: {stage.out}", flush=True)
        return stage.result()

    plan = make_plan(config.pipeline())
    results = {kind: EvalStage(kind, ecfg).result() for kind, ecfg in plan.evals.items()}
    zero_shot = compare._zero_shot
    compare.run_staged = glue_row
    compare._zero_shot = lambda cfg: None  # needs the weights, which stayed on the GPU machine
    try:
        return compare_rows(config, plan, {"eval": results}, read_back)
    finally:
        compare.run_staged, compare._zero_shot = real, zero_shot


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["prepare", "device", "finish"])
    ap.add_argument("--config", required=True, help="RecipeConfig YAML, e.g. recipes/gpu-small.yaml")
    ap.add_argument("--smoke", action="store_true", help="the recipe's smoke overlay")
    ap.add_argument("--output-root", help="override output_root")
    ap.add_argument("--glue-dir", help="override comparison.glue.glue_dir (where the GLUE tasks are on this machine)")
    ap.add_argument("--no-minilm", action="store_true", help="leave the MiniLM row out (package not installed)")
    ap.add_argument("--timings", help="write the seconds of every stage here (JSON)")
    args = ap.parse_args(argv)
    cfg = load_recipe(args.config, args.output_root, args.smoke)
    update = {}
    if args.glue_dir:
        update["glue"] = cfg.comparison.glue.model_copy(update={"glue_dir": args.glue_dir})
    if args.no_minilm:
        update["minilm"] = False
    if update:
        cfg = cfg.model_copy(update={"comparison": cfg.comparison.model_copy(update=update)})
    run = PlainRun(args.timings)
    t0 = time.perf_counter()
    if args.mode == "prepare":
        for where in prepare(cfg, run):
            print(f"carry: {where}")
    else:
        comparison = (device if args.mode == "device" else finish)(cfg, run)
        print(Path(comparison["markdown"]).read_text(), flush=True)
    run.save(mode=args.mode, config=args.config, total_seconds=time.perf_counter() - t0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
