"""Downstream heads on the BERT encoder: sequence classification, span extraction (SQuAD), token
classification (NER). Names match HF ``BertFor*`` classes, so their state dicts load either way.

Loading a pretrained encoder: ``Head.from_encoder(encoder, config, ...)`` where ``encoder`` is a
``BertModel`` (e.g. ``load_hf(dir)[0].bert``) or its state dict (keys with or without ``bert.``);
the head itself is freshly initialised. Pretraining heads (``cls.*``) are ignored.

Shape legend: B batch, S sequence, D hidden, C classes.
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import Mapping, TypeVar

import torch
from torch import nn

from bert_core.config import ModelConfig
from bert_core.model import BertModel, init_bert_weights
from contracts.common import UserError

H = TypeVar("H", bound="_EncoderHead")


class _EncoderHead(nn.Module):
    """Shared plumbing: an encoder called ``bert`` plus a loader for pretrained encoder weights."""

    bert: BertModel
    POOLING = False  # whether the head's encoder has the pooler (BertModel's add_pooling_layer)

    @classmethod
    def from_encoder(cls: type[H], encoder: BertModel | Mapping[str, torch.Tensor], config: ModelConfig, **kw) -> H:
        state = encoder.state_dict() if isinstance(encoder, nn.Module) else encoder
        state = {k.removeprefix("bert."): v for k, v in state.items() if not k.startswith("cls.")}
        state = {k: v for k, v in state.items() if not k.endswith("position_ids")}
        if not cls.POOLING:
            state = {k: v for k, v in state.items() if not k.startswith("pooler.")}
        bert = _encoder_to_load(config, cls.POOLING)
        own = bert.state_dict()
        missing = sorted(set(own) - set(state))
        unexpected = sorted(set(state) - set(own))
        if missing or unexpected:
            raise UserError(f"encoder weights do not fit {cls.__name__}: missing {missing[:5]}, unexpected {unexpected[:5]}")
        bad = [k for k in own if own[k].shape != state[k].shape]
        if bad:
            k = bad[0]
            raise UserError(f"encoder weights: {k} has shape {tuple(state[k].shape)}, the config needs {tuple(own[k].shape)}")
        bert.load_state_dict(state)
        return cls(config, encoder=bert, **kw)


# (the CPU generator's state before, the config, the pooler) -> the state after ``BertModel(config)``:
# a head built on a pretrained encoder draws its own layers' init from exactly the generator state a
# freshly initialised encoder would leave, without paying that init again (about 1 s for MiniLM, per
# fine-tuning cell) when the same seed and shape come back.
_AFTER_INIT: "OrderedDict[tuple[str, str, bool], torch.Tensor]" = OrderedDict()
_AFTER_INIT_KEPT = 64  # 5 KB each


def _encoder_to_load(config: ModelConfig, pooling: bool) -> BertModel:
    """An encoder whose weights are about to be overwritten, with the generator advanced as its init would."""
    before = torch.get_rng_state()
    key = (hashlib.sha256(before.numpy().tobytes()).hexdigest(), config.model_dump_json(), pooling)
    after = _AFTER_INIT.get(key)
    if after is None:
        bert = BertModel(config, add_pooling_layer=pooling)
        _AFTER_INIT[key] = torch.get_rng_state()
        while len(_AFTER_INIT) > _AFTER_INIT_KEPT:
            _AFTER_INIT.popitem(last=False)
        return bert
    with torch.device("meta"):  # draws nothing from the generator
        bert = BertModel(config, add_pooling_layer=pooling)
    bert.to_empty(device="cpu")
    torch.set_rng_state(after)
    return bert


class BertForSequenceClassification(_EncoderHead):
    """Linear classifier on the pooled [CLS] vector; C == 1 means regression (STS-B)."""

    POOLING = True

    def __init__(self, config: ModelConfig, num_labels: int, encoder: BertModel | None = None):
        super().__init__()
        self.config = config
        self.num_labels = num_labels
        self.bert = encoder if encoder is not None else BertModel(config)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.classifier = nn.Linear(config.hidden_size, num_labels)
        init_bert_weights(self.classifier, config.initializer_range)

    def forward(self, input_ids, token_type_ids=None, attention_mask=None) -> torch.Tensor:
        _, pooled_BD = self.bert(input_ids, token_type_ids, attention_mask)
        return self.classifier(self.dropout(pooled_BD))  # [B, C]


class BertForQuestionAnswering(_EncoderHead):
    """Start/end scores for every token (one Linear D -> 2), as in the BERT SQuAD recipe."""

    def __init__(self, config: ModelConfig, encoder: BertModel | None = None):
        super().__init__()
        self.config = config
        self.bert = encoder if encoder is not None else BertModel(config, add_pooling_layer=False)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        init_bert_weights(self.qa_outputs, config.initializer_range)

    def forward(self, input_ids, token_type_ids=None, attention_mask=None) -> tuple[torch.Tensor, torch.Tensor]:
        sequence_BSD, _ = self.bert(input_ids, token_type_ids, attention_mask)
        logits_BS2 = self.qa_outputs(sequence_BSD)
        start_BS, end_BS = logits_BS2.unbind(-1)
        return start_BS.contiguous(), end_BS.contiguous()


class BertForTokenClassification(_EncoderHead):
    """Per-token classifier (NER tags) on the final hidden states."""

    def __init__(self, config: ModelConfig, num_labels: int, encoder: BertModel | None = None):
        super().__init__()
        self.config = config
        self.num_labels = num_labels
        self.bert = encoder if encoder is not None else BertModel(config, add_pooling_layer=False)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.classifier = nn.Linear(config.hidden_size, num_labels)
        init_bert_weights(self.classifier, config.initializer_range)

    def forward(self, input_ids, token_type_ids=None, attention_mask=None) -> torch.Tensor:
        sequence_BSD, _ = self.bert(input_ids, token_type_ids, attention_mask)
        return self.classifier(self.dropout(sequence_BSD))  # [B, S, C]


__all__ = ["BertForSequenceClassification", "BertForQuestionAnswering", "BertForTokenClassification"]
