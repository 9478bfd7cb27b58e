"""Hugging Face ``transformers`` BERT directories <-> bert_core models.

Our parameter names are HF's, so the mapping is a key copy plus three differences:
- tied weights: HF (and we) save ONE copy of the word-embedding matrix; ``cls.predictions.decoder
  .weight`` is never written and is re-tied on load. The decoder bias lives in
  ``cls.predictions.bias`` (older checkpoints also carry ``cls.predictions.decoder.bias``).
- prefixes: a ``BertModel`` checkpoint (e.g. sentence-transformers models) has no ``bert.`` prefix and
  no ``cls.*`` heads; missing heads (and a missing pooler) are freshly initialised and reported.
- buffers: ``embeddings.position_ids`` / ``token_type_ids`` are ignored; TF-era ``LayerNorm.gamma/
  beta`` names are renamed.
This module does not import ``transformers``: export and import work without it.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Mapping, NamedTuple, Optional

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from bert_core.config import ModelConfig
from bert_core.model import BertForPreTraining, init_bert_weights
from contracts.common import UserError, build_config, fsync_dir, read_json_object

log = logging.getLogger(__name__)

TIED_KEY = "cls.predictions.decoder.weight"
_HF_ONLY_BUFFERS = ("embeddings.position_ids", "embeddings.token_type_ids")
# Parts a checkpoint may lack; everything else in the encoder must be present.
_OPTIONAL_PREFIXES = ("cls.", "bert.pooler.")


def to_hf_config(config: ModelConfig) -> dict[str, Any]:
    """``config.json`` content for ``transformers.BertForPreTraining``."""
    fields = config.model_dump(exclude={"activation_checkpointing"})
    return {
        "architectures": ["BertForPreTraining"],
        "model_type": "bert",
        **fields,
        "position_embedding_type": "absolute",
        "tie_word_embeddings": True,
        "classifier_dropout": None,
        "use_cache": True,
    }


def from_hf_config(data: Mapping[str, Any], source: str = "config.json") -> ModelConfig:
    """ModelConfig from HF ``config.json`` content; refuses BERT variants we do not implement."""
    if data.get("model_type", "bert") != "bert":
        raise UserError(f"{source}: model_type {data.get('model_type')!r} is not 'bert'")
    pos = data.get("position_embedding_type", "absolute")
    if pos != "absolute":
        raise UserError(f"{source}: position_embedding_type {pos!r} not supported (only 'absolute')")
    if data.get("is_decoder"):
        raise UserError(f"{source}: decoder BERT (is_decoder=true) is not supported")
    keep = set(ModelConfig.model_fields) - {"activation_checkpointing"}
    fields = {k: v for k, v in data.items() if k in keep and v is not None}
    return build_config(ModelConfig, fields, source)


def export_state_dict(model: BertForPreTraining | Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The tensors to write: HF names, one copy of the tied matrix, contiguous CPU tensors."""
    state = model.state_dict() if isinstance(model, torch.nn.Module) else dict(model)
    out = {}
    for k, v in state.items():
        if k == TIED_KEY or k.endswith(_HF_ONLY_BUFFERS):
            continue
        out[k] = v.detach().to("cpu").contiguous().clone()  # clone: no storage shared between entries
    return out


def save_hf(
    model: BertForPreTraining | Mapping[str, torch.Tensor],
    config: ModelConfig,
    vocab_file: str | os.PathLike,
    out_dir: str | os.PathLike,
    do_lower_case: bool = True,
    *,
    hf_config: Optional[Mapping[str, Any]] = None,
    model_max_length: Optional[int] = None,
    last_files: Optional[Mapping[str, Any]] = None,
    replace: Optional[Callable[[Path, Path], None]] = None,
) -> Path:
    """Write an HF directory (config.json, model.safetensors, vocab.txt, tokenizer_config.json).

    Built in a temporary sibling directory and renamed into place, so ``out_dir`` is either the old
    export or the complete new one, never half of each. ``hf_config`` replaces the config.json made from
    ``config`` (e.g. a classifier's labels); ``model_max_length`` defaults to the position table's size;
    ``last_files`` ({name: JSON object}) are written after everything else (a finished marker);
    ``replace(new, final)`` puts the directory in place (default ``replace_dir``).
    """
    vocab_file, out_dir = Path(vocab_file), Path(out_dir)
    if not vocab_file.is_file():
        raise UserError(f"{vocab_file}: vocab file not found")
    n_vocab = sum(1 for _ in vocab_file.open(encoding="utf-8"))
    if n_vocab > config.vocab_size:
        raise UserError(f"{vocab_file}: {n_vocab} tokens but the model has vocab_size {config.vocab_size}")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{out_dir.name}.", dir=out_dir.parent))
    try:
        save_file(export_state_dict(model), str(tmp / "model.safetensors"), metadata={"format": "pt"})
        _write_json(tmp / "config.json", dict(hf_config) if hf_config is not None else to_hf_config(config))
        shutil.copyfile(vocab_file, tmp / "vocab.txt")
        _write_json(tmp / "tokenizer_config.json", {
            "tokenizer_class": "BertTokenizer",
            "do_lower_case": do_lower_case,
            "model_max_length": model_max_length or config.max_position_embeddings,
            "unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]",
            "cls_token": "[CLS]", "mask_token": "[MASK]",
        })
        for name, obj in (last_files or {}).items():
            _write_json(tmp / name, obj)
        for f in tmp.iterdir():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        (replace or replace_dir)(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def replace_dir(new: Path, final: Path) -> None:
    """Rename ``new`` to ``final``; an existing ``final`` is moved aside first and then deleted."""
    old = None
    if final.exists():
        old = final.with_name(f".old-{final.name}.{os.getpid()}")
        os.replace(final, old)
    os.replace(new, final)
    fsync_dir(final.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


class HFCheckpoint(NamedTuple):
    model: BertForPreTraining
    config: ModelConfig
    vocab_file: Path
    initialised: list[str]  # our keys that the checkpoint lacked (fresh init)
    ignored: list[str]  # checkpoint keys we did not use (other heads, buffers)


def read_hf(hf_dir: str | os.PathLike) -> HFCheckpoint:
    """Load any HF BERT directory into a ``BertForPreTraining``, with what was initialised/ignored."""
    hf_dir = Path(hf_dir)
    if not hf_dir.is_dir():
        raise UserError(f"{hf_dir}: not a directory (expected an HF BERT export)")
    cfg_path, vocab = hf_dir / "config.json", hf_dir / "vocab.txt"
    for p in (cfg_path, vocab):
        if not p.is_file():
            raise UserError(f"{p}: missing from the HF directory")
    config = from_hf_config(read_json_object(cfg_path, "HF config"), str(cfg_path))
    raw = _read_weights(hf_dir)
    # Built on the meta device: initialising weights that are about to be overwritten costs more
    # than reading them (about 1 s for MiniLM). Only the parts the checkpoint lacks get initialised.
    with torch.device("meta"):
        model = BertForPreTraining(config)
    model.to_empty(device="cpu")
    own = model.state_dict()
    state, ignored = _normalise_keys(raw, set(own))
    initialised = sorted(k for k in own if k not in state and k != TIED_KEY)
    required = [k for k in initialised if not k.startswith(_OPTIONAL_PREFIXES)]
    if required:
        raise UserError(f"{hf_dir}: weights lack {len(required)} encoder tensors, e.g. {required[:3]}")
    for k, v in state.items():
        if v.shape != own[k].shape:
            raise UserError(f"{hf_dir}: {k} has shape {tuple(v.shape)} but config.json implies {tuple(own[k].shape)}")
    model.load_state_dict(state, strict=False)
    model.tie_weights()
    _init_missing(model, initialised)
    if initialised:
        log.warning("%s: freshly initialised (absent from the checkpoint): %s", hf_dir, ", ".join(initialised))
    return HFCheckpoint(model, config, vocab, initialised, ignored)


def _init_missing(model: BertForPreTraining, missing: list[str]) -> None:
    """Initialise each module that owns a key the checkpoint lacked (whole module: a LayerNorm
    with a loaded weight but a fresh bias would be a silent mix)."""
    std = model.config.initializer_range
    # "cls.predictions" owns only its bias directly (handled below); initialising the whole
    # module would overwrite the tied decoder, i.e. the loaded word embeddings.
    owners = {k.rsplit(".", 1)[0] for k in missing} - {"cls.predictions"}
    for name, module in model.named_modules():
        if name in owners:
            init_bert_weights(module, std)
    if "cls.predictions.bias" in missing:
        with torch.no_grad():
            model.cls.predictions.bias.zero_()


def load_hf(hf_dir: str | os.PathLike) -> tuple[BertForPreTraining, ModelConfig, Path]:
    """(model, config, vocab_file) from an HF BERT directory; see ``read_hf`` for the report."""
    ck = read_hf(hf_dir)
    return ck.model, ck.config, ck.vocab_file


def _read_weights(hf_dir: Path) -> dict[str, torch.Tensor]:
    st, binf = hf_dir / "model.safetensors", hf_dir / "pytorch_model.bin"
    index = hf_dir / "model.safetensors.index.json"
    try:
        if st.is_file():
            return load_file(str(st))
        if index.is_file():  # sharded export (large models): {"weight_map": {key: shard file}}
            shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
            return {k: v for shard in shards for k, v in load_file(str(hf_dir / shard)).items()}
        if binf.is_file():
            return torch.load(binf, map_location="cpu", weights_only=True)
    except (SafetensorError, OSError, RuntimeError, ValueError, KeyError) as err:
        raise UserError(f"{hf_dir}: cannot read weights: {err}") from None
    raise UserError(f"{hf_dir}: no model.safetensors (or .index.json) or pytorch_model.bin")


def _normalise_keys(raw: Mapping[str, torch.Tensor], ours: set[str]) -> tuple[dict[str, torch.Tensor], list[str]]:
    """Map checkpoint keys onto ours; returns (state, ignored keys)."""
    state: dict[str, torch.Tensor] = {}
    ignored: list[str] = []
    for k, v in raw.items():
        name = k.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
        if not name.startswith(("bert.", "cls.")):
            name = "bert." + name  # a bare BertModel checkpoint
        if name == "cls.predictions.decoder.bias":
            name = "cls.predictions.bias"  # same tensor in HF; only older exports write this key
        if name in ours and name != TIED_KEY:
            state.setdefault(name, v)
        elif name.startswith("bert.") and not name.endswith(_HF_ONLY_BUFFERS):
            raise UserError(f"weights: {k} is not part of a BERT encoder (unsupported variant?)")
        else:
            ignored.append(k)  # tied copy, buffers, other heads (classifier, qa_outputs, ...)
    return state, sorted(ignored)


__all__ = ["to_hf_config", "from_hf_config", "save_hf", "load_hf", "read_hf", "export_state_dict", "HFCheckpoint"]
