"""Model configuration and presets. Pure pydantic: importing it pulls in neither torch nor DeepSpeed.

Field names follow Hugging Face ``BertConfig`` so that export/import is a plain field copy.
"""
from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from contracts.common import StrictModel, UserError

PresetName = Literal["tiny", "mini", "small", "base", "large"]


class ModelConfig(StrictModel):
    """BERT architecture (post-LN encoder, learned absolute positions, GELU)."""

    vocab_size: int = Field(30522, gt=0, description="WordPiece vocabulary size")
    hidden_size: int = Field(768, gt=0, description="H: width of every hidden state")
    num_hidden_layers: int = Field(12, gt=0, description="L: number of encoder blocks")
    num_attention_heads: int = Field(12, gt=0, description="A: attention heads per block")
    intermediate_size: int = Field(3072, gt=0, description="width of the feed-forward layer (4H)")
    hidden_act: Literal["gelu"] = Field("gelu", description="feed-forward activation (exact erf GELU)")
    hidden_dropout_prob: float = Field(0.1, ge=0.0, lt=1.0, description="dropout on hidden states")
    attention_probs_dropout_prob: float = Field(0.1, ge=0.0, lt=1.0, description="dropout on attention weights")
    max_position_embeddings: int = Field(512, gt=0, description="longest sequence the model accepts")
    type_vocab_size: int = Field(2, gt=0, description="number of segment (token type) ids")
    initializer_range: float = Field(0.02, gt=0.0, description="std of the truncated-normal init")
    layer_norm_eps: float = Field(1e-12, gt=0.0, description="LayerNorm epsilon")
    pad_token_id: int = Field(0, ge=0, description="id of [PAD]")
    activation_checkpointing: bool = Field(False, description="recompute encoder blocks in backward to save memory")

    @model_validator(mode="after")
    def _heads_divide(self) -> "ModelConfig":
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} is not divisible by num_attention_heads {self.num_attention_heads}"
            )
        return self


def _preset(L: int, H: int, A: int, **kw) -> dict:
    return dict(num_hidden_layers=L, hidden_size=H, num_attention_heads=A, intermediate_size=4 * H, **kw)


# Sizes from the BERT paper and Turc et al. (2019) "Well-Read Students Learn Better" (mini/small).
PRESETS: dict[str, dict] = {
    "tiny": _preset(2, 64, 2, max_position_embeddings=128),  # CPU tests: seconds
    "mini": _preset(4, 256, 4),
    "small": _preset(4, 512, 8),
    "base": _preset(12, 768, 12),  # 110M parameters
    "large": _preset(24, 1024, 16),  # 340M parameters
}


def preset(name: str, **overrides) -> ModelConfig:
    """A preset architecture, e.g. ``preset("large", vocab_size=28996)``."""
    if name not in PRESETS:
        raise UserError(f"unknown model preset {name!r}; choose one of {', '.join(PRESETS)}")
    return ModelConfig(**{**PRESETS[name], **overrides})
