"""Where an evaluation gets its encoder and tokenizer from: a Hugging Face BERT directory or a bertflow
checkpoint, checked against the task tokenizer's vocab; plus the downstream head built on top of it.

Loading happens inside each Ray task (a 90 MB MiniLM loads in well under a second), so nothing large is
shipped through the object store and a task needs only the path.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch

from bert_core.checkpoint import load_model_from_checkpoint
from bert_core.hf import load_hf
from bert_core.runtime import device_for
from contracts.common import UserError
from contracts.views import local_view
from data_jobs.tokenization import read_vocab, vocab_hash
from evaluation.config import EvalBase
from evaluation.inputs import model_format


def load_pretrained(cfg: EvalBase, checkpoint: Optional[str] = None):
    """(BertForPreTraining, ModelConfig, vocab_file) of the configured model (or one given checkpoint)."""
    if checkpoint is None and model_format(cfg) == "hf":
        return load_hf(local_view(cfg.model_path))  # a URI: this node's copy (contracts.views)
    return load_checkpoint(checkpoint or cfg.model_path)


def load_checkpoint(path: str):
    """bert_core's loader for a local checkpoint or run directory, or one on an object store (read from
    this node's verified copy: bert_core.remote_run.cached_checkpoint)."""
    from bert_core.remote_run import cached_checkpoint

    return load_model_from_checkpoint(cached_checkpoint(path))


def resolve_vocab(cfg: EvalBase, model_vocab: Optional[str]) -> str:
    """The vocab the task tokenizer uses; it must be byte-identical to the one the model was trained with,
    otherwise every token id would silently mean another word."""
    if cfg.vocab_file:
        local = local_view(cfg.vocab_file)  # a URI: this node's copy (contracts.views)
        if not local.is_file():
            raise UserError(f"{cfg.vocab_file}: vocab file not found")
        if model_vocab and vocab_hash(local) != vocab_hash(model_vocab):
            raise UserError(
                f"{cfg.vocab_file}: task tokenizer vocab differs from the model's vocab {model_vocab} "
                "(token ids would not match the embeddings)"
            )
        return str(local)
    if not model_vocab or not Path(model_vocab).is_file():
        raise UserError(f"{cfg.model_path}: model has no vocab.txt; give vocab_file")
    return str(model_vocab)


def check_vocab_size(vocab_file: str, model_config) -> None:
    n = len(read_vocab(vocab_file))
    if n > model_config.vocab_size:
        raise UserError(f"{vocab_file}: {n} tokens but the model embeds only {model_config.vocab_size}")


def build_head(cfg: EvalBase, head_cls, seed: int, pretrained=None, **kwargs):
    """A downstream head whose encoder holds the pretrained weights (or a fresh init with random_init).

    Returns (head, model_config, vocab_file). The seed fixes the head's init and, for random_init,
    the encoder's: the baseline is as reproducible as the real run.
    """
    pre, model_config, vocab = pretrained if pretrained is not None else load_pretrained(cfg)
    vocab = resolve_vocab(cfg, vocab)
    check_vocab_size(vocab, model_config)
    torch.manual_seed(seed)
    if cfg.random_init:
        head = head_cls(model_config, **kwargs)
    else:
        head = head_cls.from_encoder(pre.bert, model_config, **kwargs)
    return head, model_config, vocab


def job_device(cfg: EvalBase) -> torch.device:
    """bert_core's device choice for one evaluation job: a GPU only where the job declared one."""
    return device_for(use_gpu=cfg.gpus_per_task > 0)
