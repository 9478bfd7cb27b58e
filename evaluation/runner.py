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
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence

from bert_core.identity import identity
from contracts.common import Status, UserError, stable_hash, write_json_atomic
from contracts.stage import StageDir, store_for
from contracts.storage import is_uri, location
from contracts.views import view_of
from data_jobs.fanout import fan_out
from evaluation.cells import CELLS_DIR
from evaluation.config import EvalBase
from evaluation.report import write_results

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
    with _threads_kept(not cfg.use_ray):
        return fan_out(fn, jobs, desc=desc, max_in_flight=len(jobs) if cfg.use_ray else 1,
                       num_cpus=cfg.cpus_per_task, num_gpus=cfg.gpus_per_task,
                       engine="ray" if cfg.use_ray else "local", ray_address=cfg.ray_address, max_retries=0)


@contextmanager
def _threads_kept(in_process: bool) -> Iterator[None]:
    """Jobs run in this process (``use_ray=False``) pin torch's threads (``worker_threads``); give the
    process its count back afterwards, or whatever it runs next (a flow's next training phase) computes
    with other float sums than it would have alone."""
    if not in_process:
        yield
        return
    import torch

    before = torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads(before)


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
    """Content identity of every input of the evaluation (model, vocab, task data), not their paths. GLUE's
    task data is the selected tasks' directories only, as each cell's (``evaluation.cells``): another task's
    files changing changes nothing here, and a glue_dir with far more in it is not read whole."""
    found = {}
    for name in sorted(type(cfg).input_fields):
        value = getattr(cfg, name)
        if name == "glue_dir" and value is not None:
            from evaluation.glue import get_task

            tasks = sorted({get_task(t).name for t in cfg.tasks})  # (a URI: this node's copy of each task)
            found[name] = stable_hash({t: identity(view_of(value, t)) for t in tasks})
        elif name == "conll_dir" and value is not None:  # the two files NER reads (evaluation.ner_eval)
            files = sorted({"train.txt", f"{cfg.eval_split}.txt"})
            found[name] = stable_hash({f: identity(view_of(value, f)) for f in files})
        else:
            found[name] = identity(value)
    return found


def preflight(kind: str, cfg: EvalBase) -> None:
    """What is refused before any input is hashed (``input_identity`` reads every file of a model or task
    directory): the locations, file options that name a directory, the held-out dataset's manifest, GLUE's
    tasks (every row), and the model path (``evaluation.inputs.model_format``). Torch-free, so a user error
    costs neither a heavy import nor a walk through a wrong directory (a home, ``/``)."""
    check_locations(cfg)
    for name in sorted(type(cfg).input_fields):  # a file option given a directory: said, not walked
        value = getattr(cfg, name)
        if name.endswith("_file") and value is not None and not is_uri(value) and Path(value).is_dir():
            raise UserError(f"{name}: {value} is a directory, not a file")
    if kind == "intrinsic":  # the held-out instances: a finished dataset (its manifest is its identity)
        from contracts.schema import Manifest

        Manifest.read(cfg.instances_dir, kind="instances")
    if kind == "glue" and not cfg.predict_only:  # (predict_only: evaluation.glue_predict checks its model)
        from evaluation.inputs import check_glue_tasks

        check_glue_tasks(cfg)  # every row, before the model: a bad row is said before a bad model path
    if kind != "intrinsic" or not is_uri(cfg.model_path):  # (intrinsic checks a run on a store itself)
        from evaluation.inputs import model_format

        model_format(cfg)


# Every name an evaluation writes into its output directory (contracts.stage: ours once announced; in a
# fresh directory a file of one of these names is the user's, and is never overwritten).
EVAL_FILES = frozenset({RESULTS, "report.md", "curve.png", "predictions.json", "cells", "models", "glue_test"})


def stage_dir(kind: str, cfg: EvalBase) -> StageDir:
    return StageDir.at(cfg.output_dir, kind, record=STAGE_RECORD, owns=EVAL_FILES)


def check_locations(cfg: EvalBase) -> None:
    """Every input may be on an object store (task data, vocab and Hugging Face directories are read from
    each node's copy, contracts.views), and the output; models kept by ``save_models`` are local."""
    if is_uri(cfg.output_dir) and getattr(cfg, "save_models", "none") != "none":
        raise UserError(f"save_models: fine-tuned models are kept in a local output_dir, not {cfg.output_dir}")


def status(kind: str, cfg: EvalBase) -> Status:
    """done | partial | absent for evaluation ``kind`` with this config and these inputs (only GLUE
    continues a partial run, from its cells; the others redo anything short of done)."""
    preflight(kind, cfg)
    state = stage_dir(kind, cfg).status(cfg.config_hash(), lambda: input_identity(cfg))
    if state.done and not store_for(cfg.output_dir).exists(RESULTS):  # records before the file list
        return Status("absent", f"{RESULTS} missing", state.inputs)
    return state


def read_results(cfg: EvalBase) -> dict:
    if is_uri(cfg.output_dir):
        return json.loads(location(cfg.output_dir).read(RESULTS))
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
        with sd.writing(chash, inputs, EVAL_FILES):
            results = run_staged(kind, cfg, checked=True)  # (status, above, ran preflight)
        sd.commit(sd.present(EVAL_FILES), chash, inputs)
    return results


def run_staged(kind: str, cfg: EvalBase, checked: bool = False) -> dict:
    """``run_<kind>(cfg)`` where its output_dir is: in place when local; on an object store written on
    node-local scratch (holding the cells already there), its results naming the store, then uploaded.
    ``checked``: ``preflight`` passed (``evaluate`` after ``status``), so GLUE's files are not read again."""
    import evaluation  # the package runs run_<kind>; imported here: it imports this module

    with staged_output(cfg) as local:
        run = getattr(evaluation, f"run_{kind}")
        results = run(local, checked=True) if kind == "glue" and checked else run(local)
        out = Path(local.output_dir)
        if local is not cfg:  # written on scratch: the results name the object store, then go there
            results = rebased(results, local.output_dir, cfg.output_dir)
            write_results(out, results)
        elif not (out / RESULTS).is_file():
            write_json_atomic(out / RESULTS, results)
        publish_tree(out, cfg.output_dir)
    return results


@contextmanager
def staged_output(cfg: EvalBase) -> Iterator[EvalBase]:
    """The config an evaluation writes with: ``cfg`` itself for a local output_dir; for an object-store
    one, a copy writing into a fresh node-local scratch directory (removed afterwards) that holds the
    cells already on the store, so a GLUE grid continues from them."""
    if not is_uri(cfg.output_dir):
        yield cfg
        return
    from data_jobs.job_output import staged

    loc = location(cfg.output_dir)
    with staged(cfg.output_dir) as work:
        for m in loc.list(CELLS_DIR + "/"):
            loc.download(m.name, work / m.name)
        yield cfg.model_copy(update={"output_dir": str(work)})


def rebased(results: Any, local: str, uri: str) -> Any:
    """``results`` with every string naming a file under ``local`` renamed to the same file under ``uri``."""
    if isinstance(results, str):
        return uri.rstrip("/") + results[len(local):] if results == local or results.startswith(local + "/") else results
    if isinstance(results, dict):
        return {k: rebased(v, local, uri) for k, v in results.items()}
    if isinstance(results, list):
        return [rebased(v, local, uri) for v in results]
    return results


def publish_tree(local: Path, out: str) -> None:
    """Upload every file under ``local`` to the object-store prefix ``out`` (results.json last); nothing
    to do for a local ``out``, written in place."""
    if not is_uri(out):
        return
    loc = location(out)
    files = sorted((p for p in local.rglob("*") if p.is_file()), key=lambda p: (p.name == RESULTS, str(p)))
    for path in files:
        loc.upload(path.relative_to(local).as_posix(), path)
