"""An evaluation's output directory is its own only as far as its records say (evaluation.runner over
contracts.stage): a user's report.md, results.json or notes there are refused with one line, exit 2,
and left byte for byte, before any model is loaded. Fast: the refusal comes before the evaluation runs."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from evaluation import runner
from evaluation.cli import main as eval_main
from evaluation.config import IntrinsicConfig

BODY = b"# my own report\nkeep me\n"


def _argv(out: Path, tmp_path: Path) -> list[str]:
    return ["intrinsic", "--model", str(tmp_path / "model"), "--instances-dir", str(tmp_path / "heldout"),
            "--output-dir", str(out), "--no-ray", "--no-progress"]


@pytest.mark.parametrize("name", ["report.md", "results.json", "notes.txt"])
def test_user_file_in_a_fresh_eval_dir_is_refused_and_untouched(tmp_path, capsys, name):
    out = tmp_path / "eval"
    out.mkdir()
    (out / name).write_bytes(BODY)
    assert eval_main(_argv(out, tmp_path)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("bertflow: error: ") and name in err[0], err
    assert "files no evaluation wrote" in err[0]
    assert (out / name).read_bytes() == BODY
    assert sorted(p.name for p in out.iterdir()) == [name]  # no record, no lock, nothing else


def test_user_file_beside_a_finished_evaluation_is_refused(tmp_path, capsys):
    """Our own earlier results are ours to redo; a user's file put beside them is not."""
    out = tmp_path / "eval"
    cfg = IntrinsicConfig(model_path=str(tmp_path / "model"), instances_dir=str(tmp_path / "heldout"),
                          output_dir=str(out), use_ray=False, show_progress=False)
    sd = runner.stage_dir("intrinsic", cfg)
    sd.begin("an earlier config", {}, runner.EVAL_FILES)
    out.joinpath("results.json").write_text("{}")
    out.joinpath("report.md").write_text("ours")
    sd.commit(sd.present(runner.EVAL_FILES), "an earlier config", {})
    assert sd.foreign() == []
    (out / "my_notes.md").write_bytes(BODY)
    assert runner.status("intrinsic", cfg).reason == "config differs"
    assert eval_main(_argv(out, tmp_path)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "my_notes.md" in err[0], err
    assert (out / "my_notes.md").read_bytes() == BODY and (out / "report.md").read_text() == "ours"
    assert json.loads((out / runner.STAGE_RECORD).read_text())["config_hash"] == "an earlier config"


def _pinned_job(n: int) -> dict:
    import torch

    runner.worker_threads(n)
    return {"threads": torch.get_num_threads()}


def test_jobs_in_this_process_give_torch_threads_back(tmp_path):
    """An in-process evaluation pins torch to ``threads_per_task`` inside its jobs, and gives the process
    its count back: what runs next in the same process (a flow's next phase) computes as it would alone."""
    import torch

    cfg = IntrinsicConfig(model_path=str(tmp_path / "model"), instances_dir=str(tmp_path / "heldout"),
                          output_dir=str(tmp_path / "eval"), use_ray=False, show_progress=False)
    before = torch.get_num_threads()
    other = 1 if before != 1 else 2
    try:
        assert runner.run_jobs(_pinned_job, [(other,)], cfg, desc="pin") == [{"threads": other}]
        assert torch.get_num_threads() == before
    finally:
        torch.set_num_threads(before)
