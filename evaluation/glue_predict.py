"""GLUE predictions from a fine-tuned model kept by ``save_models`` (``predict_only``): no fine-tuning.

The kept model's record says what it was fine-tuned on; the run checks that the task asked for is that
task, predicts the task's test files (the GLUE submission TSVs of ``glue_test/``) and scores the dev files
that exist. A held-out task directory with dev and test files but no ``train.tsv`` (QNLI-style) is all it
needs. The tokenization is the record's (``max_seq_length``, ``lowercase``), not the config's: the same
text must become the same ids the model was fine-tuned and scored on, so its predictions equal the ones
the fine-tuning run wrote.

Also home of the encode/predict steps shared with fine-tuning (``evaluation.glue_eval``).
"""
from __future__ import annotations

from pathlib import Path

import torch

from contracts.common import UserError
from contracts.storage import is_uri
from contracts.views import view_of
from evaluation import glue
from evaluation.config import GlueConfig
from evaluation.finetune import forward_inputs, predict
from evaluation.finetuned import load_finetuned, read_record
from evaluation.metrics import PRIMARY_METRIC, glue_metrics
from evaluation.inputs import model_format
from evaluation.modeling import job_device, resolve_vocab
from evaluation.report import summarize, write_results
from evaluation.runner import run_jobs, worker_threads
from evaluation.text import bert_tokenizer, encode_texts


def encode(tok, examples, max_len: int, with_labels: bool) -> dict:
    """Token tensors of ``examples`` (plus ``labels``: long class ids, or float scores for STS-B)."""
    b = [e.text_b for e in examples] if examples[0].text_b is not None else None
    data = encode_texts(tok, [e.text_a for e in examples], b, max_len)
    if with_labels:
        is_float = isinstance(examples[0].label, float)
        data["labels"] = torch.tensor([e.label for e in examples], dtype=torch.float if is_float else torch.long)
    return data


def predict_labels(model, data, spec: glue.TaskSpec, batch_size: int, device, precision: str = "fp32") -> list:
    """Class ids (argmax), or the raw regression scores (STS-B), in example order."""
    logits_NC = torch.cat(predict(model, data, lambda m, b: m(**forward_inputs(b)), batch_size, device, precision))
    if spec.labels is None:
        return [float(x) for x in logits_NC.squeeze(-1)]
    return [int(x) for x in logits_NC.argmax(-1)]


def job_data(cfg: GlueConfig) -> dict:
    """The config as a job receives it: every path absolute, so that a Ray worker started in another
    directory (a cluster started elsewhere) reads and writes the same files as the driver."""
    data = cfg.model_dump(mode="json")
    for k in ("model_path", "glue_dir", "vocab_file", "output_dir"):
        if data.get(k) and not is_uri(data[k]):
            data[k] = str(Path(data[k]).resolve())
    return data


def _files(cfg: GlueConfig, spec: glue.TaskSpec) -> tuple[dict[str, Path], dict[str, Path]]:
    """(dev files that exist, test files): only the test files are required (unless not predicted)."""
    d = view_of(cfg.glue_dir, spec.name)  # a URI: this node's copy of the task (contracts.views)
    if not d.is_dir():
        raise UserError(f"{d}: task directory not found")
    devs = {name: d / f for name, f in spec.dev_files.items() if (d / f).is_file()}
    tests = {name: d / f for name, f in spec.test_files.items()} if cfg.write_test_predictions else {}
    for p in tests.values():
        if not p.is_file():
            raise UserError(f"{p}: task file not found (--predict-only predicts GLUE {spec.name}'s test files; "
                            "--no-test-predictions only scores dev)")
    if not devs and not tests:
        raise UserError(f"{d}: no dev file of GLUE {spec.name} and no test predictions asked for: nothing to do")
    return devs, tests


def check_predict_inputs(cfg: GlueConfig) -> tuple[glue.TaskSpec, dict]:
    """Fail fast, before any job starts: a kept model, the task it was fine-tuned on, every file's rows."""
    model_format(cfg)  # "model path not found" / "not a model" before "not a fine-tuned model"
    record = read_record(cfg.model_path)
    spec = glue.get_task(str(record["task"]))
    asked = [glue.get_task(t).name for t in cfg.tasks]
    if asked != [spec.name]:
        raise UserError(f"{cfg.model_path}: fine-tuned on GLUE {spec.name}, but tasks is {','.join(asked)} "
                        f"(predict with --tasks {spec.name})")
    if record["labels"] != (None if spec.labels is None else list(spec.labels)):
        raise UserError(f"{cfg.model_path}: labels {record['labels']} differ from GLUE {spec.name}'s")
    devs, tests = _files(cfg, spec)
    for p in devs.values():
        glue.read_examples(spec, p)
    for p in tests.values():
        glue.read_test_examples(spec, p)
    resolve_vocab(cfg, str(Path(cfg.model_path) / "vocab.txt"))
    return spec, record


def predict_job(cfg_data: dict) -> dict:
    """Score the dev files and predict the test files with the kept model (one job)."""
    cfg = GlueConfig.model_validate(cfg_data)
    worker_threads(cfg.threads_per_task)
    model, _, vocab, record = load_finetuned(cfg.model_path)
    spec = glue.get_task(str(record["task"]))
    devs, tests = _files(cfg, spec)
    tok = bert_tokenizer(resolve_vocab(cfg, str(vocab)), bool(record["lowercase"]))
    max_len, device = int(record["max_seq_length"]), job_device(cfg)
    runs = []
    for name, path in devs.items():
        examples = glue.read_examples(spec, path, cfg.max_eval_examples)
        preds = predict_labels(model, encode(tok, examples, max_len, False), spec, cfg.eval_batch_size, device,
                               cfg.precision)
        runs.append({"task": spec.name, "eval": name, "lr": record["lr"], "seed": record["seed"],
                     "metrics": glue_metrics(name, preds, [e.label for e in examples]), "n_eval": len(examples)})
    test_preds = {}
    for name, path in tests.items():
        examples = glue.read_test_examples(spec, path, cfg.max_eval_examples)
        test_preds[name] = predict_labels(model, encode(tok, examples, max_len, False), spec, cfg.eval_batch_size,
                                          device, cfg.precision)
    return {"runs": runs, "test_predictions": test_preds}


def predict_glue(cfg: GlueConfig) -> dict:
    """``run_glue`` with ``predict_only``: writes results.json, report.md and glue_test/<name>.tsv."""
    spec, record = check_predict_inputs(cfg)
    cfg_data = cfg.model_dump(mode="json")
    [job] = run_jobs(predict_job, [(job_data(cfg),)], cfg, desc="GLUE prediction")
    written = {}
    for name, preds in job["test_predictions"].items():
        path = view_of(cfg.glue_dir, spec.name) / spec.test_files[name]
        out = Path(cfg.output_dir) / "glue_test" / f"{name}.tsv"
        glue.write_submission(out, spec, glue.read_test_examples(spec, path, cfg.max_eval_examples), preds)
        written[name] = str(out)
    results = {
        "evaluation": "glue",
        "model_path": cfg.model_path,
        "random_init": False,
        "config": cfg_data,
        # One model, one lr: every dev file is reported on its own (no lr to choose).
        "tasks": summarize(job["runs"], PRIMARY_METRIC, {}),
        "runs": job["runs"],
        "test_predictions": written,
        "predicted_from": record,
    }
    write_results(cfg.output_dir, results)
    return results
