"""Task tokenization: BERT WordPiece with [CLS] A [SEP] (B [SEP]) templates, as padded id tensors.

Legend: N examples, S max_seq_length.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from data_jobs.tokenization import wordpiece_tokenizer


def bert_tokenizer(vocab_file: str, lowercase: bool):
    """The original BERT tokenizer (basic + WordPiece) with the [CLS]/[SEP] template and token types."""
    return wordpiece_tokenizer(vocab_file, lowercase, with_post_processor=True)


def encode_texts(
    tok, texts_a: Sequence[str], texts_b: Optional[Sequence[Optional[str]]], max_len: int
) -> dict:
    """Padded LongTensors input_ids/token_type_ids/attention_mask [N, S].

    Pairs are truncated longest-first, one token at a time, like BERT's ``_truncate_seq_pair``.
    """
    tok.enable_truncation(max_len, strategy="longest_first")
    tok.enable_padding(length=max_len, pad_id=tok.token_to_id("[PAD]"), pad_token="[PAD]")
    try:
        inputs = list(texts_a) if texts_b is None else list(zip(texts_a, texts_b))
        encs = tok.encode_batch(inputs)
    finally:
        tok.no_truncation()
        tok.no_padding()
    return {
        "input_ids": torch.tensor([e.ids for e in encs], dtype=torch.long),
        "token_type_ids": torch.tensor([e.type_ids for e in encs], dtype=torch.long),
        "attention_mask": torch.tensor([e.attention_mask for e in encs], dtype=torch.long),
    }
