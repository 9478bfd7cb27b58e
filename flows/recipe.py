"""A recipe: a whole pipeline run plus the comparison that says what it was worth (its config and the
steps after the pipeline: ``flows.recipe_config``).

The ``recipe`` flow runs ``pretraining-pipeline`` as a subflow, scores the random-init row on the same
held-out instances, scores both on the other sentence task's held-out instances (NSP model on SOP pairs
and the reverse: the topic-shortcut check), runs the comparison (GLUE grid per row, resumable cell by cell) and publishes the
report (markdown with the plot inlined) as a Prefect artifact; files land in
``<output_root>/compare/<run>-<hash>/comparison.{md,png,json}``.

    bertflow recipe --config recipes/cpu-tiny.yaml [--smoke] [--sentence-task nsp|sop|none] [--output-root DIR]
                    [--print-config]
"""
from __future__ import annotations

import argparse
import base64
import sys
from typing import Any, Sequence

from prefect import flow

from flows import artifacts as art
from flows.config import make_plan
from flows.pipeline import preflight, pretraining_pipeline
from flows.recipe_config import (KEY_COMPARISON, MINILM, OTHER_TASK, PRETRAINED, RANDOM,  
                                 ComparisonSpec, RecipeConfig, RecipeDirs, _minilm, _read, budget_hash, compare_dir,
                                 compare_rows, load_recipe, overlay, recipe_dirs, reference_glue_dir)
from flows.tasks import run_stage

__all__ = ["KEY_COMPARISON", "MINILM", "OTHER_TASK", "PRETRAINED", "RANDOM", "ComparisonSpec", "RecipeConfig",
           "RecipeDirs", "budget_hash", "compare_dir", "compare_rows", "load_recipe", "overlay", "recipe",
           "recipe_dirs", "reference_glue_dir", "main"]


@flow(name="recipe", log_prints=True)
def recipe(config: RecipeConfig) -> dict[str, Any]:
    """pretraining-pipeline, then the random-init row's held-out scores, then the comparison report."""
    pipe = config.pipeline()
    plan = make_plan(pipe)
    _minilm(config.comparison)  # before hours of pretraining: a missing MiniLM package is refused now
    result = pretraining_pipeline(pipe)
    comparison = compare_rows(config, plan, result, run_stage)
    out_dir = recipe_dirs(plan, config.comparison, pipe.phases[-1].instances.sentence_task).compare
    md = _read(comparison["markdown"]).decode("utf-8")
    png = "data:image/png;base64," + base64.b64encode(_read(comparison["plot"])).decode("ascii")
    art.publish_markdown(KEY_COMPARISON, md.replace("(comparison.png)", f"({png})"),
                         f"pretrained vs random init vs MiniLM; files: {out_dir}")
    print(f"comparison report: {comparison['markdown']}")
    return {"pipeline": result, "comparison": comparison}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="bertflow recipe",
        description="Run a recipe (pipeline + comparison against random init and MiniLM) as a Prefect flow.",
    )
    p.add_argument("--config", required=True, help="RecipeConfig YAML, e.g. recipes/cpu-tiny.yaml")
    p.add_argument("--smoke", action="store_true", help="apply the recipe's smoke overlay (~1 minute)")
    p.add_argument("--output-root", help="override output_root (every output lands under it)")
    p.add_argument("--sentence-task", choices=["nsp", "sop", "none"], help="override every phase's sentence task")
    p.add_argument("--print-config", action="store_true", help="print the resolved recipe as YAML and exit")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    cfg = load_recipe(args.config, args.output_root, args.smoke, args.sentence_task)
    if args.print_config:
        import yaml

        print(yaml.safe_dump(cfg.model_dump(mode="json", exclude={"smoke"}), sort_keys=False))
        return 0
    preflight(cfg.pipeline(), "all")
    _minilm(cfg.comparison)
    result = recipe(cfg)
    print(_read(result["comparison"]["markdown"]).decode("utf-8"))
    return 0


if __name__ == "__main__":
    from contracts.common import run_main

    sys.exit(run_main(main))
