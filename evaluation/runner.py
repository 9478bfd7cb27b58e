"""Spreads evaluation jobs over Ray: every (task, learning rate, seed) — or every checkpoint — is one
Ray task declaring ``cpus_per_task`` / ``gpus_per_task``, so a cluster runs them side by side.

This is the only evaluation module that imports Ray. A job is a plain top-level function of JSON-able
arguments returning a JSON-able dict; ``use_ray=False`` runs the same functions one after another in
this process (handy for debugging and for machines without Ray). Results come back in job order, so
the gathered results never depend on which task finished first.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Sequence

from tqdm.auto import tqdm

from contracts.common import UserError
from data_jobs.ray_util import ensure_ray
from evaluation.config import EvalBase

Job = Callable[..., dict]


def run_jobs(fn: Job, jobs: Sequence[tuple], cfg: EvalBase, desc: str) -> list[dict]:
    """Run ``fn(*args)`` for every args tuple in ``jobs``; returns their results in ``jobs`` order."""
    if not jobs:
        return []
    if not cfg.use_ray:
        return [fn(*args) for args in tqdm(jobs, desc=desc, disable=not cfg.show_progress)]
    import ray
    from ray.exceptions import RayTaskError

    ensure_ray(cfg.ray_address)
    remote = ray.remote(fn).options(
        num_cpus=cfg.cpus_per_task,
        num_gpus=cfg.gpus_per_task,
        max_retries=0,  # a failed fine-tune fails the same way again; report it instead
    )
    refs = [remote.remote(*args) for args in jobs]
    index = {ref: i for i, ref in enumerate(refs)}
    results: list[Any] = [None] * len(refs)
    pending = list(refs)
    with tqdm(total=len(refs), desc=desc, disable=not cfg.show_progress) as bar:
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            try:
                results[index[done[0]]] = ray.get(done[0])
            except RayTaskError as err:
                for ref in pending:
                    ray.cancel(ref, force=True)
                cause = getattr(err, "cause", None)
                if isinstance(cause, UserError):
                    raise UserError(str(cause)) from None
                raise
            bar.update(1)
    return results


def progress(cfg: EvalBase) -> bool:
    """Per-step bars only in process: Ray tasks' bars would interleave in the driver's log."""
    return cfg.show_progress and not cfg.use_ray


def worker_threads(n: int) -> None:
    """Pin torch to ``n`` threads inside a job: tasks sharing a node must not oversubscribe its cores."""
    import torch

    torch.set_num_threads(n)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
