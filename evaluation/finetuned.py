"""Fine-tuned GLUE models kept on disk: a Hugging Face directory that ``transformers``'
``BertForSequenceClassification.from_pretrained`` loads as it is, plus a small bertflow record.

Layout of a kept model::

    config.json            HF config: architectures, num_labels, id2label/label2id, problem_type, finetuning_task
    model.safetensors      encoder (``bert.*``) and classifier weights, HF names
    vocab.txt              the tokenizer vocab the model was fine-tuned with
    tokenizer_config.json  BertTokenizer, do_lower_case
    bertflow_finetuned.json  the record: task, labels, lr, seed, max_seq_length, lowercase, base model
                           (path and content identity), dev scores. Written LAST: it is the finished marker.

The directory is built beside its final place and renamed into it, and the record is its last file, so a
save killed at any point leaves either no directory or a ``.tmp-*`` one without a record: never something
a prediction run would take for a finished model.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional, Sequence

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from bert_core.config import ModelConfig
from bert_core.heads import BertForSequenceClassification
from bert_core.hf import from_hf_config, save_hf, to_hf_config
from bert_core.hf import replace_dir as swap_dir
from contracts.common import UserError, read_json_object

RECORD = "bertflow_finetuned.json"
FORMAT = "bertflow-glue-finetuned/1"
_RECORD_KEYS = ("format", "task", "labels", "lr", "seed", "max_seq_length", "lowercase", "base_model", "dev")


def hf_classifier_config(config: ModelConfig, task: str, labels: Optional[Sequence[str]]) -> dict[str, Any]:
    """``config.json`` of a sequence classifier: HF reads num_labels / id2label / problem_type from it."""
    data = {**to_hf_config(config), "architectures": ["BertForSequenceClassification"], "finetuning_task": task}
    if labels is None:  # STS-B: one output trained with mean-squared error
        return {**data, "num_labels": 1, "problem_type": "regression"}
    return {**data, "num_labels": len(labels), "problem_type": "single_label_classification",
            "id2label": {str(i): name for i, name in enumerate(labels)},
            "label2id": {name: i for i, name in enumerate(labels)}}


def save_finetuned(model: torch.nn.Module, config: ModelConfig, vocab_file: str | os.PathLike,
                   out_dir: str | os.PathLike, record: dict[str, Any], lowercase: bool) -> Path:
    """Write ``model`` (a ``BertForSequenceClassification``) and ``record`` to ``out_dir``, atomically: an HF
    directory (``bert_core.hf.save_hf``) whose record is its last file."""
    return save_hf(model, config, vocab_file, out_dir, lowercase,
                   hf_config=hf_classifier_config(config, record["task"], record["labels"]),
                   model_max_length=record["max_seq_length"], last_files={RECORD: {"format": FORMAT, **record}},
                   replace=replace_dir)


def replace_dir(new: Path, final: Path) -> None:
    """Rename the finished directory ``new`` to ``final``. An existing ``final`` must be a kept model
    (a record, or nothing in it): a user's directory of that name is refused, never deleted."""
    final.parent.mkdir(parents=True, exist_ok=True)
    if final.exists() and not (final / RECORD).is_file() and any(final.iterdir()):
        raise UserError(f"{final}: exists and is not a fine-tuned model this evaluation kept; move it away")
    swap_dir(new, final)


def read_record(path: str | os.PathLike) -> dict[str, Any]:
    """The record of a kept model; one-line UserError for anything else (no record, a damaged one)."""
    path = Path(path)
    rec = path / RECORD
    if not rec.is_file():
        raise UserError(f"{path}: not a fine-tuned GLUE model (no {RECORD}; keep one with "
                        "`bertflow eval glue ... --save-models best`, then predict from <output-dir>/models/<task>)")
    data = read_json_object(rec, "record")
    missing = [k for k in _RECORD_KEYS if not isinstance(data, dict) or k not in data]
    if missing:
        raise UserError(f"{rec}: record lacks {', '.join(missing)}")
    if data["format"] != FORMAT:
        raise UserError(f"{rec}: format {data['format']!r} is not {FORMAT!r}")
    return data


def load_finetuned(path: str | os.PathLike) -> tuple[BertForSequenceClassification, ModelConfig, Path, dict]:
    """(classifier in fp32 on CPU, its ModelConfig, vocab.txt, record) of a kept model."""
    path = Path(path)
    record = read_record(path)
    cfg_path = path / "config.json"
    config = from_hf_config(read_json_object(cfg_path, "HF config"), str(cfg_path))
    try:
        state = load_file(str(path / "model.safetensors"))
    except (SafetensorError, OSError) as err:
        raise UserError(f"{path / 'model.safetensors'}: cannot read weights: {err}") from None
    num_labels = 1 if record["labels"] is None else len(record["labels"])
    # Built on the meta device: every tensor is about to be overwritten by the saved one.
    with torch.device("meta"):
        model = BertForSequenceClassification(config, num_labels=num_labels)
    own = model.state_dict()
    missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    bad = [k for k in own if k in state and state[k].shape != own[k].shape]
    if missing or unexpected or bad:
        raise UserError(f"{path}: weights do not fit a {num_labels}-label classifier of config.json: missing "
                        f"{missing[:3]}, unexpected {unexpected[:3]}, wrong shape {bad[:3]}")
    model.load_state_dict(state, assign=True)
    return model.float(), config, path / "vocab.txt", record

