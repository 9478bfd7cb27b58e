"""SQuAD v1.1 evaluation: one job per (lr, seed) fine-tunes span extraction and scores EM/F1 with the
official metric; ``run_squad`` runs the grid on Ray, writes predictions.json of the best run and the report.

With no train file (this repository only has the official dev file), dev is split by article: the first
``train_articles`` articles train, the remaining ones are scored, so no scored paragraph was seen.
"""
from __future__ import annotations

from pathlib import Path

from bert_core.heads import BertForQuestionAnswering
from bert_core.losses import span_loss
from bert_core.runtime import seed_all
from contracts.common import UserError
from contracts.views import local_view
from evaluation import squad
from evaluation.config import SquadConfig
from evaluation.finetune import fit, forward_inputs, predict
from evaluation.metrics import squad_evaluate
from evaluation.modeling import build_head, job_device, load_pretrained, resolve_vocab
from evaluation.report import summarize, write_results
from evaluation.runner import progress as _progress, run_jobs, worker_threads
from evaluation.text import bert_tokenizer

EVAL_NAME = "SQuAD v1.1"


def split_data(cfg: SquadConfig) -> tuple[list, list]:
    """(train examples, eval dataset restricted to the scored questions)."""
    dev = squad.read_squad(local_view(cfg.dev_file))  # a URI: this node's copy (contracts.views)
    if cfg.train_file:
        train_data, eval_data = squad.read_squad(local_view(cfg.train_file)), dev
    else:
        if len(dev) <= cfg.train_articles:
            raise UserError(f"{cfg.dev_file}: train_articles {cfg.train_articles} leaves no article to score "
                            f"(file has {len(dev)})")
        train_data, eval_data = dev[: cfg.train_articles], dev[cfg.train_articles :]
    train = squad.examples_of(train_data, cfg.max_train_questions)
    scored = squad.examples_of(eval_data, cfg.max_eval_questions)
    return train, squad.restrict(eval_data, {e.qid for e in scored})


def squad_job(cfg_data: dict, lr: float, seed: int) -> dict:
    """Fine-tune at (lr, seed); returns a run record with EM/F1 and the predictions."""
    cfg = SquadConfig.model_validate(cfg_data)
    worker_threads(cfg.threads_per_task)
    train_examples, eval_data = split_data(cfg)
    model, _, vocab = build_head(cfg, BertForQuestionAnswering, seed)
    tok = bert_tokenizer(vocab, cfg.lowercase)
    device = job_device(cfg)
    feats = (cfg.max_seq_length, cfg.doc_stride, cfg.max_query_length)
    train, _ = squad.make_features(tok, train_examples, *feats, training=True)

    def loss_fn(m, b):
        start_BS, end_BS = m(**forward_inputs(b))
        return span_loss(start_BS, end_BS, b["start_positions"], b["end_positions"])

    seed_all(seed)
    stats = fit(model, train, loss_fn, cfg, lr, seed, device, progress=_progress(cfg))
    eval_examples = squad.examples_of(eval_data)
    data, windows = squad.make_features(tok, eval_examples, *feats, training=False)
    outs = predict(model, data, lambda m, b: m(**forward_inputs(b)), cfg.eval_batch_size, device, cfg.precision)
    starts = [row for s_BS, _ in outs for row in s_BS]
    ends = [row for _, e_BS in outs for row in e_BS]
    preds = squad.decode_predictions(eval_examples, windows, starts, ends, cfg.max_answer_length)
    metrics = squad_evaluate(eval_data, preds)
    return {"task": EVAL_NAME, "eval": EVAL_NAME, "lr": lr, "seed": seed,
            "metrics": {"exact_match": metrics["exact_match"], "f1": metrics["f1"]},
            "n_train": len(train_examples), "n_train_features": len(train["input_ids"]),
            "n_eval": len(eval_examples), **stats, "predictions": preds}


def run_squad(cfg: SquadConfig) -> dict:
    """Fine-tune every (lr, seed) as a Ray task; writes predictions.json (best run), results.json, report.md."""
    train, eval_data = split_data(cfg)  # fail fast on bad files before any task starts
    if not train:
        raise UserError(f"{cfg.train_file or cfg.dev_file}: no training questions")
    resolve_vocab(cfg, load_pretrained(cfg)[2])
    cfg_data = cfg.model_dump(mode="json")
    grid = [(cfg_data, lr, seed) for lr in cfg.learning_rates for seed in cfg.seeds]
    runs = run_jobs(squad_job, grid, cfg, desc="SQuAD fine-tuning")
    summary = summarize(runs, {EVAL_NAME: "f1"}, {})
    best_lr = summary[EVAL_NAME]["best_lr"]
    best = max((r for r in runs if r["lr"] == best_lr), key=lambda r: r["metrics"]["f1"])
    pred_path = Path(cfg.output_dir) / "predictions.json"
    squad.write_predictions(pred_path, best["predictions"])
    results = {
        "evaluation": "squad",
        "model_path": cfg.model_path,
        "random_init": cfg.random_init,
        "config": cfg_data,
        "tasks": summary,
        "runs": [{k: v for k, v in r.items() if k != "predictions"} for r in runs],
        "predictions_file": str(pred_path),
        "best_run": {"lr": best["lr"], "seed": best["seed"]},
    }
    write_results(cfg.output_dir, results)
    return results
