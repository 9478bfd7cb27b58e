"""CoNLL-2003 NER: the IOB2 reader, first-subword token features, and the feature-based BiLSTM tagger.

Fine-tuning labels only the first WordPiece of every word (later pieces carry -100 and are ignored), and
a word's prediction is read at its first piece — the BERT paper's choice. The feature-based variant
(paper section 5.3) freezes the encoder, concatenates chosen layers' hidden states at each word's first
piece, and trains a small BiLSTM + linear classifier on top.

Legend: N sentences, S tokens, W words, D hidden size, K layers concatenated, C tags.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import torch
from torch import nn

from contracts.common import UserError

IGNORE = -100
_TAG = re.compile(r"^(O|[BI]-[A-Za-z]+)$")


@dataclass(frozen=True)
class Sentence:
    words: tuple[str, ...]
    tags: tuple[str, ...]


def read_conll(path: str | Path, limit: Optional[int] = None) -> list[Sentence]:
    """Sentences of a CoNLL-2003 file (``word POS chunk NER`` per line, blank line between sentences,
    ``-DOCSTART-`` lines skipped)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: CoNLL file not found")
    out: list[Sentence] = []
    words: list[str] = []
    tags: list[str] = []
    raw = path.read_bytes().removeprefix(b"\xef\xbb\xbf")  # a byte-order mark is not part of the first word
    for lineno, line_bytes in enumerate(raw.splitlines(), start=1):  # \n, \r\n or \r, as text mode reads
        try:
            cells = line_bytes.decode("utf-8").split()
        except UnicodeDecodeError as err:
            raise UserError(f"{path}:{lineno}: not UTF-8 ({err.reason} at byte {err.start} of the line)") from None
        if not cells:
            if words:
                out.append(Sentence(tuple(words), tuple(tags)))
                words, tags = [], []
                if limit is not None and len(out) >= limit:
                    return out
            continue
        if cells[0] == "-DOCSTART-":
            continue
        if len(cells) != 4:
            raise UserError(f"{path}:{lineno}: expected 4 space-separated columns (word POS chunk NER), "
                            f"found {len(cells)}")
        if not _TAG.match(cells[3]):
            raise UserError(f"{path}:{lineno}: {cells[3]!r} is not an IOB2 tag")
        words.append(cells[0])
        tags.append(cells[3])
    if words:
        out.append(Sentence(tuple(words), tuple(tags)))
    if not out:
        raise UserError(f"{path}: no sentences")
    return out[:limit]


def label_list(sentences: Sequence[Sentence]) -> list[str]:
    """Tag inventory: "O" first, then sorted, so ids never depend on file order."""
    found = {t for s in sentences for t in s.tags}
    return ["O"] + sorted(found - {"O"})


def encode_sentences(tok, sentences: Sequence[Sentence], labels: Sequence[str], max_len: int):
    """Tensors input_ids/token_type_ids/attention_mask/labels [N, S] and, per sentence, the token position
    of each word's first piece (-1 where the word was truncated away)."""
    tag_id = {t: i for i, t in enumerate(labels)}
    tok.enable_truncation(max_len)
    tok.enable_padding(length=max_len, pad_id=tok.token_to_id("[PAD]"), pad_token="[PAD]")
    try:
        encs = tok.encode_batch([list(s.words) for s in sentences], is_pretokenized=True)
    finally:
        tok.no_truncation()
        tok.no_padding()
    label_rows, first_pieces = [], []
    for s, enc in zip(sentences, encs):
        first = [-1] * len(s.words)
        row = [IGNORE] * max_len
        prev = None
        for pos, w in enumerate(enc.word_ids):
            if w is not None and w != prev:
                first[w] = pos
                if s.tags[w] not in tag_id:
                    raise UserError(f"tag {s.tags[w]!r} does not occur in the training data")
                row[pos] = tag_id[s.tags[w]]
            prev = w
        label_rows.append(row)
        first_pieces.append(first)
    data = {
        "input_ids": torch.tensor([e.ids for e in encs], dtype=torch.long),
        "token_type_ids": torch.tensor([e.type_ids for e in encs], dtype=torch.long),
        "attention_mask": torch.tensor([e.attention_mask for e in encs], dtype=torch.long),
        "labels": torch.tensor(label_rows, dtype=torch.long),
    }
    return data, first_pieces


def training_rows(data: dict, path: str | Path) -> tuple[dict, int]:
    """The encoded training rows that carry a label, and how many carry none: rows whose every word the
    tokenizer drops whole (control or zero-width characters, a lone combining accent). They teach nothing,
    and a batch of only such rows has no loss (cross-entropy over no token is NaN). ``path``: the training
    file, named in the error when no row is left."""
    keep = (data["labels"] != IGNORE).any(1)
    if not keep.any():
        raise UserError(f"{path}: no training sentence has a word the tokenizer keeps (all control or "
                        "zero-width characters?)")
    return {k: v[keep] for k, v in data.items()}, int((~keep).sum())


def tags_from_token_logits(logits: Sequence, first_pieces: Sequence[list[int]], labels: Sequence[str]) -> list[list[str]]:
    """Per word: the argmax tag at its first piece ("O" for words truncated away)."""
    out = []
    for logits_SC, first in zip(logits, first_pieces):
        pred_S = logits_SC.argmax(-1).tolist()
        out.append([labels[pred_S[p]] if 0 <= p < len(pred_S) else "O" for p in first])
    return out


def layer_features(encoder, data: dict, first_pieces: Sequence[list[int]], layers: Sequence[int],
                   batch_size: int, device) -> list:
    """Frozen-encoder features: for every sentence a [W, K*D] float16 tensor, the chosen hidden states
    (index 0 = embeddings output, i = block i; negatives count from the last block) at each word's first
    piece. Hidden states are caught with forward hooks, so the encoder's forward stays untouched."""
    modules = [encoder.embeddings, *encoder.encoder.layer]
    picked = [modules[i] for i in layers]  # IndexError is checked by the caller
    caught: list = []
    hooks = [m.register_forward_hook(lambda _m, _i, out: caught.append(out[0] if isinstance(out, tuple) else out))
             for m in picked]
    encoder.to(device).eval()
    feats = []
    try:
        with torch.no_grad():
            n = len(data["input_ids"])
            for lo in range(0, n, batch_size):
                caught.clear()
                b = {k: v[lo : lo + batch_size].to(device) for k, v in data.items() if k != "labels"}
                encoder(b["input_ids"], b["token_type_ids"], b["attention_mask"])
                h_BSX = torch.cat(caught, dim=-1).float().cpu()  # [B, S, K*D] in `layers` order
                for j, first in enumerate(first_pieces[lo : lo + batch_size]):
                    idx = torch.tensor([max(p, 0) for p in first], dtype=torch.long)
                    f_WX = h_BSX[j, idx]
                    f_WX[torch.tensor([p < 0 for p in first], dtype=torch.bool)] = 0.0
                    feats.append(f_WX.half())
    finally:
        for h in hooks:
            h.remove()
    return feats


def pad_features(feats: Sequence, sentences: Sequence[Sentence], labels: Sequence[str]) -> dict:
    """Word-level batch tensors for the BiLSTM: features [N, W, X], attention_mask [N, W], labels [N, W]."""
    tag_id = {t: i for i, t in enumerate(labels)}
    N, W, X = len(feats), max(len(f) for f in feats), feats[0].shape[-1]
    data = {"features": torch.zeros(N, W, X, dtype=torch.float16),
            "attention_mask": torch.zeros(N, W, dtype=torch.long),
            "labels": torch.full((N, W), IGNORE, dtype=torch.long)}
    for i, (f, s) in enumerate(zip(feats, sentences)):
        data["features"][i, : len(f)] = f
        data["attention_mask"][i, : len(f)] = 1
        data["labels"][i, : len(f)] = torch.tensor([tag_id.get(t, IGNORE) for t in s.tags])
    return data


class BiLSTMTagger(nn.Module):
    """A small BiLSTM tagger over frozen features (the paper used two 768-wide layers)."""

    def __init__(self, in_dim: int, hidden: int, layers: int, num_labels: int):
        super().__init__()
        self.lstm = nn.LSTM(in_dim, hidden, num_layers=layers, bidirectional=True, batch_first=True)
        self.classifier = nn.Linear(2 * hidden, num_labels)

    def forward(self, features_BWX: torch.Tensor, mask_BW: torch.Tensor) -> torch.Tensor:
        lengths_B = mask_BW.sum(1).clamp(min=1).cpu()
        # Packing keeps the backward direction from reading padding first.
        packed = nn.utils.rnn.pack_padded_sequence(features_BWX.float(), lengths_B, batch_first=True,
                                                   enforce_sorted=False)
        out, _ = self.lstm(packed)
        out_BWH, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=features_BWX.shape[1])
        return self.classifier(out_BWH)  # [B, W, C]


def bilstm_tagger(in_dim: int, hidden: int, layers: int, num_labels: int) -> BiLSTMTagger:
    return BiLSTMTagger(in_dim, hidden, layers, num_labels)
