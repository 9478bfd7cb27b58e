"""BERT encoder and pretraining heads (Devlin et al., 2019), readable top to bottom.

Architecture only: no DeepSpeed, no data loading. Parameter names match Hugging Face
``transformers`` ``BertModel`` / ``BertForPreTraining`` one-to-one so that ``bert_core.hf`` maps
checkpoints with a plain key copy.

Shape legend: B batch, S sequence, D hidden (H in the paper), N heads, K head dim (D/N),
F feed-forward width, V vocabulary, M masked positions in the whole batch.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from bert_core.config import ModelConfig


class BertEmbeddings(nn.Module):
    """word + learned absolute position + segment embeddings, then LayerNorm and dropout."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        # padding_idx as in HF: the [PAD] row gets no gradient from the lookup (the tied decoder
        # still updates it), so training behaves like the reference implementation.
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids_BS: torch.Tensor, token_type_ids_BS: torch.Tensor) -> torch.Tensor:
        S = input_ids_BS.shape[1]
        if S > self.position_embeddings.num_embeddings:
            raise ValueError(f"sequence length {S} exceeds max_position_embeddings {self.position_embeddings.num_embeddings}")
        # No position_ids buffer: positions are always 0..S-1, and a buffer would only add a key
        # that checkpoints from other tools disagree about.
        positions_S = torch.arange(S, device=input_ids_BS.device)
        x_BSD = (
            self.word_embeddings(input_ids_BS)
            + self.token_type_embeddings(token_type_ids_BS)
            + self.position_embeddings(positions_S)[None]
        )
        return self.dropout(self.LayerNorm(x_BSD))


class BertSelfAttention(nn.Module):
    """Multi-head self-attention; the softmax(QK^T/sqrt(K))V part runs in one fused SDPA call."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        D = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.query = nn.Linear(D, D)
        self.key = nn.Linear(D, D)
        self.value = nn.Linear(D, D)
        self.dropout_p = config.attention_probs_dropout_prob

    def forward(self, x_BSD: torch.Tensor, mask_B11S: torch.Tensor | None) -> torch.Tensor:
        B, S, D = x_BSD.shape
        N = self.num_heads

        def heads(t_BSD: torch.Tensor) -> torch.Tensor:  # [B, S, D] -> [B, N, S, K]
            return t_BSD.view(B, S, N, D // N).transpose(1, 2)

        q_BNSK, k_BNSK, v_BNSK = heads(self.query(x_BSD)), heads(self.key(x_BSD)), heads(self.value(x_BSD))
        if mask_B11S is not None and mask_B11S.dtype not in (q_BNSK.dtype, torch.bool):
            # Under autocast the residual stream is fp32 but q is bf16/fp16; SDPA wants matching
            # dtypes. A plain cast rounds finfo(fp32).min to -inf (NaN for an all-padding row).
            mask_B11S = mask_B11S.to(q_BNSK.dtype).clamp(min=torch.finfo(q_BNSK.dtype).min)
        out_BNSK = F.scaled_dot_product_attention(
            q_BNSK, k_BNSK, v_BNSK, attn_mask=mask_B11S, dropout_p=self.dropout_p if self.training else 0.0
        )
        return out_BNSK.transpose(1, 2).reshape(B, S, D)  # [B, N, S, K] -> [B, S, D]


class BertSelfOutput(nn.Module):
    """Projection after attention, dropout, residual, post-LN."""

    def __init__(self, config: ModelConfig, in_features: int | None = None):
        super().__init__()
        self.dense = nn.Linear(in_features or config.hidden_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, h_BSD: torch.Tensor, residual_BSD: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dropout(self.dense(h_BSD)) + residual_BSD)


class BertAttention(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.self = BertSelfAttention(config)
        self.output = BertSelfOutput(config)

    def forward(self, x_BSD: torch.Tensor, mask_B11S: torch.Tensor | None) -> torch.Tensor:
        return self.output(self.self(x_BSD, mask_B11S), x_BSD)


class BertIntermediate(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)

    def forward(self, x_BSD: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.dense(x_BSD))  # exact erf GELU, as BERT and HF "gelu"


class BertOutput(BertSelfOutput):
    """Feed-forward down-projection [F -> D], dropout, residual, post-LN."""

    def __init__(self, config: ModelConfig):
        super().__init__(config, in_features=config.intermediate_size)


class BertLayer(nn.Module):
    """One post-LN encoder block: attention then feed-forward, each with residual + LayerNorm."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertOutput(config)

    def forward(self, x_BSD: torch.Tensor, mask_B11S: torch.Tensor | None) -> torch.Tensor:
        a_BSD = self.attention(x_BSD, mask_B11S)
        return self.output(self.intermediate(a_BSD), a_BSD)


class BertEncoder(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))
        self.activation_checkpointing = config.activation_checkpointing

    def forward(self, x_BSD: torch.Tensor, mask_B11S: torch.Tensor | None) -> torch.Tensor:
        for block in self.layer:
            if self.activation_checkpointing and self.training and torch.is_grad_enabled():
                # Non-reentrant checkpointing restores the RNG state, so dropout masks (and thus
                # gradients) are identical to a run without checkpointing.
                x_BSD = checkpoint(block, x_BSD, mask_B11S, use_reentrant=False)
            else:
                x_BSD = block(x_BSD, mask_B11S)
        return x_BSD


class BertPooler(nn.Module):
    """tanh(dense(hidden of [CLS])): the sentence vector the NSP and classification heads read."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, sequence_BSD: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(sequence_BSD[:, 0]))


def attention_bias(attention_mask_BS: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """[B, S] of 1 (token) / 0 (padding) -> additive bias [B, 1, 1, S] of 0 / most-negative.

    Additive rather than boolean: a row with every key masked (an all-padding sequence) then gives
    a uniform softmax instead of NaN, exactly as HF does.
    """
    if attention_mask_BS is None:
        return None
    keep_B11S = attention_mask_BS[:, None, None, :].to(torch.bool)
    zero = torch.zeros((), dtype=dtype, device=attention_mask_BS.device)
    neg = torch.full((), torch.finfo(dtype).min, dtype=dtype, device=attention_mask_BS.device)
    return torch.where(keep_B11S, zero, neg)


def attention_mask_fast(attention_mask_BS: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """The mask SDPA gets on the fast path: None when every row is full length (SDPA may then pick
    the flash kernel, which takes no mask), else a boolean keep-mask [B, 1, 1, S] (memory-efficient
    kernel, no additive bias tensor in the model's dtype). A row with no token at all keeps the
    additive bias: a fully masked boolean row would give NaN.

    One host sync per forward decides the path; the outputs equal ``attention_bias``'s (masked keys
    get exactly zero weight either way), tested on CPU."""
    if attention_mask_BS is None:
        return None
    keep_BS = attention_mask_BS.to(torch.bool)
    all_full, every_row_has_a_token = torch.stack([keep_BS.all(), keep_BS.any(1).all()]).tolist()
    if all_full:
        return None
    if not every_row_has_a_token:
        return attention_bias(attention_mask_BS, dtype)
    return keep_BS[:, None, None, :]


def init_bert_weights(module: nn.Module, std: float) -> None:
    """The BERT initialisation, in one place: truncated normal(0, std) clipped at ±2 std for
    weights (as the original TensorFlow code), zero biases, LayerNorm = identity, zero [PAD] row."""
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.trunc_normal_(m.weight, std=std, a=-2 * std, b=2 * std)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.trunc_normal_(m.weight, std=std, a=-2 * std, b=2 * std)
            if m.padding_idx is not None:
                with torch.no_grad():
                    m.weight[m.padding_idx].zero_()
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


class BertModel(nn.Module):
    """The encoder: embeddings -> L post-LN blocks -> pooler."""

    def __init__(self, config: ModelConfig, add_pooling_layer: bool = True):
        super().__init__()
        self.config = config
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)
        # Span and token heads never read the pooler; without it they have no unused parameters
        # (which DDP/ZeRO would complain about) and their state dicts match HF's key for key.
        self.pooler = BertPooler(config) if add_pooling_layer else None
        self.fast_attention = False  # set by use_fast_paths: mask-free / boolean-mask SDPA
        init_bert_weights(self, config.initializer_range)

    def forward(
        self,
        input_ids_BS: torch.Tensor,
        token_type_ids_BS: torch.Tensor | None = None,
        attention_mask_BS: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Returns (sequence_BSD, pooled_BD); pooled is None without a pooling layer."""
        if token_type_ids_BS is None:
            token_type_ids_BS = torch.zeros_like(input_ids_BS)
        x_BSD = self.embeddings(input_ids_BS, token_type_ids_BS)
        to_mask = attention_mask_fast if self.fast_attention else attention_bias
        sequence_BSD = self.encoder(x_BSD, to_mask(attention_mask_BS, x_BSD.dtype))
        return sequence_BSD, (self.pooler(sequence_BSD) if self.pooler is not None else None)


class BertPredictionHeadTransform(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, h_XD: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(F.gelu(self.dense(h_XD)))


class BertLMPredictionHead(nn.Module):
    """transform -> decoder (weight tied to the word embeddings) + its own output bias."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.transform = BertPredictionHeadTransform(config)
        # The decoder has no bias of its own: the bias lives in ``bias`` (HF key
        # ``cls.predictions.bias``), so the decoder is a pure alias of the embedding matrix. Its
        # weight is a meta-device placeholder (no memory, no init) until the owner ties it.
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size, bias=False, device="meta")
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, h_XD: torch.Tensor) -> torch.Tensor:
        return F.linear(self.transform(h_XD), self.decoder.weight, self.bias)


class BertPreTrainingHeads(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.predictions = BertLMPredictionHead(config)
        self.seq_relationship = nn.Linear(config.hidden_size, 2)


class PretrainingOutput(NamedTuple):
    mlm_logits: torch.Tensor  # [M, V] at mlm_positions_M, or [B, S, V] when no positions given
    nsp_logits_B2: torch.Tensor


class BertForPreTraining(nn.Module):
    """Encoder + masked-LM head + next-sentence head, MLM logits only where they are needed."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.bert = BertModel(config)
        self.cls = BertPreTrainingHeads(config)
        self.tie_weights()  # before init: the decoder must never get a V x D matrix of its own
        init_bert_weights(self.cls.predictions.transform, config.initializer_range)
        init_bert_weights(self.cls.seq_relationship, config.initializer_range)

    def tie_weights(self) -> None:
        """Make the decoder weight THE word-embedding matrix (same Parameter, one copy).

        Call again after replacing either (e.g. after loading a state dict with ``assign=True``)."""
        self.cls.predictions.decoder.weight = self.bert.embeddings.word_embeddings.weight

    def num_parameters(self, exclude_embeddings: bool = False) -> int:
        """Unique parameters (the tied matrix counted once)."""
        n = sum(p.numel() for p in self.parameters())  # parameters() yields a shared Parameter once
        if exclude_embeddings:
            e = self.bert.embeddings
            n -= sum(m.weight.numel() for m in (e.word_embeddings, e.position_embeddings, e.token_type_embeddings))
        return n

    def forward(
        self,
        input_ids_BS: torch.Tensor,
        token_type_ids_BS: torch.Tensor | None = None,
        attention_mask_BS: torch.Tensor | None = None,
        mlm_positions_M: torch.Tensor | None = None,
    ) -> PretrainingOutput:
        """``mlm_positions_M``: flat (row-major) indices into the B*S tokens of the batch.

        With positions, the transform and the D x V decoder run on M rows instead of B*S: with 15%
        masking that skips ~85% of the largest matmul of a small BERT's training step.
        """
        sequence_BSD, pooled_BD = self.bert(input_ids_BS, token_type_ids_BS, attention_mask_BS)
        if mlm_positions_M is None:
            mlm_logits = self.cls.predictions(sequence_BSD)  # [B, S, V]
        else:
            B, S, D = sequence_BSD.shape
            masked_MD = sequence_BSD.reshape(B * S, D).index_select(0, mlm_positions_M)
            mlm_logits = self.cls.predictions(masked_MD)  # [M, V]
        return PretrainingOutput(mlm_logits, self.cls.seq_relationship(pooled_BD))


def use_fast_paths(model: nn.Module, attention: bool = True, compile_blocks: bool = False) -> nn.Module:
    """GPU step options, off by default (the default path is the bitwise reference):

    - ``attention``: no additive mask when a batch's rows are all full length (flash SDPA), a
      boolean mask otherwise (``attention_mask_fast``);
    - ``compile_blocks``: ``nn.Module.compile()`` in place on every encoder block (not the heads:
      their row count M changes every batch, which would recompile), so
      inductor fuses bias+GELU and dropout+residual+LayerNorm; parameter names are unchanged (no
      ``_orig_mod.`` prefix), so DeepSpeed, checkpoints and export see the same module tree.
    """
    bert = model.bert if hasattr(model, "bert") else model
    bert.fast_attention = attention
    if compile_blocks:
        for block in bert.encoder.layer:  # one shape per length bin: a few static graphs
            block.compile(dynamic=False)
    return model


def flat_positions(positions_BP: torch.Tensor, valid_BP: torch.Tensor, seq_len: int) -> torch.Tensor:
    """Per-row masked positions [B, P] (padded; ``valid_BP`` marks real ones) -> flat indices [M]
    into the B*S tokens, row-major: the ``mlm_positions_M`` that ``BertForPreTraining`` takes."""
    B = positions_BP.shape[0]
    offsets_B1 = torch.arange(B, device=positions_BP.device)[:, None] * seq_len
    return (positions_BP + offsets_B1)[valid_BP.to(torch.bool)]


__all__ = [
    "BertModel",
    "BertForPreTraining",
    "PretrainingOutput",
    "attention_bias",
    "attention_mask_fast",
    "flat_positions",
    "init_bert_weights",
    "use_fast_paths",
]
