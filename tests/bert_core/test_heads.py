"""Downstream heads: shapes, losses backpropagate, HF names (state dicts load in transformers)."""
from __future__ import annotations

import pytest
import torch

from bert_core.config import preset
from bert_core.heads import BertForQuestionAnswering, BertForSequenceClassification, BertForTokenClassification
from bert_core.losses import classification_loss, span_loss, token_classification_loss
from bert_core.model import BertForPreTraining
from contracts.common import UserError

transformers = pytest.importorskip("transformers")
CONFIG = preset("tiny", vocab_size=60)


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # see tests/bert_core/conftest.py



def inputs(B=2, S=7):
    torch.manual_seed(0)
    ids = torch.randint(1, 60, (B, S))
    mask = torch.ones(B, S, dtype=torch.long)
    mask[1, 5:] = 0
    return ids, torch.zeros(B, S, dtype=torch.long), mask


def hf_config(**kw):
    return transformers.BertConfig(**CONFIG.model_dump(exclude={"activation_checkpointing"}), **kw)


@pytest.mark.parametrize(
    "ours, theirs, kw",
    [
        (BertForSequenceClassification, "BertForSequenceClassification", {"num_labels": 3}),
        (BertForQuestionAnswering, "BertForQuestionAnswering", {}),
        (BertForTokenClassification, "BertForTokenClassification", {"num_labels": 5}),
    ],
)
def test_heads_match_transformers(ours, theirs, kw):
    torch.manual_seed(1)
    head = ours(CONFIG, **kw).eval()
    hf = getattr(transformers, theirs)(hf_config(**kw)).eval()
    result = hf.load_state_dict(head.state_dict(), strict=True)  # same names, nothing left over
    assert not result.missing_keys and not result.unexpected_keys
    ids, types, mask = inputs()
    with torch.no_grad():
        got = head(ids, types, mask)
        ref = hf(input_ids=ids, token_type_ids=types, attention_mask=mask)
    if theirs == "BertForQuestionAnswering":
        torch.testing.assert_close(got[0], ref.start_logits, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got[1], ref.end_logits, atol=1e-5, rtol=1e-5)
    else:
        torch.testing.assert_close(got, ref.logits, atol=1e-5, rtol=1e-5)


def test_shapes_and_losses_backpropagate_to_the_encoder():
    ids, types, mask = inputs(B=2, S=7)
    cls = BertForSequenceClassification(CONFIG, num_labels=3).train()
    logits_BC = cls(ids, types, mask)
    assert logits_BC.shape == (2, 3)
    classification_loss(logits_BC, torch.tensor([0, 2])).backward()
    assert cls.bert.encoder.layer[0].attention.self.query.weight.grad.abs().sum() > 0

    reg = BertForSequenceClassification(CONFIG, num_labels=1)
    assert reg(ids).shape == (2, 1)

    qa = BertForQuestionAnswering(CONFIG)
    start_BS, end_BS = qa(ids, types, mask)
    assert start_BS.shape == end_BS.shape == (2, 7)
    span_loss(start_BS, end_BS, torch.tensor([1, 2]), torch.tensor([3, 2])).backward()
    assert qa.qa_outputs.weight.grad.abs().sum() > 0
    assert qa.bert.pooler is None  # no unused parameters under DDP/ZeRO

    tok = BertForTokenClassification(CONFIG, num_labels=5)
    logits_BSC = tok(ids, types, mask)
    assert logits_BSC.shape == (2, 7, 5)
    labels = torch.randint(0, 5, (2, 7)).masked_fill(mask == 0, -100)
    token_classification_loss(logits_BSC, labels).backward()


@pytest.mark.parametrize("head_cls, kw", [(BertForSequenceClassification, {"num_labels": 2}), (BertForQuestionAnswering, {})])
def test_from_encoder_takes_pretrained_weights(head_cls, kw):
    torch.manual_seed(2)
    pre = BertForPreTraining(CONFIG)
    for source in (pre.bert, pre.state_dict(), pre.bert.state_dict()):  # module, with and without "bert."
        head = head_cls.from_encoder(source, CONFIG, **kw)
        w = head.bert.encoder.layer[1].output.dense.weight
        assert torch.equal(w, pre.bert.encoder.layer[1].output.dense.weight)
        assert w.data_ptr() != pre.bert.encoder.layer[1].output.dense.weight.data_ptr()  # a copy


@pytest.mark.parametrize("head_cls, kw", [(BertForSequenceClassification, {"num_labels": 2}), (BertForQuestionAnswering, {}),
                                         (BertForTokenClassification, {"num_labels": 5})])
def test_from_encoder_is_a_fresh_head_loaded_to_the_bit_also_when_its_init_is_skipped(head_cls, kw):
    """A head on a pretrained encoder is what it always was: built whole under the seed (the encoder's
    init drawn, then the head's own layers), then loaded. Built again under a seed it saw before, the
    encoder's init is skipped and the generator set to where that init would have left it: the head's
    own layers, the loaded weights and the generator afterwards are the same bits."""
    torch.manual_seed(2)
    pre = BertForPreTraining(CONFIG)
    for seed in (5, 6, 5, 6):  # the second 5 and 6: the skipped init
        torch.manual_seed(seed)
        whole = head_cls(CONFIG, **kw)
        whole.bert.load_state_dict({k: v for k, v in pre.bert.state_dict().items() if k in whole.bert.state_dict()})
        after_whole = torch.get_rng_state()
        torch.manual_seed(seed)
        head = head_cls.from_encoder(pre.bert, CONFIG, **kw)
        assert torch.equal(torch.get_rng_state(), after_whole)
        got, want = head.state_dict(), whole.state_dict()
        assert list(got) == list(want) and all(torch.equal(got[k], want[k]) for k in want)


def test_from_encoder_rejects_other_architecture():
    other = BertForPreTraining(preset("tiny", vocab_size=60, intermediate_size=100))
    with pytest.raises(UserError, match="has shape"):
        BertForSequenceClassification.from_encoder(other.bert, CONFIG, num_labels=2)
    with pytest.raises(UserError, match="missing"):
        BertForTokenClassification.from_encoder({"embeddings.word_embeddings.weight": torch.zeros(60, 64)}, CONFIG, num_labels=2)
