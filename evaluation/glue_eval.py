"""GLUE evaluation: one job fine-tunes one (task, learning rate, seed) and scores every dev file of the
task (and predicts its test files); ``run_glue`` fans the grid out over Ray and gathers the report.

Test-set predictions come from the single run with the best dev score at the chosen learning rate
(the BERT paper submits one model, not a seed ensemble). ``save_models`` keeps that run's model
(``best``: ``models/<Task>``) or every run's (``all``: ``models/<Task>-lr<lr>-seed<seed>``) as a Hugging
Face directory: each job saves its model beside its cell (``cells/<key>.model``) before the cell counts
as finished, and once the grid is complete the driver moves the kept ones into ``models/`` and deletes
the others. ``predict_only`` runs ``evaluation.glue_predict`` instead: predictions from a kept model.
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Optional

from bert_core.heads import BertForSequenceClassification
from bert_core.identity import identity
from bert_core.losses import classification_loss
from bert_core.runtime import seed_all
from contracts.common import UserError, write_json_atomic
from evaluation import glue
from evaluation.cells import cell_inputs, cell_job, cell_key, model_dir, read_cell, split_grid
from evaluation.config import GlueConfig
from evaluation.finetune import fit, forward_inputs
from evaluation.finetuned import RECORD, read_record, replace_dir, save_finetuned
from evaluation.glue_predict import encode as _encode, job_data, predict_glue, predict_labels as _predict_labels
from evaluation.inputs import check_glue_tasks, task_files, train_and_held_out
from evaluation.metrics import PRIMARY_METRIC, glue_metrics
from evaluation.modeling import build_head, job_device, load_pretrained, resolve_vocab
from evaluation.report import at_choice, choice_score, summarize, write_results
from evaluation.runner import progress as _progress, run_jobs, worker_threads
from evaluation.text import bert_tokenizer


def glue_job(cfg_data: dict, task: str, lr: float, seed: int, save_to: Optional[str] = None) -> dict:
    """Fine-tune ``task`` at (lr, seed); returns one run record per dev file plus test predictions.
    ``select_on: train_split``: records at the end of every epoch, each with the held-out training split's
    score (``"selection"``), and the test predictions of every epoch (``"test_by_epoch"``).
    ``save_to``: also keep the fine-tuned model there (``evaluation.finetuned``)."""
    cfg = GlueConfig.model_validate(cfg_data)
    worker_threads(cfg.threads_per_task)
    spec = glue.get_task(task)
    train_path, dev_paths, test_paths = task_files(cfg, spec)
    model, model_config, vocab = build_head(cfg, BertForSequenceClassification, seed, num_labels=spec.num_labels)
    tok = bert_tokenizer(vocab, cfg.lowercase)
    device = job_device(cfg)
    train_examples, held = train_and_held_out(cfg, spec, train_path)
    train = _encode(tok, train_examples, cfg.max_seq_length, True)
    devs = {name: glue.read_examples(spec, path, cfg.max_eval_examples) for name, path in dev_paths.items()}
    tests = {name: glue.read_test_examples(spec, path, cfg.max_eval_examples) for name, path in test_paths.items()
             if cfg.write_test_predictions}
    dev_data = {name: _encode(tok, ex, cfg.max_seq_length, False) for name, ex in devs.items()}
    test_data = {name: _encode(tok, ex, cfg.max_seq_length, False) for name, ex in tests.items()}  # same names
    held_data = _encode(tok, held, cfg.max_seq_length, False) if held else None
    chooser = next(iter(spec.dev_files))

    def predict(data):
        return _predict_labels(model, data, spec, cfg.eval_batch_size, device, cfg.precision)

    def score(epoch: Optional[float]) -> tuple[list[dict], dict]:
        runs = []
        selection = None
        if held_data is not None:
            selection = {"metrics": glue_metrics(chooser, predict(held_data), [e.label for e in held]), "n": len(held)}
        for name, examples in devs.items():
            run = {"task": spec.name, "eval": name, "lr": lr, "seed": seed,
                   "metrics": glue_metrics(name, predict(dev_data[name]), [e.label for e in examples]),
                   "n_train": len(train["input_ids"]), "n_eval": len(examples)}
            runs.append(run if epoch is None else {**run, "epoch": epoch, "selection": selection})
        return runs, {name: predict(data) for name, data in test_data.items()}

    scored: dict[float, tuple[list[dict], dict]] = {}
    seed_all(seed)
    opts = cfg.model_copy(update={"epochs": cfg.epochs_of(spec.name)})
    stats = fit(model, train, lambda m, b: classification_loss(m(**forward_inputs(b)), b["labels"]),
                opts, lr, seed, device, progress=_progress(cfg),
                at_epoch=(lambda e: scored.__setitem__(e, score(e))) if held else None)
    if not held:
        scored[None] = score(None)
    runs = [{**run, **stats} for runs_at, _ in scored.values() for run in runs_at]
    test_preds = list(scored.values())[-1][1]
    if save_to:
        record = {**_record(cfg, spec, lr, seed, runs), "cell": Path(save_to).stem}  # cells/<key>.model
        save_finetuned(model, model_config, vocab, save_to, record, cfg.lowercase)
    out = {"runs": runs, "test_predictions": test_preds}
    if held and tests:
        out["test_by_epoch"] = {f"{e:g}": preds for e, (_, preds) in scored.items()}
    return out


def _record(cfg: GlueConfig, spec: glue.TaskSpec, lr: float, seed: int, runs: list[dict]) -> dict:
    """What a kept model was made from and how it scored (``evaluation.finetuned.RECORD``)."""
    return {
        "task": spec.name, "labels": None if spec.labels is None else list(spec.labels), "lr": lr, "seed": seed,
        "max_seq_length": cfg.max_seq_length, "lowercase": cfg.lowercase,
        "base_model": {"path": cfg.model_path, "identity": identity(cfg.model_path), "random_init": cfg.random_init},
        "dev": {r["eval"]: {"metrics": r["metrics"], "n_eval": r["n_eval"]} for r in runs},
        "train": {"n_train": runs[0]["n_train"], "steps": runs[0]["steps"], "final_loss": runs[0]["final_loss"]},
    }


def _check_inputs(cfg: GlueConfig, specs: Optional[list[glue.TaskSpec]] = None,
                  ) -> tuple[list[glue.TaskSpec], dict[str, dict]]:
    """Fail fast, before any Ray task starts: task names, files, every row's columns (unless ``specs``
    says ``evaluation.inputs.check_glue_tasks`` already passed), model and vocab. Returns the task specs
    and each task's cell inputs (``evaluation.cells.cell_inputs``)."""
    specs = specs if specs is not None else check_glue_tasks(cfg)
    _, model_config, vocab = load_pretrained(cfg)
    vocab = resolve_vocab(cfg, vocab)
    return specs, {s.name: cell_inputs(cfg, model_config, vocab, s.name) for s in specs}


def _best_run(spec: glue.TaskSpec, summary: dict, jobs: list[dict]) -> int:
    """Index (in grid order) of the run with the best score at the chosen lr (and epoch) by what chose them
    (dev, or the held-out training split: ``report.choice_score``); ties: the first."""
    chooser = next(iter(spec.dev_files))
    metric, t = PRIMARY_METRIC[chooser], summary[chooser]
    chosen = {i: r for i, j in enumerate(jobs) for r in j["runs"]
              if r["task"] == spec.name and r["eval"] == chooser and at_choice(r, t)}
    return max(chosen, key=lambda i: choice_score(chosen[i], metric))


def _test_predictions_of(job: dict, task: dict) -> dict:
    """A job's test predictions at the task's chosen epoch (the last epoch's where none is chosen)."""
    epoch = task.get("best_epoch")
    return job["test_by_epoch"][f"{epoch:g}"] if epoch is not None and "test_by_epoch" in job else job["test_predictions"]


def _write_test_predictions(cfg: GlueConfig, spec: glue.TaskSpec, best: dict) -> dict:
    """Submission TSVs from ``best`` (test file name -> predictions of the chosen run); returns {name: path}."""
    written = {}
    _, _, tests = task_files(cfg, spec)
    for name, preds in best.items():
        examples = glue.read_test_examples(spec, tests[name], cfg.max_eval_examples)
        out = Path(cfg.output_dir) / "glue_test" / f"{name}.tsv"
        glue.write_submission(out, spec, examples, preds)
        written[name] = str(out)
    return written


def _keep_models(cfg: GlueConfig, grid: list[tuple], keys: list[str], best: dict[str, int]) -> dict:
    """Move the kept models from beside their cells into ``models/``, delete the others; returns
    {task: {"best": path, "lr", "seed", "all": [paths]}}. Safe to repeat after a kill: a model already
    moved is recognised by its record's cell key."""
    out: dict[str, dict] = {}
    models = Path(cfg.output_dir) / "models"
    for task, b in best.items():
        cells = [i for i, g in enumerate(grid) if g[0] == task]
        keep = cells if cfg.save_models == "all" else [b]
        paths = {}
        for i in keep:
            _, lr, seed = grid[i]
            final = models / (task if cfg.save_models == "best" else f"{task}-lr{lr:g}-seed{seed}")
            staged = model_dir(cfg.output_dir, keys[i])
            if (staged / RECORD).is_file():
                replace_dir(staged, final)
            elif not ((final / RECORD).is_file() and read_record(final).get("cell") == keys[i]):
                raise UserError(f"{staged}: the fine-tuned model of {task} lr {lr:g} seed {seed} is gone (deleted?); "
                                f"delete {staged.with_suffix('.json')} to fine-tune that run again")
            paths[i] = str(final)
        for i in set(cells) - set(keep):
            shutil.rmtree(model_dir(cfg.output_dir, keys[i]), ignore_errors=True)
        out[task] = {"best": paths[b], "lr": grid[b][1], "seed": grid[b][2], "all": [paths[i] for i in keep]}
    return out


def run_glue(cfg: GlueConfig, specs: Optional[list[glue.TaskSpec]] = None) -> dict:
    """Fine-tune every (task, lr, seed) as a Ray task; write results.json + report.md; return the results.
    With ``predict_only``: predictions and dev scores of a kept fine-tuned model instead. ``specs``: the
    tasks as ``evaluation.inputs.check_glue_tasks`` returned them (their files are not read again)."""
    if cfg.predict_only:
        return predict_glue(cfg)
    specs, inputs = _check_inputs(cfg, specs)
    grid = [(spec.name, lr, seed) for spec in specs for lr in cfg.learning_rates for seed in cfg.seeds_of(spec.name)]
    cfg_data = cfg.model_dump(mode="json")
    keys = [cell_key(cfg_data, *g, inputs[g[0]]) for g in grid]  # by content: see evaluation.cells
    save = cfg.save_models != "none"
    out = Path(cfg.output_dir).resolve()  # jobs get absolute paths (glue_predict.job_data)
    # Resumable: cells finished by an earlier (killed) run are read back; only the missing ones run.
    done, missing = split_grid(out, keys)
    fresh = run_jobs(cell_job, [(glue_job, str(path), key, job_data(cfg), *grid[i],
                                 str(model_dir(out, key)) if save else None) for i, key, path in missing],
                     cfg, desc="GLUE fine-tuning")
    for (_, key, path), r in zip(missing, fresh):  # a job on another node wrote its cell there: here too
        if read_cell(path) is None:
            write_json_atomic(path, {"key": key, "result": r})
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
    best = {spec.name: _best_run(spec, summary, jobs) for spec in specs}
    if cfg.write_test_predictions:
        for spec in specs:
            chooser = summary[next(iter(spec.dev_files))]
            preds = _test_predictions_of(jobs[best[spec.name]], chooser)
            results["test_predictions"].update(_write_test_predictions(cfg, spec, preds))
    if save:  # after the grid is complete: only then is the choice of the best run final
        results["saved_models"] = _keep_models(cfg, grid, keys, best)
    write_results(cfg.output_dir, results)
    # Which cells ran in this call: returned, not written, so results.json does not depend on resumes.
    return {**results, "cells": {"ran": [key for _, key, _ in missing], "reused": len(grid) - len(missing)}}

