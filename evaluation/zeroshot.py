"""Zero-shot STS-B: what an encoder knows about sentence similarity before any fine-tuning.

Each STS-B dev sentence is encoded alone ([CLS] sentence [SEP]); its embedding is the mean of the last
layer's vectors over its tokens (padding left out); the score of a pair is the cosine of its two
embeddings; the result is Spearman's rank correlation of those scores with the gold similarity (x100 in
the report, as STS-B's fine-tuned metric). No parameter is trained, so a pretrained model gives one
number; a random init gives one per seed (the seed fixes its weights).
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np
import torch
from scipy import stats

from bert_core.hf import load_hf
from bert_core.model import BertForPreTraining
from bert_core.runtime import device_for
from contracts.common import UserError
from contracts.views import local_view
from evaluation import glue
from evaluation.finetune import trim_batch
from evaluation.text import bert_tokenizer, encode_texts


def _embed(model: BertForPreTraining, batch: dict, device: torch.device) -> torch.Tensor:
    mask_BS = batch["attention_mask"].to(device)
    seq_BSD, _ = model.bert(batch["input_ids"].to(device), batch["token_type_ids"].to(device), mask_BS)
    m_BS1 = mask_BS.unsqueeze(-1).to(seq_BSD.dtype)
    return (seq_BSD * m_BS1).sum(1) / m_BS1.sum(1).clamp(min=1.0)


@torch.no_grad()
def zero_shot_sts(model_path: str, glue_dir: str, *, random_init: bool = False, seed: int = 1,
                  lowercase: bool = True, max_seq_length: int = 128, max_examples: Optional[int] = None,
                  batch_size: int = 64, use_gpu: bool = False) -> float:
    """Spearman correlation (in [-1, 1]) of the cosine of mean-pooled embeddings with STS-B dev's gold
    scores. ``model_path``: a Hugging Face BERT directory (its vocab tokenizes); ``random_init``: the same
    shape with weights from ``seed``."""
    spec = glue.get_task("STS-B")
    dev = Path(local_view(glue_dir)) / "STS-B" / "dev.tsv"
    if not dev.is_file():
        raise UserError(f"{dev}: STS-B dev set not found (zero-shot STS-B needs it)")
    examples = glue.read_examples(spec, dev, max_examples)
    pre, model_config, vocab = load_hf(local_view(model_path))
    if random_init:
        torch.manual_seed(seed)
        pre = BertForPreTraining(model_config)
    device = device_for(use_gpu=use_gpu)
    model = pre.to(device).eval()
    tok = bert_tokenizer(str(vocab), lowercase)
    scores = []
    for lo in range(0, len(examples), batch_size):
        part = examples[lo:lo + batch_size]
        a = _embed(model, trim_batch(encode_texts(tok, [e.text_a for e in part], None, max_seq_length)), device)
        b = _embed(model, trim_batch(encode_texts(tok, [e.text_b for e in part], None, max_seq_length)), device)
        scores.append(torch.nn.functional.cosine_similarity(a.float(), b.float(), dim=-1).cpu().numpy())
    gold = np.array([float(e.label) for e in examples])
    rho = stats.spearmanr(np.concatenate(scores), gold).statistic
    return float(rho) if np.isfinite(rho) else 0.0  # constant embeddings: no ranking, no correlation
