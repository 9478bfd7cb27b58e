"""What ``ray job submit`` uploads as a runtime env's ``working_dir`` (issue 27):

- ``flows.upload`` lists exactly the files Ray 2.60 itself zips (its own packaging code builds the
  zip here: excludes, nested ``.gitignore``/``.rayignore``, a symlinked folder, with and without
  ``.gitignore``), and refuses a big upload in one line naming what is big;
- every location bertflow writes to by default (read from the config models, the CLIs' parsers and
  the shipped configs; README's run by hand) is ignored by git and excluded from the upload by
  ``cluster/ray/runtime_env.yaml``'s ``excludes`` alone; the excludes hold every ``.gitignore`` pattern.
"""
from __future__ import annotations

import importlib
import re
import shlex
import subprocess
import zipfile
from pathlib import Path

import pydantic
import pytest
import yaml

from contracts.common import UserError
from flows.upload import check_runtime_env, upload_files

REPO = Path(__file__).resolve().parents[2]
RUNTIME_ENV = REPO / "cluster" / "ray" / "runtime_env.yaml"


def ray_zip(root: Path, excludes: list[str], include_gitignore: bool, tmp: Path) -> set[str]:
    """The files of the package Ray 2.60 builds for ``working_dir: root`` (its own code, not a copy)."""
    from ray._private.runtime_env.packaging import _zip_files

    out = tmp / f"pkg-{len(list(tmp.glob('pkg-*')))}.zip"
    _zip_files(str(root), excludes, str(out), include_gitignore=include_gitignore)
    with zipfile.ZipFile(out) as z:
        return {n for n in z.namelist() if not n.endswith("/")}


def _write(root: Path, rel: str, data: bytes = b"x") -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)


@pytest.fixture
def tree(tmp_path) -> Path:
    root = tmp_path / "wd"
    for rel in ("a.py", "pkg/mod.py", "pkg/data.parquet", "runs/x/ckpt.bin", "out/docs/s.parquet", "out/docs/m.json",
                "hf/mini/model.safetensors", "src/hf/keep.py", "src/out/keep.txt", "deep/runs/keep.txt",
                "sub/keep.txt", "sub/local.tmp", "sub/inner/local.tmp", "sub/inner/x.log", "notes.log",
                "cache/__pycache__/m.pyc", "ray_only/a.txt", "ray_only/b.txt"):
        _write(root, rel)
    (root / "empty").mkdir()
    _write(root, ".gitignore", b"*.log\n/hf/\n")
    _write(root, "sub/.gitignore", b"*.tmp\n!inner/\n")
    _write(root, "ray_only/.rayignore", b"b.txt\n")
    (root / "linked").symlink_to(root / "pkg", target_is_directory=True)
    return root


@pytest.mark.parametrize("include_gitignore", [True, False])
@pytest.mark.parametrize("excludes", [[], ["runs", "*.parquet", "/out/", "__pycache__/"], ["pkg/"]])
def test_upload_files_are_what_ray_zips(tree, tmp_path, excludes, include_gitignore):
    ours = dict(upload_files(tree, excludes, include_gitignore))
    assert set(ours) == ray_zip(tree, excludes, include_gitignore, tmp_path)
    assert ("notes.log" in ours) is not include_gitignore  # the cases differ where they should
    assert "ray_only/b.txt" not in ours and "ray_only/a.txt" in ours  # .rayignore always applies
    assert all(size == (tree / rel).stat().st_size for rel, size in ours.items())


def test_gitignore_is_honoured_unless_ray_is_told_not_to(tree, monkeypatch):
    monkeypatch.delenv("RAY_RUNTIME_ENV_IGNORE_GITIGNORE", raising=False)
    assert "notes.log" not in dict(upload_files(tree))
    monkeypatch.setenv("RAY_RUNTIME_ENV_IGNORE_GITIGNORE", "1")
    assert "notes.log" in dict(upload_files(tree))


def test_big_upload_refused_in_one_line_naming_it(tmp_path):
    wd = tmp_path / "wd"
    _write(wd, "a.py", b"print(1)\n")
    for rel, size in (("stuff/big.bin", 20_000_000), ("runs/huge.bin", 200_000_000)):
        (wd / rel).parent.mkdir()
        with open(wd / rel, "wb") as fh:
            fh.truncate(size)  # sparse: that size as Ray would zip it, no disk spent
    env = {"working_dir": str(wd), "excludes": ["runs"]}
    with pytest.raises(UserError) as err:
        check_runtime_env(env, "env.yaml")
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("env.yaml: working_dir ")
    assert "20.0 MB" in msg and "stuff/ 20.0 MB" in msg and "stuff/big.bin" in msg, msg
    assert "a.py" not in msg and "runs" not in msg.split("move outputs under")[0], msg
    assert "add them to excludes in env.yaml" in msg
    # Under the limit (or excluded) it passes and says how much.
    assert check_runtime_env(env, "env.yaml", limit_mb=25).total == 20_000_000 + len(b"print(1)\n")
    assert check_runtime_env({**env, "excludes": ["runs", "stuff/"]}, "env.yaml").files == 1
    # Nothing local to upload: nothing to check.
    assert check_runtime_env({"env_vars": {"A": "1"}}) is None
    assert check_runtime_env({"working_dir": "s3://bucket/pkg.zip"}) is None
    with pytest.raises(UserError, match=r"^env.yaml: excludes: expected a list"):
        check_runtime_env({"working_dir": str(wd), "excludes": "runs"}, "env.yaml")
    with pytest.raises(UserError, match=r"^env.yaml: working_dir nowhere: no such directory"):
        check_runtime_env({"working_dir": "nowhere"}, "env.yaml", cwd=tmp_path)


def test_the_repository_upload_is_small():
    env = yaml.safe_load(RUNTIME_ENV.read_text())
    summary = check_runtime_env(env, str(RUNTIME_ENV), cwd=REPO)
    assert summary is not None and 0 < summary.total < 10e6
    assert "flows/upload.py" in dict(upload_files(REPO, env["excludes"]))


# ---------------------------------------------------------------- default output locations

def _gitignore_patterns() -> list[str]:
    lines = (REPO / ".gitignore").read_text().splitlines()
    return [x.strip() for x in lines if x.strip() and not x.startswith("#")]


def test_excludes_hold_every_gitignore_pattern(tmp_path):
    """Ray reads .gitignore unless RAY_RUNTIME_ENV_IGNORE_GITIGNORE=1; the excludes say it all again, so
    either way the same paths stay home. Checked literally and by what Ray zips from the excludes alone."""
    excludes = yaml.safe_load(RUNTIME_ENV.read_text())["excludes"]
    patterns = _gitignore_patterns()
    assert {"runs/", "/out/", "/hf/", "outputs/"} <= set(patterns)
    assert set(patterns) <= set(excludes), set(patterns) - set(excludes)
    # One sample path per pattern (a file inside a folder pattern), plus code that must travel.
    samples = {p: p.lstrip("/").replace("*", "x") + ("f" if p.endswith("/") else "") for p in patterns}
    root = tmp_path / "wd"
    for rel in [*samples.values(), "flows/cli.py", "data_jobs/x.py"]:
        _write(root, rel)
    zipped = ray_zip(root, excludes, include_gitignore=False, tmp=tmp_path)
    assert zipped == {"flows/cli.py", "data_jobs/x.py"}, zipped
    ignored = subprocess.run(["git", "check-ignore", "--no-index", "--stdin"], cwd=REPO, capture_output=True,
                             text=True, input="\n".join(samples.values()) + "\n").stdout.split()
    assert set(ignored) == set(samples.values())


def _model_output_defaults() -> tuple[dict[str, str], list[str]]:
    """({where: default location}, [output fields with no default]) of every config model."""
    defaults, required = {}, []
    for name in ("data_jobs.config", "bert_core.train_config", "evaluation.config", "flows.config",
                 "flows.recipe_config"):
        mod = importlib.import_module(name)
        for cls in vars(mod).values():
            if not (isinstance(cls, type) and issubclass(cls, pydantic.BaseModel) and cls.__module__ == name):
                continue
            for field, info in cls.model_fields.items():
                if not re.fullmatch(r"output_\w+|out|\w+_root", field):
                    continue
                where = f"{name}.{cls.__name__}.{field}"
                if info.is_required():
                    required.append(where)
                else:
                    defaults[where] = str(info.get_default(call_default_factory=True))
    return defaults, required


def _shipped_config_outputs() -> dict[str, str]:
    """output_root / output_dir of the configs the repository ships (recipes, deployments, clusters)."""
    out = {}

    def walk(node, where):
        if isinstance(node, dict):
            for k, v in node.items():
                if k in ("output_root", "output_dir") and isinstance(v, str):
                    out[f"{where}: {k} {v}"] = v
                walk(v, where)
        elif isinstance(node, list):
            for v in node:
                walk(v, where)

    for f in [REPO / "prefect.yaml", *sorted((REPO / "recipes").glob("*.yaml")),
              *sorted((REPO / "cluster").rglob("*.yaml"))]:
        walk(yaml.safe_load(f.read_text()), str(f.relative_to(REPO)))
    return out


def _readme_outputs() -> dict[str, str]:
    text = (REPO / "README.md").read_text()
    start = text.index("A typical run by hand")
    block = text[text.index("```bash", start):text.index("```", text.index("```bash", start) + 7)]
    out = {}
    for cmd in block.replace("\\\n", " ").splitlines()[1:]:
        argv = shlex.split(cmd)
        for flag in ("--output-dir", "--out"):
            if flag in argv:
                out[f"README: {cmd[:40]}..."] = argv[argv.index(flag) + 1]
    return out


def default_output_locations() -> dict[str, str]:
    from flows import deploy, demo
    from flows.config import demo_config
    from flows.pipeline import load_pipeline_config

    defaults, required = _model_output_defaults()
    # Not vacuous: the stage configs' outputs are required (no default), the pipeline's root has one.
    assert {"data_jobs.config.ShardConfig.output_dir", "bert_core.train_config.TrainConfig.output_dir",
            "evaluation.config.GlueConfig.output_dir"} <= set(required), required
    assert "flows.config.PipelineConfig.output_root" in defaults, defaults
    defaults["python -m flows.demo / make demo"] = demo._parser().parse_args([]).output_root
    defaults["flows.config.demo_config"] = demo_config().output_root
    defaults["bertflow pipeline without --config"] = load_pipeline_config(None).output_root
    defaults["bertflow deploy without --config"] = deploy.DEFAULT_OUTPUT_ROOT
    return {**defaults, **_shipped_config_outputs()}


def test_export_and_import_have_no_default_output():
    from bert_core.export import _export_cli, _import

    for cli, argv in ((_export_cli, ["--checkpoint", "x"]), (_import, ["--hf-dir", "x"])):
        with pytest.raises(UserError, match="--out"):
            cli(argv)


def test_default_outputs_are_ignored_by_git_and_the_upload(tmp_path):
    current = {**default_output_locations(), **_readme_outputs()}
    # Relative (they land in the working directory, the one uploaded), and all under runs/.
    assert all(not Path(p).is_absolute() and p.startswith("runs/") for p in current.values()), current
    older = {"older README: out/": "out/docs", "older README: hf/": "hf/mini"}
    samples = {f"{p.rstrip('/')}/x.bin": where for where, p in {**current, **older}.items()}
    ignored = subprocess.run(["git", "check-ignore", "--no-index", "--stdin"], cwd=REPO, capture_output=True,
                             text=True, input="\n".join(samples) + "\n").stdout.split()
    assert set(ignored) == set(samples), {samples[s] for s in set(samples) - set(ignored)}
    root = tmp_path / "wd"
    for rel in [*samples, "flows/cli.py"]:
        _write(root, rel)
    excludes = yaml.safe_load(RUNTIME_ENV.read_text())["excludes"]
    assert ray_zip(root, excludes, include_gitignore=False, tmp=tmp_path) == {"flows/cli.py"}
    (root / ".gitignore").write_text((REPO / ".gitignore").read_text())
    assert ray_zip(root, [], include_gitignore=True, tmp=tmp_path) == {"flows/cli.py", ".gitignore"}


# ---------------------------------------------------------------- bertflow submit: its user errors

@pytest.mark.parametrize("argv, error", [
    (["--runtime-env", "nope.yaml", "--", "python", "-c", "pass"], "nope.yaml: config file not found"),
    (["--runtime-env", "RUNTIME_ENV"], "entrypoint: missing: bertflow submit [options] -- python -m data_jobs."),
    (["--max-upload-mb", "x", "--", "python"], "--max-upload-mb: invalid float value: 'x'"),
    (["--working-dir", "WD", "--address", "http://127.0.0.1:PORT", "--", "python", "-c", "pass"],
     "ray job address http://127.0.0.1:PORT: cannot connect"),
])
def test_submit_user_errors_are_one_line(argv, error, tmp_path, capsys):
    from flows.cli import main
    from free_ports import free_port

    port = str(free_port())
    (tmp_path / "a.py").write_text("pass\n")
    subst = {"RUNTIME_ENV": str(RUNTIME_ENV), "WD": str(tmp_path)}
    argv = [subst.get(a, a).replace("PORT", port) for a in argv]
    assert main(["submit", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"bertflow: error: {error.replace('PORT', port)}"), err
    assert not any(line.startswith("bertflow: error:") for line in err[:-1]) and "Traceback" not in "".join(err)


def test_flows_submission_path_checks_before_sending(tmp_path):
    """ray_jobs._submit (the flows' and bertflow submit's one call of submit_job) refuses first: with no
    client at all it never gets as far as using one."""
    from flows.ray_jobs import _submit

    with open(tmp_path / "big.bin", "wb") as fh:
        fh.truncate(11_000_000)
    with pytest.raises(UserError, match=r"^runtime env: working_dir \S+ would upload 11.0 MB .*big.bin"):
        _submit(None, "python -c pass", "sid", {}, print, runtime_env={"working_dir": str(tmp_path)})
