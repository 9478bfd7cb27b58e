"""GLUE evaluation: one job fine-tunes one (task, learning rate, seed) and scores every dev file of the
task (and predicts its test files); ``run_glue`` fans the grid out over Ray and gathers the report.

Test-set predictions come from the single run with the best dev score at the chosen learning rate
(the BERT paper submits one model, not a seed ensemble).
"""
from __future__ import annotations

from pathlib import Path

import torch

from bert_core.heads import BertForSequenceClassification
from bert_core.losses import classification_loss
from bert_core.runtime import seed_all
from contracts.common import UserError
from evaluation import glue
from evaluation.cells import cell_job, split_grid
from evaluation.config import GlueConfig
from evaluation.finetune import fit, forward_inputs, predict
from evaluation.metrics import PRIMARY_METRIC, glue_metrics
from evaluation.modeling import build_head, job_device, load_pretrained, resolve_vocab
from evaluation.report import summarize, write_results
from evaluation.runner import progress as _progress, run_jobs, worker_threads
from evaluation.text import bert_tokenizer, encode_texts


def _task_files(cfg: GlueConfig, spec: glue.TaskSpec) -> tuple[Path, dict[str, Path], dict[str, Path]]:
    """(train, dev files, existing test files); missing train/dev files are a UserError."""
    d = Path(cfg.glue_dir) / spec.name
    train = d / "train.tsv"
    devs = {name: d / f for name, f in spec.dev_files.items()}
    if not train.is_file() and d.is_dir() and any(p.is_file() for p in devs.values()):
        # A held-out (dev+test only) task directory: fine-tuned models are not kept, so nothing to predict from.
        raise UserError(f"{train}: task file not found: GLUE {spec.name} fine-tunes on train.tsv; predicting a "
                        "dev+test-only task directory from an already fine-tuned model is not supported")
    for p in [train, *devs.values()]:
        if not p.is_file():
            raise UserError(f"{p}: task file not found (GLUE {spec.name} needs train.tsv and dev files)")
    tests = {name: d / f for name, f in spec.test_files.items() if (d / f).is_file()}
    return train, devs, tests


def _encode(tok, examples, max_len: int, with_labels: bool):
    b = [e.text_b for e in examples] if examples[0].text_b is not None else None
    data = encode_texts(tok, [e.text_a for e in examples], b, max_len)
    if with_labels:
        is_float = isinstance(examples[0].label, float)
        data["labels"] = torch.tensor([e.label for e in examples], dtype=torch.float if is_float else torch.long)
    return data


def _predict_labels(model, data, spec: glue.TaskSpec, batch_size: int, device) -> list:
    logits_NC = torch.cat(predict(model, data, lambda m, b: m(**forward_inputs(b)), batch_size, device))
    if spec.labels is None:
        return [float(x) for x in logits_NC.squeeze(-1)]
    return [int(x) for x in logits_NC.argmax(-1)]


def glue_job(cfg_data: dict, task: str, lr: float, seed: int) -> dict:
    """Fine-tune ``task`` at (lr, seed); returns one run record per dev file plus test predictions."""
    cfg = GlueConfig.model_validate(cfg_data)
    worker_threads(cfg.threads_per_task)
    spec = glue.get_task(task)
    train_path, dev_paths, test_paths = _task_files(cfg, spec)
    model, _, vocab = build_head(cfg, BertForSequenceClassification, seed, num_labels=spec.num_labels)
    tok = bert_tokenizer(vocab, cfg.lowercase)
    device = job_device(cfg)
    train = _encode(tok, glue.read_examples(spec, train_path, cfg.max_train_examples), cfg.max_seq_length, True)
    seed_all(seed)
    stats = fit(model, train, lambda m, b: classification_loss(m(**forward_inputs(b)), b["labels"]),
                cfg, lr, seed, device, progress=_progress(cfg))
    runs = []
    for name, path in dev_paths.items():
        examples = glue.read_examples(spec, path, cfg.max_eval_examples)
        preds = _predict_labels(model, _encode(tok, examples, cfg.max_seq_length, False), spec,
                                cfg.eval_batch_size, device)
        metrics = glue_metrics(name, preds, [e.label for e in examples])
        runs.append({"task": spec.name, "eval": name, "lr": lr, "seed": seed, "metrics": metrics,
                     "n_train": len(train["input_ids"]), "n_eval": len(examples), **stats})
    test_preds = {}
    if cfg.write_test_predictions:
        for name, path in test_paths.items():
            examples = glue.read_test_examples(spec, path, cfg.max_eval_examples)
            test_preds[name] = _predict_labels(model, _encode(tok, examples, cfg.max_seq_length, False), spec,
                                               cfg.eval_batch_size, device)
    return {"runs": runs, "test_predictions": test_preds}


def _check_inputs(cfg: GlueConfig) -> list[glue.TaskSpec]:
    """Fail fast, before any Ray task starts: task names, files, every row's columns, model and vocab."""
    specs = [glue.get_task(t) for t in cfg.tasks]
    for spec in specs:
        train, devs, tests = _task_files(cfg, spec)
        for p in [train, *devs.values()]:
            glue.read_examples(spec, p)
        # Test files too: a malformed test row must stop the run before the first fine-tune, not after.
        for p in tests.values() if cfg.write_test_predictions else []:
            glue.read_test_examples(spec, p)
    _, _, vocab = load_pretrained(cfg)
    resolve_vocab(cfg, vocab)
    return specs


def _write_test_predictions(cfg: GlueConfig, spec: glue.TaskSpec, summary: dict, jobs: list[dict]) -> dict:
    """Submission TSVs from the best-dev run at the chosen lr; returns {name: path}."""
    chooser = next(iter(spec.dev_files))
    metric = PRIMARY_METRIC[chooser]
    best_lr = summary[chooser]["best_lr"]
    candidates = [j for j in jobs if j["runs"][0]["task"] == spec.name and j["runs"][0]["lr"] == best_lr]
    best = max(candidates, key=lambda j: next(r for r in j["runs"] if r["eval"] == chooser)["metrics"][metric])
    written = {}
    _, _, tests = _task_files(cfg, spec)
    for name, preds in best["test_predictions"].items():
        examples = glue.read_test_examples(spec, tests[name], cfg.max_eval_examples)
        out = Path(cfg.output_dir) / "glue_test" / f"{name}.tsv"
        glue.write_submission(out, spec, examples, preds)
        written[name] = str(out)
    return written


def run_glue(cfg: GlueConfig) -> dict:
    """Fine-tune every (task, lr, seed) as a Ray task; write results.json + report.md; return the results."""
    specs = _check_inputs(cfg)
    grid = [(spec.name, lr, seed) for spec in specs for lr in cfg.learning_rates for seed in cfg.seeds]
    cfg_data = cfg.model_dump(mode="json")
    # Resumable: cells finished by an earlier (killed) run are read back; only the missing ones run.
    done, missing = split_grid(cfg.output_dir, cfg_data, grid)
    fresh = run_jobs(cell_job, [(glue_job, str(path), key, cfg_data, *grid[i]) for i, key, path in missing],
                     cfg, desc="GLUE fine-tuning")
    done.update({i: r for (i, _, _), r in zip(missing, fresh)})
    jobs = [done[i] for i in range(len(grid))]
    runs = [r for j in jobs for r in j["runs"]]
    select_on = {name: next(iter(s.dev_files)) for s in specs for name in s.dev_files}
    summary = summarize(runs, PRIMARY_METRIC, select_on)
    results = {
        "evaluation": "glue",
        "model_path": cfg.model_path,
        "random_init": cfg.random_init,
        "config": cfg_data,
        "tasks": summary,
        "runs": runs,
        "test_predictions": {},
    }
    if cfg.write_test_predictions:
        for spec in specs:
            results["test_predictions"].update(_write_test_predictions(cfg, spec, summary, jobs))
    write_results(cfg.output_dir, results)
    # Which cells ran in this call: returned, not written, so results.json does not depend on resumes.
    return {**results, "cells": {"ran": [key for _, key, _ in missing], "reused": len(grid) - len(missing)}}

