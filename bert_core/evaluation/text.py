"""Task tokenization: BERT WordPiece with [CLS] A [SEP] (B [SEP]) templates, as padded id tensors.

Legend: N examples, S max_seq_length.
"""
from __future__ import annotations

from typing import Optional, Sequence

from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

from data_jobs.common import UserError


def read_vocab(path: str) -> dict[str, int]:
    with open(path, encoding="utf-8") as f:
        return {line.rstrip("\n"): i for i, line in enumerate(f)}


def bert_tokenizer(vocab_file: str, lowercase: bool) -> Tokenizer:
    """The original BERT tokenizer (basic + WordPiece) as a fast ``tokenizers.Tokenizer``."""
    vocab = read_vocab(vocab_file)
    missing = [t for t in ("[CLS]", "[SEP]", "[UNK]", "[PAD]") if t not in vocab]
    if missing:
        raise UserError(f"{vocab_file}: vocab lacks special tokens {missing}")
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=lowercase, lowercase=lowercase
    )
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
    )
    return tok


def encode_texts(
    tok: Tokenizer, texts_a: Sequence[str], texts_b: Optional[Sequence[Optional[str]]], max_len: int
) -> dict:
    """Padded LongTensors input_ids/token_type_ids/attention_mask [N, S].

    Pairs are truncated longest-first, one token at a time, like BERT's ``_truncate_seq_pair``.
    """
    import torch

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
