"""Intrinsic evaluation: masked-LM accuracy and perplexity and NSP/SOP accuracy on a held-out instance
dataset, for every saved checkpoint of a pretraining run (one Ray task per checkpoint) -> a curve.

Averages are per masked token for MLM (as the loss) and per sentence-task row for NSP, summed over the
whole held-out set before dividing, so batch boundaries do not change the result. Perplexity is
exp(mean MLM cross-entropy). Batches take every held-out row, or with ``max_batches`` an evenly spaced
sample of ``max_batches * batch_size`` rows across the whole set (rows are stored by length bin, so the
first rows would be the shortest only), sorted by length only to save padding.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
from matplotlib.figure import Figure

from bert_core.checkpoint import CheckpointManager, is_complete, read_state, step_of
from bert_core.engine import forward_loss
from bert_core.identity import CHECKPOINTS
from bert_core.loader import InstanceDataset
from bert_core.losses import NO_SENTENCE_TASK
from contracts.common import UserError, atomic_path
from contracts.storage import is_uri, location
from data_jobs.tokenization import vocab_hash
from evaluation.config import IntrinsicConfig
from evaluation.inputs import model_format
from evaluation.modeling import job_device, load_checkpoint, load_pretrained
from evaluation.report import write_results
from evaluation.runner import run_jobs, worker_threads


def checkpoints_of(cfg: IntrinsicConfig) -> list[tuple[int, str]]:
    """(step, path) of every complete checkpoint of a run dir, or of the one model given."""
    if is_uri(cfg.model_path):  # a run or checkpoint on an object store: each job fetches its own
        from bert_core.remote_run import remote_checkpoints

        found = remote_checkpoints(cfg.model_path)
        if not found and location(cfg.model_path.rstrip("/")).exists("config.json"):
            model_format(cfg)  # a Hugging Face directory on the store (no training step), or one line why not
            return [(0, cfg.model_path)]
        if not found:
            raise UserError(f"{cfg.model_path.rstrip('/')}: holds no complete checkpoint")
        return found if cfg.all_checkpoints else found[-1:]
    path = Path(cfg.model_path)
    if not path.exists():
        raise UserError(f"{path}: model path not found")
    if (path / CHECKPOINTS).is_dir():
        found = CheckpointManager(path).all()
        if not found:
            raise UserError(f"{path}: run directory holds no complete checkpoint")
        return [(step_of(p), str(p)) for p in (found if cfg.all_checkpoints else found[-1:])]
    if is_complete(path):
        step = read_state(path).get("step", 0)
        if type(step) is not int:
            raise UserError(f"{path / 'trainer_state.json'}: corrupt checkpoint state: step {step!r} is not an integer")
        return [(step, str(path))]
    return [(0, str(path))]  # a Hugging Face directory: no training step


def _check_data(dataset, model_config, vocab_file) -> None:
    dataset.check_model(model_config)
    if dataset.vocab_hash and vocab_file and Path(vocab_file).is_file() and vocab_hash(vocab_file) != dataset.vocab_hash:
        raise UserError(
            f"{dataset.dir}: instances were made with another vocab (hash {dataset.vocab_hash}) "
            f"than the model's {vocab_file} ({vocab_hash(vocab_file)})"
        )


def batches_of(dataset, batch_size: int, max_batches):
    """Row-index batches grouped by length: every row, or an evenly spaced sample of max_batches*batch_size
    rows over the whole set (the same rows every time; every length bin in proportion)."""
    total = len(dataset)
    n = total if max_batches is None else min(total, max_batches * batch_size)
    rows = np.floor(np.arange(n) * (total / n)).astype(np.int64)
    order = rows[np.argsort(dataset.lengths[rows], kind="stable")]
    return [order[lo : lo + batch_size] for lo in range(0, n, batch_size)]


def intrinsic_job(cfg_data: dict, step: int, checkpoint: str) -> dict:
    """Score one checkpoint on the held-out instances; returns one curve point."""
    cfg = IntrinsicConfig.model_validate(cfg_data)
    worker_threads(cfg.threads_per_task)
    if Path(checkpoint) == Path(cfg.model_path):
        model, model_config, vocab = load_pretrained(cfg)
    else:
        model, model_config, vocab = load_checkpoint(checkpoint)
    if cfg.random_init:
        torch.manual_seed(0)
        model = type(model)(model_config)
    dataset = InstanceDataset(cfg.instances_dir)
    _check_data(dataset, model_config, cfg.vocab_file or vocab)
    device = job_device(cfg)
    model.to(device).eval()
    sums = {"mlm_loss": 0.0, "mlm_hits": 0.0, "mlm_count": 0, "nsp_hits": 0.0, "nsp_count": 0}
    with torch.no_grad():
        for rows in batches_of(dataset, cfg.batch_size, cfg.max_batches):
            b = {k: v.to(device) for k, v in dataset.collate(rows, int(dataset.lengths[rows].max())).items()}
            loss = forward_loss(model, b)  # pretraining's forward and loss, exactly
            m = int(loss.mlm_count)
            n_nsp = int((b["nsp_labels"] != NO_SENTENCE_TASK).sum())
            sums["mlm_loss"] += float(loss.mlm_loss) * m
            sums["mlm_hits"] += float(loss.mlm_acc) * m
            sums["mlm_count"] += m
            sums["nsp_hits"] += float(loss.nsp_acc) * n_nsp
            sums["nsp_count"] += n_nsp
    if not sums["mlm_count"]:
        raise UserError(f"{cfg.instances_dir}: no masked tokens to score")
    mean_loss = sums["mlm_loss"] / sums["mlm_count"]
    return {
        "step": step,
        "checkpoint": checkpoint,
        "mlm_loss": mean_loss,
        "mlm_perplexity": math.exp(min(mean_loss, 700.0)),
        "mlm_acc": sums["mlm_hits"] / sums["mlm_count"],
        "nsp_acc": sums["nsp_hits"] / max(1, sums["nsp_count"]),
        "mlm_count": sums["mlm_count"],
        "nsp_count": sums["nsp_count"],
    }


def plot_curve(curve: list[dict], path: Path) -> None:
    """curve.png: MLM/NSP accuracy and MLM perplexity against the training step."""
    steps = [p["step"] for p in curve]
    fig = Figure(figsize=(9, 3.5))  # no pyplot: no global backend, nothing to close
    ax1, ax2 = fig.subplots(1, 2)
    ax1.plot(steps, [p["mlm_acc"] for p in curve], "o-", label="MLM accuracy")
    ax1.plot(steps, [p["nsp_acc"] for p in curve], "s-", label="NSP accuracy")
    ax1.set_xlabel("step")
    ax1.legend()
    ax2.plot(steps, [p["mlm_perplexity"] for p in curve], "o-")
    ax2.set_xlabel("step")
    ax2.set_ylabel("MLM perplexity")
    ax2.set_yscale("log")
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=100)


def run_intrinsic(cfg: IntrinsicConfig) -> dict:
    """Score every checkpoint as a Ray task; writes results.json, report.md and curve.png."""
    points = checkpoints_of(cfg)
    InstanceDataset(cfg.instances_dir)  # fail fast on a missing or damaged dataset
    cfg_data = cfg.model_dump(mode="json")
    curve = run_jobs(intrinsic_job, [(cfg_data, s, p) for s, p in points], cfg, desc="intrinsic")
    curve.sort(key=lambda p: p["step"])
    last = curve[-1]
    results = {
        "evaluation": "intrinsic",
        "model_path": cfg.model_path,
        "random_init": cfg.random_init,
        "config": cfg_data,
        "curve": curve,
        "tasks": {
            name: {"metric": metric, "best_lr": None, "mean": last[metric], "std": 0.0, "seeds": [],
                   "metrics": {}}
            for name, metric in (("MLM (last checkpoint)", "mlm_acc"), ("MLM perplexity (last checkpoint)",
                                 "mlm_perplexity"), ("NSP (last checkpoint)", "nsp_acc"))
        },
    }
    plot_curve(curve, Path(cfg.output_dir) / "curve.png")
    write_results(cfg.output_dir, results)
    return results
