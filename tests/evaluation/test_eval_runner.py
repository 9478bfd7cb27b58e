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


def _inputs(tmp_path: Path) -> tuple[Path, Path]:
    """(a model path, a held-out dataset) that pass the checks made before the output directory's
    (evaluation.runner.preflight): a directory with a checkpoint's config file, an instances manifest."""
    from contracts.common import stable_hash
    from contracts.schema import Manifest

    model, heldout = tmp_path / "model", tmp_path / "heldout"
    model.mkdir(exist_ok=True)
    (model / "model_config.json").write_text("{}")
    Manifest(kind="instances", config={}, config_hash=stable_hash({}), files=[], totals={}).write(heldout)
    return model, heldout


def _argv(out: Path, tmp_path: Path) -> list[str]:
    model, heldout = _inputs(tmp_path)
    return ["intrinsic", "--model", str(model), "--instances-dir", str(heldout),
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
    model, heldout = _inputs(tmp_path)
    cfg = IntrinsicConfig(model_path=str(model), instances_dir=str(heldout),
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


def _unreadable(path: Path) -> None:
    """A file every read of fails (EIO): a link to this process's own memory at offset 0."""
    if not Path("/proc/self/mem").exists():
        pytest.skip("needs /proc/self/mem (Linux) for a file that cannot be read")
    path.symlink_to("/proc/self/mem")
    with pytest.raises(OSError):
        path.read_bytes()


def _hf_dir(path: Path) -> Path:
    """What evaluation.inputs.model_format takes for a Hugging Face directory (weights are loaded later)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text("{}")
    return path


def test_a_wrong_directory_is_refused_without_being_read(tmp_path):
    """A model path, held-out dataset or file option pointing at the wrong directory (a home, ``/``) is
    one line, exit 2, before any input is hashed: the directory holds a file no read succeeds on, so a
    command that walked it to hash every file would fail on that read instead."""
    import subprocess
    import sys

    from hang import HANG_S

    wrong = tmp_path / "home"
    (wrong / "projects").mkdir(parents=True)
    (wrong / "projects" / "notes.txt").write_text("mine\n")
    _unreadable(wrong / "projects" / "mem")
    glue = tmp_path / "glue" / "SST-2"
    glue.mkdir(parents=True)
    for name in ("train.tsv", "dev.tsv"):
        (glue / name).write_text("sentence\tlabel\na fine film\t1\n")
    hf, heldout = _hf_dir(tmp_path / "hf"), _inputs(tmp_path)[1]
    out = ["--output-dir", str(tmp_path / "out"), "--no-ray"]
    cases = [
        (["glue", "--model-path", str(wrong), "--glue-dir", str(glue.parent)], f"{wrong}: not a model"),
        (["squad", "--model-path", str(wrong), "--dev-file", str(tmp_path / "dev.json")], f"{wrong}: not a model"),
        (["squad", "--model-path", str(hf), "--dev-file", str(wrong)], f"dev_file: {wrong} is a directory, not a file"),
        (["ner", "--model-path", str(wrong), "--conll-dir", str(tmp_path)], f"{wrong}: not a model"),
        (["intrinsic", "--model-path", str(wrong), "--instances-dir", str(heldout)], f"{wrong}: not a model"),
        (["intrinsic", "--model-path", str(hf), "--instances-dir", str(wrong)], f"{wrong}/manifest.json: no manifest"),
    ]
    for argv, message in cases:
        proc = subprocess.run([sys.executable, "-m", "flows.cli", "eval", *argv, *out], capture_output=True,
                              text=True, timeout=HANG_S, cwd=Path(__file__).resolve().parents[2])
        err = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(err) == 1 and err[0].startswith(f"bertflow: error: {message}"), (argv, err)
    assert sorted(p.name for p in wrong.rglob("*")) == ["mem", "notes.txt", "projects"]
    assert not (tmp_path / "out").exists()


def test_glue_input_identity_is_the_selected_tasks_data(tmp_path):
    """A GLUE evaluation's record names the content of the tasks it runs, as its cells do: another task's
    files may change (or be unreadable) without making a finished evaluation stale, or being read."""
    from evaluation.config import GlueConfig

    for task in ("SST-2", "MNLI"):
        d = tmp_path / "glue" / task
        d.mkdir(parents=True)
        (d / "train.tsv").write_text("sentence\tlabel\na fine film\t1\n")
    cfg = GlueConfig(model_path=str(_hf_dir(tmp_path / "hf")), glue_dir=str(tmp_path / "glue"), tasks=["sst-2"],
                     output_dir=str(tmp_path / "out"))
    before = runner.input_identity(cfg)
    (tmp_path / "glue" / "MNLI" / "train.tsv").write_text("changed\n")
    _unreadable(tmp_path / "glue" / "MNLI" / "mem")
    assert runner.input_identity(cfg) == before
    (tmp_path / "glue" / "SST-2" / "train.tsv").write_text("sentence\tlabel\na dull film\t0\n")
    assert runner.input_identity(cfg)["glue_dir"] != before["glue_dir"]
