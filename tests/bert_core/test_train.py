"""The trainer with the plain-torch engine: exact resume, metrics outputs, phase 2 from phase 1,
bad input (one line, exit 2, nothing overwritten), and a tiny run on real text whose MLM loss falls."""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml

from bert_core.checkpoint import load_model_from_checkpoint
from bert_core.launch import main
from bert_core.train import run
from bert_core.train_config import TrainConfig
from bert_core.train_log import read_metrics
from contracts.common import build_config
from train_helpers import write_dataset

KEYS = ("loss", "mlm_loss", "nsp_loss", "mlm_acc", "nsp_acc", "lr", "grad_norm")


def _config(data: Path, out: Path, **kw) -> TrainConfig:
    base = dict(data_dir=str(data), output_dir=str(out), micro_batch_size=4, grad_accum_steps=2, max_steps=8,
                save_every=2, keep_last=10, log_every=1, lr=1e-3, seed=11, tensorboard=False)
    return build_config(TrainConfig, {**base, **kw})


def _snapshot(d: Path) -> dict[str, str]:
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("train") / "data", n=160, vocab_size=100, max_seq=32)


@pytest.fixture(scope="module")
def finished(data, tmp_path_factory) -> Path:
    """One unbroken 8-step run (dropout on, accumulation 2, TensorBoard on), reused by several tests."""
    out = tmp_path_factory.mktemp("runs") / "full"
    run(_config(data, out, tensorboard=True))
    return out


def test_torch_resume_is_bitwise_equal(finished, tmp_path, data):
    broken = tmp_path / "broken"
    shutil.copytree(finished, broken)
    # as if killed after step 5: the checkpoints after 4 never happened
    for step in (6, 8):
        shutil.rmtree(broken / "checkpoints" / f"step_{step:08d}")
    config = _config(data, broken, tensorboard=True)
    result = run(config, resume=True)
    a, b = read_metrics(finished / "metrics.jsonl"), read_metrics(result.metrics_file)
    assert [r["step"] for r in b] == list(range(1, 9))
    assert [[r[k] for k in KEYS] for r in a] == [[r[k] for k in KEYS] for r in b]
    wa = load_model_from_checkpoint(finished)[0].state_dict()
    wb = load_model_from_checkpoint(broken)[0].state_dict()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_metrics_jsonl_and_tensorboard(finished):
    records = read_metrics(finished / "metrics.jsonl")
    assert len(records) == 8
    for r in records:
        assert set(KEYS) | {"step", "tokens_per_s", "seq_per_s", "tokens_seen", "mfu"} <= set(r)
        assert r["tokens_per_s"] > 0 and 0 <= r["mlm_acc"] <= 1
    assert records[-1]["tokens_seen"] > records[0]["tokens_seen"]
    assert list((finished / "tensorboard").glob("events.out.tfevents.*"))
    state = json.loads((finished / "checkpoints" / "step_00000008" / "trainer_state.json").read_text())
    assert state["step"] == 8 and state["loader"]["index"] + state["loader"]["epoch"] > 0
    assert (finished / "checkpoints" / "step_00000008" / "rng" / "rank_00000.pt").is_file()


def test_phase2_starts_from_phase1_weights(finished, tmp_path, data):
    data2 = write_dataset(tmp_path / "data512", n=48, vocab_size=100, max_seq=64, max_pred=10, seed=3)
    shutil.copyfile(data / "vocab.txt", data2 / "vocab.txt")  # same vocabulary, longer sequences
    out = tmp_path / "phase2"
    run(_config(data2, out, max_steps=1, grad_accum_steps=1, lr=1e-9, warmup_proportion=0.0,
                init_from=str(finished), max_seq_length=64))
    p1 = load_model_from_checkpoint(finished)[0].state_dict()
    p2 = load_model_from_checkpoint(out)[0].state_dict()
    k = "bert.encoder.layer.1.output.dense.weight"
    torch.testing.assert_close(p2[k], p1[k], atol=1e-6, rtol=0)


def test_phase2_from_a_run_on_s3_equals_phase2_from_the_local_run(finished, tmp_path, data, s3_env, monkeypatch):
    """init_from an s3:// run (the pipeline's phase 2 on an object-store output_root): read from this node's
    verified copy; the same weights as phase 2 from the local run. An empty prefix is one line."""
    from bert_core.train import _local_model
    from contracts.common import UserError
    from contracts.storage import location

    monkeypatch.setenv("BERTFLOW_SCRATCH", str(tmp_path / "scratch"))
    loc = location(f"{s3_env}/runs/p1")
    for f in sorted(p for p in finished.rglob("*") if p.is_file() and not p.name.startswith(".")):
        loc.upload(f.relative_to(finished).as_posix(), f)
    kw = dict(max_steps=1, grad_accum_steps=1, save_every=1, warmup_proportion=0.0)
    run(_config(data, tmp_path / "from-local", init_from=str(finished), **kw))
    run(_config(data, tmp_path / "from-s3", init_from=f"{s3_env}/runs/p1", **kw))
    a = load_model_from_checkpoint(tmp_path / "from-local")[0].state_dict()
    b = load_model_from_checkpoint(tmp_path / "from-s3")[0].state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(UserError, match=rf"^init_from: {s3_env}/runs/none: holds no complete checkpoint"):
        _local_model(f"{s3_env}/runs/none")


def _cli(capsys, argv) -> tuple[int, str]:
    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    return code, err[-1] if err else ""


def test_bad_input_is_one_line_exit_2_and_overwrites_nothing(finished, data, tmp_path, capsys):
    before = _snapshot(finished)
    good = {"data_dir": str(data), "output_dir": str(finished), "micro_batch_size": 4, "grad_accum_steps": 2,
            "max_steps": 8, "save_every": 2, "keep_last": 10, "log_every": 1, "lr": 1e-3, "seed": 11, "tensorboard": False}

    def cfg(**kw):
        p = tmp_path / f"c{len(list(tmp_path.glob('c*.yaml')))}.yaml"
        p.write_text(yaml.safe_dump({**good, **kw}))
        return ["--config", str(p)]

    cases = [
        (cfg(lrr=1.0), "lrr: unknown key"),
        (cfg(model_overrides={"vocab_size": 50}), "data vocab_size 100 != model vocab_size 50"),
        (cfg(global_batch_size=12), "global_batch_size: 12 != micro_batch_size 4"),
        (cfg(), "already holds a run: this config's, finished"),
        (cfg(lr=2e-3), "already holds a run: another config's (differs in lr), which --resume cannot continue"),
        (cfg(lr=2e-3) + ["--resume"], "--resume: config differs from the run's"),
        # only the field that blocks is named: where and how widely a run runs may change on resume
        (cfg(lr=2e-3, log_every=3, keep_last=2, save_every=4) + ["--resume"], "train_config.json in lr ("),
        (cfg(output_dir=str(tmp_path / "none")) + ["--resume"], "nothing to resume"),
        (cfg(output_dir=str(tmp_path / "x"), init_from=str(tmp_path / "missing")), "checkpoint not found"),
        (cfg(output_dir=str(tmp_path / "x"), max_seq_length=128), "max_seq_length 32 != configured 128"),
        (["--config", str(tmp_path / "nope.yaml")], "config file not found"),
    ]
    for argv, msg in cases:
        code, line = _cli(capsys, argv)
        assert code == 2 and line.startswith("bertflow: error:") and msg in line, (argv, line)
    assert _snapshot(finished) == before
    assert not (tmp_path / "x").exists() and not (tmp_path / "none").exists()


def test_an_unfinished_run_of_this_config_is_pointed_at_resume(finished, tmp_path, capsys):
    run = tmp_path / "unfinished"
    shutil.copytree(finished, run)
    shutil.rmtree(run / "checkpoints" / "step_00000008")
    saved = json.loads((run / "train_config.json").read_text())["config"]
    saved["output_dir"] = str(run)
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(saved))
    code, line = _cli(capsys, ["--config", str(p)])
    assert code == 2 and "this config's, resumable from step_00000006; pass --resume to continue it" in line, line


def test_corrupt_checkpoint_is_refused_on_resume(finished, tmp_path, capsys):
    broken = tmp_path / "corrupt"
    shutil.copytree(finished, broken)
    (broken / "checkpoints" / "step_00000008" / "trainer_state.json").write_text("{oops")
    saved = json.loads((broken / "train_config.json").read_text())["config"]
    saved["output_dir"] = str(broken)
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(saved))
    code, line = _cli(capsys, ["--config", str(p), "--resume"])
    assert code == 2 and "step_00000008/trainer_state.json: corrupt checkpoint state" in line


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.shared_data
def test_tiny_run_on_real_text_learns(shared_data, bert_uncased_vocab, ray_local, tmp_path):
    """Real pipeline data (shard -> adopted BERT vocab -> instances, on Ray), 60 steps of BERT-tiny:
    the MLM loss falls well below its start (ln 30522 = 10.3)."""
    from data_jobs import instances_job, shard_job, vocab_job
    from data_jobs.config import InstancesConfig, ShardConfig, VocabConfig

    wiki = shared_data / "corpus" / "wikipedia_mlperf" / "wiki_00"  # 37 real Wikipedia articles
    shard_job.run(ShardConfig(inputs=[str(wiki)], input_format="wikiextractor", output_dir=str(tmp_path / "docs"),
                              num_shards=2, num_workers=1))
    vocab_job.run(VocabConfig(vocab_file=str(bert_uncased_vocab), output_dir=str(tmp_path / "vocab")))
    instances_job.run(InstancesConfig(shards_dir=str(tmp_path / "docs"), vocab_dir=str(tmp_path / "vocab"),
                                      output_dir=str(tmp_path / "inst"), max_seq_length=64, dupe_factor=1,
                                      max_predictions_per_seq=10, num_workers=1))
    result = run(_config(tmp_path / "inst", tmp_path / "run", max_steps=60, save_every=60, log_every=5,
                         micro_batch_size=16, grad_accum_steps=1, lr=5e-3, warmup_proportion=0.1, dropout=0.0))
    records = read_metrics(result.metrics_file)
    start = records[0]["mlm_loss"]
    end = sum(r["mlm_loss"] for r in records[-3:]) / 3
    assert start > 9.5 and end < start - 2.0, (start, end)


@pytest.mark.parametrize("name", ["metrics.jsonl", "notes.txt"])
def test_user_file_in_a_fresh_run_dir_is_refused_and_untouched(data, tmp_path, capsys, name):
    """A fresh run writes metrics.jsonl (and only its own names): a user's file there is refused before
    anything is written, in one line naming it, and keeps its bytes."""
    out = tmp_path / "run"
    out.mkdir()
    body = b'{"step": 1, "loss": 0.5, "mine": true}\n'
    (out / name).write_bytes(body)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"data_dir": str(data), "output_dir": str(out), "micro_batch_size": 4,
                                   "max_steps": 2, "save_every": 1, "tensorboard": False}))
    code, line = _cli(capsys, ["--config", str(cfg)])
    assert code == 2 and line.startswith("bertflow: error: output_dir: ") and name in line, line
    assert (out / name).read_bytes() == body
    assert sorted(p.name for p in out.iterdir()) == [name]  # no run config, no checkpoint, no lock
