"""The ``bertflow`` dispatch table: every command's --help works; the generated CLIs list every field of
their config model with its doc; argparse errors are one ``bertflow: error:`` line and exit 2."""
from __future__ import annotations

import pytest

from evaluation.config import GlueConfig, IntrinsicConfig, NerConfig, SquadConfig
from bert_core.train_config import TrainConfig
from data_jobs.config import InstancesConfig, MixConfig, ShardConfig, VocabConfig
from flows.cli import COMMANDS, main
from hang import HANG_S  # noqa: E402  (the suite's one hang guard)

GENERATED = {
    ("data", "shard"): ShardConfig, ("data", "vocab"): VocabConfig, ("data", "instances"): InstancesConfig,
    ("data", "mix"): MixConfig,
    ("train",): TrainConfig, ("eval", "glue"): GlueConfig, ("eval", "squad"): SquadConfig,
    ("eval", "ner"): NerConfig, ("eval", "intrinsic"): IntrinsicConfig,
}
SET_IN_YAML = {"model_overrides", "source_weights"}  # mappings


def _help(capsys, argv) -> str:
    with pytest.raises(SystemExit) as stop:
        main([*argv, "--help"])
    assert stop.value.code == 0
    return " ".join(capsys.readouterr().out.split())


def _commands():
    for name, (target, _) in COMMANDS.items():
        if isinstance(target, dict):
            yield from ((name, sub) for sub in target)
        else:
            yield (name,)


@pytest.mark.parametrize("argv", list(_commands()), ids=" ".join)
def test_every_command_has_help(argv, capsys):
    text = _help(capsys, argv)
    assert text.startswith("usage: bertflow " + " ".join(argv) or "usage: ")
    model = GENERATED.get(argv)
    for name, field in (model.model_fields.items() if model else []):
        if name in SET_IN_YAML:
            continue
        assert "--" + name.replace("_", "-") in text, name
        assert " ".join(field.description.split())[:40] in text, name


@pytest.mark.parametrize("argv, problem", [
    (["data", "shard", "--num-shards", "two"], "--num-shards: expected int values, got 'two'"),
    (["train", "--launcher", "slurm"], "--launcher: invalid choice: 'slurm'"),
    (["eval", "glue", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    (["data", "nope"], "unknown command 'data nope'"),
])
def test_argparse_errors_are_one_line(argv, problem, capsys):
    assert main(argv) == 2
    out = capsys.readouterr()
    assert out.err.strip() == f"bertflow: error: {problem}" or (
        out.err.count("\n") == 1 and out.err.startswith("bertflow: error: ") and problem in out.err), out.err
    assert out.out == ""


def test_closed_pipe_is_quiet():
    """`bertflow ... | head`: the reader leaving is no error (no "bertflow: error: Broken pipe", no traceback)."""
    import subprocess
    import sys

    code = ("import sys; from contracts.common import run_main\n"
            "def main(argv):\n    for _ in range(200000):\n        print('line of output')\n    return 0\n"
            "sys.exit(run_main(main))")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.readline() == b"line of output\n"
    proc.stdout.close()  # the reader leaves, as `head -1` does
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=HANG_S) == 141
    assert err == ""


@pytest.mark.parametrize("argv", [["train", "--help"], ["train", "--max-steps", "-3", "--data-dir", "d"],
                                  ["data", "shard", "--help"], ["eval", "glue", "--help"]], ids=" ".join)
def test_help_and_config_errors_import_no_torch(argv):
    """`bertflow train --help` or a config typo answers before torch is imported (1.7 s here of 2 s)."""
    import subprocess
    import sys

    code = ("import atexit, sys; atexit.register(lambda: print('torch' in sys.modules, file=sys.stderr)); "
            "from flows.cli import main; sys.exit(main(sys.argv[1:]))")
    proc = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=HANG_S)
    assert proc.stderr.strip().splitlines()[-1] == "False", proc.stderr
    assert proc.returncode == (0 if "--help" in argv else 2), proc.stderr


def _yaml(path, data: dict):
    import yaml

    path.write_text(yaml.safe_dump(data))
    return path


def test_user_errors_in_glue_and_train_inputs_import_no_torch(tmp_path):
    """An unknown GLUE task, a missing training data dir, an init_from that is no model (here a directory
    holding a file every read of fails, so hashing it would fail instead) or a typo in model_overrides is
    one line before torch is imported (evaluation.inputs, the launcher's checks)."""
    import subprocess
    import sys

    from contracts.common import stable_hash
    from contracts.schema import Manifest

    data, home = tmp_path / "data", tmp_path / "home"
    Manifest(kind="instances", config={}, config_hash=stable_hash({}), files=[], totals={}).write(data)
    home.mkdir()
    (home / "mem").symlink_to("/proc/self/mem")
    train = ["train", "--data-dir", str(data), "--output-dir", str(tmp_path / "run"), "--init-from"]
    code = ("import atexit, sys; atexit.register(lambda: print('torch' in sys.modules, file=sys.stderr)); "
            "from flows.cli import main; sys.exit(main(sys.argv[1:]))")
    for argv, named in ((["eval", "glue", "--tasks", "RTX", "--model", str(tmp_path), "--glue-dir", str(tmp_path),
                          "--output-dir", str(tmp_path / "out")], "unknown GLUE task 'RTX'"),
                        (["train", "--data-dir", str(tmp_path / "nope"), "--output-dir", str(tmp_path / "run")],
                         str(tmp_path / "nope")),
                        ([*train, str(home)], f"init_from: {home}: not a model"),
                        ([*train, str(tmp_path / "gone")], "checkpoint not found"),
                        ([*train[:-1], "--config", str(_yaml(tmp_path / "typo.yaml", {"model_overrides": {"hiden_size": 64}}))],
                         "model_overrides: invalid config: hiden_size: unknown key")):
        proc = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=HANG_S)
        err = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and err[-1] == "False", proc.stderr
        assert len(err) == 2 and err[0].startswith("bertflow: error: ") and named in err[0], proc.stderr
