"""The one launcher (bert_core.launch): what each launcher starts, combinations refused when the config
is loaded, and a rank's one-line error surfacing as one line through torchrun."""
from __future__ import annotations

from pathlib import Path

import pytest

from bert_core import launch
from bert_core.train_config import TrainConfig
from contracts.common import UserError, build_config

BASE = {"data_dir": "d", "output_dir": "o"}


@pytest.mark.parametrize("fields, problem", [
    ({"launcher": "ray", "num_workers": 2}, "launcher ray with num_workers > 1 needs engine deepspeed"),
    ({"launcher": "torchrun", "num_workers": 2}, "needs engine deepspeed"),
    ({"launcher": "torchrun", "hostfile": "h"}, "hostfile needs launcher deepspeed"),
])
def test_impossible_launches_are_refused_when_loaded(fields, problem):
    with pytest.raises(UserError, match=problem):
        build_config(TrainConfig, {**BASE, **fields})
    build_config(TrainConfig, {**BASE, **fields, "engine": "deepspeed", "hostfile": None,
                               "launcher": "deepspeed" if "hostfile" in fields else fields["launcher"]})


def test_pipeline_config_refuses_them_too():
    from flows.config import PipelineConfig

    data = {"shard": {"inputs": ["builtin:python-docs"]},
            "phases": [{"name": "p1", "instances": {}, "train": {"launcher": "ray", "num_workers": 2}}]}
    with pytest.raises(UserError, match=r"phases\[p1\].train: .*needs engine deepspeed"):
        build_config(PipelineConfig, data)


def test_commands_of_each_launcher(tmp_path):
    cfg = build_config(TrainConfig, {**BASE, "engine": "deepspeed", "launcher": "torchrun", "num_workers": 3})
    cmd = launch.command(cfg, tmp_path / "c.json", resume=True)
    assert Path(cmd[0]).name == "torchrun" and "--nproc_per_node=3" in cmd
    assert cmd[-4:] == ["-m", "bert_core.rank", str(tmp_path / "c.json"), "--resume"]
    assert launch.command(cfg, tmp_path / "c.json", resume="previous-good")[-2:] == ["--resume", "previous-good"]
    ds = launch.command(cfg.model_copy(update={"launcher": "deepspeed"}), tmp_path / "c.json", resume=False)
    assert "--num_accelerators=3" in ds and ds[ds.index("--module") + 1:] == ["bert_core.rank", str(tmp_path / "c.json")]
    multi = launch.command(cfg.model_copy(update={"launcher": "deepspeed", "hostfile": "hosts"}), tmp_path / "c.json", False)
    assert multi[1:3] == ["--hostfile", "hosts"] and not any(a.startswith("--num_accelerators") for a in multi)


def test_a_rank_error_through_torchrun_is_one_line(tmp_path, monkeypatch):
    """torchrun turns a rank's exit 2 into exit 1 plus a page of ChildFailedError: the launcher keeps
    the rank's own one-line error."""
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    cfg = build_config(TrainConfig, {"data_dir": str(tmp_path / "missing"), "output_dir": str(tmp_path / "run"),
                                     "engine": "deepspeed", "launcher": "torchrun", "num_workers": 1})
    lines: list[str] = []
    with pytest.raises(UserError, match="missing") as err:
        launch.launch(cfg, log=lines.append)
    assert "\n" not in str(err.value) and lines[0].startswith("launching: ")
    assert not (tmp_path / "run").exists()


def test_the_rank_entry_point_reads_back_every_field_and_refuses_a_bad_file(tmp_path, capsys):
    """bert_core.rank: the launcher's JSON round-trips the config exactly; a damaged file is one line."""
    from bert_core import rank

    cfg = build_config(TrainConfig, {**BASE, "engine": "deepspeed", "launcher": "torchrun", "num_workers": 2,
                                     "model_overrides": {"hidden_dropout_prob": 0.05}, "lr": 3e-4})
    rank.write_config(cfg, tmp_path / "c.json")
    assert rank.read_config(str(tmp_path / "c.json")) == cfg
    (tmp_path / "bad.json").write_text('{"data_dir": "d", "output_dir": "o", "lr": "fast"}')
    (tmp_path / "list.json").write_text("[1, 2]")
    for name in ("bad.json", "list.json", "missing.json"):
        assert rank.main([str(tmp_path / name)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("bertflow: error: ") and name in err[0], err


def test_a_multi_node_run_on_s3_reads_its_launch_config_from_the_store(s3_env):
    """Ranks on several nodes share no file system: for an s3:// run the launch config goes beside the
    run on the store (every node reads it there) and round-trips every field."""
    from bert_core import rank

    cfg = build_config(TrainConfig, {"data_dir": f"{s3_env}/instances", "output_dir": f"{s3_env}/runs/large/",
                                     "engine": "deepspeed", "launcher": "deepspeed", "hostfile": "hosts"})
    where = rank.beside(cfg.output_dir)
    assert where == f"{s3_env}/runs/.large.launch.json"
    rank.write_config(cfg, where)
    assert rank.read_config(where) == cfg
    cmd = launch.command(cfg, where, resume=False)
    assert cmd[1:3] == ["--hostfile", "hosts"] and cmd[-2:] == ["bert_core.rank", where]
    with pytest.raises(UserError, match=rf"^{s3_env}/runs/.none.launch.json: cannot read the launch config"):
        rank.read_config(f"{s3_env}/runs/.none.launch.json")
