"""Spreads evaluation jobs over Ray: every (task, learning rate, seed) — or every checkpoint — is one
Ray task declaring ``cpus_per_task`` / ``gpus_per_task``, so a cluster runs them side by side.

Ray is reached only through the one fan-out helper (``data_jobs.fanout``). A job is a plain top-level function of JSON-able
arguments returning a JSON-able dict; ``use_ray=False`` runs the same functions one after another in
this process (handy for debugging and for machines without Ray). Results come back in job order, so
the gathered results never depend on which task finished first.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable, Optional, Sequence

from bert_core.identity import identity
from contracts.common import Status, write_json_atomic
from contracts.stage import StageDir
from data_jobs.fanout import fan_out
from evaluation.config import EvalBase

RESULTS, STAGE_RECORD = "results.json", "stage.json"

Job = Callable[..., dict]


def run_jobs(fn: Job, jobs: Sequence[tuple], cfg: EvalBase, desc: str) -> list[dict]:
    """Run ``fn(*args)`` for every args tuple in ``jobs``; returns their results in ``jobs`` order.

    ``use_ray``: one Ray task per job (``cpus_per_task``/``gpus_per_task`` each, all submitted: Ray
    packs them onto the cluster); else one after another in this process. Either way through the one
    fan-out helper, so a job's UserError comes back as the same one line.
    """
    if not jobs:
        return []
    # A failed fine-tune fails the same way again: max_retries 0, report it instead.
    return fan_out(fn, jobs, desc=desc, max_in_flight=len(jobs) if cfg.use_ray else 1,
                   num_cpus=cfg.cpus_per_task, num_gpus=cfg.gpus_per_task,
                   engine="ray" if cfg.use_ray else "local", ray_address=cfg.ray_address, max_retries=0)


def progress(cfg: EvalBase) -> bool:
    """Per-step bars only in process: Ray tasks' bars would interleave in the driver's log."""
    return cfg.show_progress and not cfg.use_ray


def worker_threads(n: int) -> None:
    """Pin torch to ``n`` threads inside a job: tasks sharing a node must not oversubscribe its cores."""
    import torch

    torch.set_num_threads(n)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


# ---------------------------------------------------------------- stage status (CLI and flows)

def input_identity(cfg: EvalBase) -> dict[str, Optional[str]]:
    """Content identity of every input of the evaluation (model, vocab, task data), not their paths."""
    return {name: identity(getattr(cfg, name)) for name in sorted(type(cfg).input_fields)}


# Every name an evaluation writes into its output directory (contracts.stage: ours once announced; in a
# fresh directory a file of one of these names is the user's, and is never overwritten).
EVAL_FILES = frozenset({RESULTS, "report.md", "curve.png", "predictions.json", "cells", "models", "glue_test"})


def stage_dir(kind: str, cfg: EvalBase) -> StageDir:
    return StageDir.at(cfg.output_dir, kind, record=STAGE_RECORD, owns=EVAL_FILES)


def status(kind: str, cfg: EvalBase) -> Status:
    """done | partial | absent for evaluation ``kind`` with this config and these inputs (only GLUE
    continues a partial run, from its cells; the others redo anything short of done)."""
    state = stage_dir(kind, cfg).status(cfg.config_hash(), lambda: input_identity(cfg))
    if state.done and not (Path(cfg.output_dir) / RESULTS).is_file():  # records before the file list
        return Status("absent", f"{RESULTS} missing", state.inputs)
    return state


def read_results(cfg: EvalBase) -> dict:
    return json.loads((Path(cfg.output_dir) / RESULTS).read_text(encoding="utf-8"))


def evaluate(kind: str, cfg: EvalBase, state: Optional[Status] = None) -> dict:
    """Run evaluation ``kind`` unless its status is done; records what it was made from."""
    state = state or status(kind, cfg)
    if state.done:
        return read_results(cfg)
    sd = stage_dir(kind, cfg)
    with sd.lock():  # one writer per output directory (contracts.lock)
        # A user's report.md or results.json there is refused, never overwritten.
        sd.refuse_foreign("files no evaluation wrote", advice="move them or use another output_dir")
        chash, inputs = cfg.config_hash(), input_identity(cfg)
        import evaluation  # the package runs run_<kind>; imported here: it imports this module

        with sd.writing(chash, inputs, EVAL_FILES):
            results = getattr(evaluation, f"run_{kind}")(cfg)
        out = Path(cfg.output_dir)
        if not (out / RESULTS).is_file():
            write_json_atomic(out / RESULTS, results)
        sd.commit(sd.present(EVAL_FILES), chash, inputs)
    return results
