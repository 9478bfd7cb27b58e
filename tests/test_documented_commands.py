"""The commands README.md and docs/ print, run exactly as written (issue 10): read from the documents
themselves, so an edit that breaks one fails here.

- README's "A typical run by hand" data lines, from a directory whose ``../shared/data`` is a tiny copy
  of the real corpus (same files, cut short), then train (with ``--max-steps 2`` appended: later flags
  win) and export;
- README's ``bertflow submit --runtime-env cluster/ray/runtime_env.yaml -- python -m data_jobs.instances_job
  --config inst.yaml`` on a real local Ray head with token authentication (``RAY_ADDRESS`` set as a
  user would); the same command refusing, in one line and before any upload, a working directory
  holding a 20 MB file; a failing job's exit code passed through; README's object-storage submit of the
  shard job (inputs and output on a real S3-compatible server, the node holding the credentials), its
  shards byte for byte those of the same job on local files; docs/scaling.md's
  ``ray get-auth-token --generate`` in a fresh HOME;
- the nightly schedule's switch-on and switch-off commands of docs/flows.md and prefect.yaml against a
  real Prefect server whose scheduler runs every second.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "scale"))
sys.path.insert(0, str(REPO / "tests" / "flows"))

from scale_support import BIN, RayCluster, base_env  # noqa: E402
from hang import HANG_S  # noqa: E402  (the suite's one hang guard)

pytestmark = [pytest.mark.slow, pytest.mark.shared_data]

README = (REPO / "README.md").read_text()


def _block_after(text: str, marker: str) -> list[str]:
    """The commands of the first ```bash block after ``marker`` (continuation lines joined)."""
    start = text.index(marker)
    block = text[text.index("```bash", start) + 7:text.index("```", text.index("```bash", start) + 7)]
    return [c.strip() for c in block.replace("\\\n", " ").splitlines() if c.strip() and not c.startswith("#")]


def _run(cmd: str, cwd: Path, env: dict, timeout: float = HANG_S) -> subprocess.CompletedProcess:
    proc = subprocess.run(["bash", "-c", cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{cmd}\nrc {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return proc


def _head_lines(src: Path, dst: Path, lines: int, end: str | None = None) -> None:
    """The first ``lines`` lines of ``src`` (extended to the next ``end`` line, e.g. ``</doc>``)."""
    out = []
    with open(src, encoding="utf-8", errors="replace") as fh:
        for i, line in enumerate(fh):
            out.append(line)
            if i >= lines and (end is None or line.strip() == end):
                break
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_text("".join(out), encoding="utf-8")


@pytest.fixture(scope="module")
def tiny_shared(shared_data, tmp_path_factory) -> Path:
    """``work/`` whose ``../shared/data`` holds cut-short copies of the corpus files the README names."""
    root = tmp_path_factory.mktemp("docs")
    data = root / "shared" / "data"
    for f in sorted((shared_data / "corpus" / "wikipedia_mlperf").iterdir())[:2]:
        _head_lines(f, data / "corpus" / "wikipedia_mlperf" / f.name, 300, end="</doc>")
    for f in sorted((shared_data / "corpus" / "gutenberg").iterdir())[:2]:
        _head_lines(f, data / "corpus" / "gutenberg" / f.name, 600)
    (data / "vocab").mkdir(parents=True)
    shutil.copy(shared_data / "vocab" / "bert-base-uncased-vocab.txt", data / "vocab")
    (root / "work").mkdir()
    return root / "work"


def _setup_line() -> str:
    """README's set-up command, as written; its `make install` part is what `make test` already did."""
    (line,) = _block_after(README, "The set-up for every command")
    make, activate = line.split(" && ", 1)
    assert make == "make install" and activate.startswith(". .venv/bin/activate"), line
    return activate.split("#")[0].strip()


def test_readme_run_by_hand(tiny_shared):
    """Each command pasted into a shell at the repository root after the set-up (here: then `cd` to a work
    directory whose ../shared/data is a tiny copy): PATH holds no bertflow before the set-up."""
    if not (REPO / ".venv" / "bin" / "activate").is_file():
        pytest.skip("the README's set-up makes .venv at the repository root; this run uses another environment")
    env = base_env()
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if not Path(p, "bertflow").exists())
    setup = f"cd {shlex.quote(str(REPO))} && {_setup_line()} && cd {shlex.quote(str(tiny_shared))} && "
    cmds = _block_after(README, "A typical run by hand")
    assert cmds[0].startswith("bertflow data shard") and any(c.startswith("bertflow train") for c in cmds)
    for cmd in cmds:
        if cmd.startswith("bertflow eval"):
            continue  # evaluation is covered by tests/evaluation (GLUE fine-tuning takes minutes)
        if cmd.startswith("bertflow train"):
            cmd += " --max-steps 2 --save-every 2"
        _run(setup + cmd, tiny_shared, env, timeout=HANG_S)
    assert (tiny_shared / "runs" / "inst128" / "manifest.json").is_file()
    assert (tiny_shared / "runs" / "hf-mini" / "config.json").is_file()
    # Everything landed under runs/ (ignored by git and by the Ray upload): nothing else in the work dir.
    assert sorted(p.name for p in tiny_shared.iterdir()) == ["runs"]


class _Head(RayCluster):
    def start_worker(self) -> None:  # one node is enough here
        pass


@pytest.fixture(scope="module")
def ray_head(tmp_path_factory, s3_server):
    pytest.importorskip("ray")
    head = _Head(tmp_path_factory.mktemp("rayhead"))
    head.env.update(s3_server.env())  # the node's credentials for the object store, set where `ray start` runs
    try:
        yield head.start()
    finally:
        head.stop()


SUBMIT = re.search(r"`(bertflow submit --runtime-env cluster/ray/runtime_env.yaml -- python -m "
                   r"data_jobs.instances_job --config inst.yaml)`", README).group(1)


def _jobs(head) -> list[str]:
    code = ("from ray.job_submission import JobSubmissionClient as C; "
            f"print('JOBS', *[j.submission_id for j in C('http://127.0.0.1:{head.dashboard_port}').list_jobs()])")
    proc = subprocess.run([sys.executable, "-c", code], env=head.env, capture_output=True, text=True, timeout=HANG_S)
    line = [x for x in proc.stdout.splitlines() if x.startswith("JOBS")]
    assert line, proc.stderr[-2000:]
    return line[0].split()[1:]


def test_readme_ray_job_submit_instances(ray_head, tiny_shared, tmp_path):
    docs = tiny_shared / "runs" / "docs"
    if not (docs / "manifest.json").is_file():
        pytest.skip("needs the documents of test_readme_run_by_hand")
    out = tmp_path / "inst_ray"
    # The job runs in a copy of the working directory: its config lies there, with absolute paths.
    cfg = REPO / "inst.yaml"
    cfg.write_text(f"shards_dir: {docs}\nvocab_dir: {tiny_shared / 'runs' / 'vocab'}\noutput_dir: {out}\n"
                   "max_seq_length: 64\ndupe_factor: 1\n")
    try:
        env = {**ray_head.env, "RAY_ADDRESS": f"http://127.0.0.1:{ray_head.dashboard_port}"}
        proc = _run(SUBMIT, REPO, env)
    finally:
        cfg.unlink()
    assert "succeeded" in proc.stderr
    assert "documents" in proc.stdout  # the job's own log, streamed
    assert (out / "manifest.json").is_file() and list(out.rglob("*.parquet"))


def test_readme_ray_job_submit_on_object_storage(ray_head, s3_server, tiny_shared, tmp_path, monkeypatch):
    """README's object-storage submit, as written, on a real Ray head whose node holds the credentials of
    a real S3-compatible server: the shard files are byte for byte those of the same job on local files."""
    from contracts.schema import Manifest
    from data_jobs import shard_job
    from data_jobs.config import ShardConfig

    (cmd,) = _block_after(README, "Data on object storage is the main path")
    argv = shlex.split(cmd)
    inputs, out = argv[argv.index("--inputs") + 1], argv[argv.index("--output-dir") + 1]
    bucket = inputs.split("/")[2]
    assert inputs == f"s3://{bucket}/raw/" and out == f"s3://{bucket}/docs"
    client = s3_server.client()
    if bucket not in [b["Name"] for b in client.list_buckets()["Buckets"]]:
        client.create_bucket(Bucket=bucket)
    raw = tiny_shared.parent / "shared" / "data" / "corpus" / "gutenberg"
    for f in sorted(raw.iterdir()):
        client.upload_file(str(f), bucket, f"raw/{f.name}")
    env = {**ray_head.env, "RAY_ADDRESS": f"http://127.0.0.1:{ray_head.dashboard_port}"}
    proc = _run(cmd, REPO, env)
    assert "succeeded" in proc.stderr
    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    remote = Manifest.read(out)
    local = shard_job.run(ShardConfig(inputs=[str(raw)], output_dir=str(tmp_path / "local"),
                                      num_shards=int(argv[argv.index("--num-shards") + 1]), engine="local"))
    assert [(f.name, f.rows, f.sha256) for f in remote.files] == [(f.name, f.rows, f.sha256) for f in local.files]
    assert remote.totals == local.totals and remote.totals["documents_kept"] > 0


def test_submit_refuses_a_big_upload_before_sending_it(ray_head, tmp_path):
    """The README's command in a working directory whose non-excluded folder holds a 20 MB file."""
    work = tmp_path / "work"
    (work / "cluster" / "ray").mkdir(parents=True)
    shutil.copy(REPO / "cluster" / "ray" / "runtime_env.yaml", work / "cluster" / "ray")
    (work / "data").mkdir()
    with open(work / "data" / "big.bin", "wb") as fh:
        fh.write(b"\0" * 20_000_000)
    env = {**ray_head.env, "RAY_ADDRESS": f"http://127.0.0.1:{ray_head.dashboard_port}"}
    before = _jobs(ray_head)
    proc = subprocess.run(["bash", "-c", SUBMIT], cwd=work, env=env, capture_output=True, text=True, timeout=HANG_S)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bertflow: error: cluster/ray/runtime_env.yaml: "), proc.stderr
    assert "data/ 20.0 MB" in lines[0] and "data/big.bin" in lines[0], lines[0]
    assert _jobs(ray_head) == before  # nothing submitted
    # Excluded, the same directory goes: and the job's exit code is the command's.
    (work / ".rayignore").write_text("data/\n")
    proc = subprocess.run(["bash", "-c", SUBMIT.split(" -- ")[0] + " -- python -c 'import sys; sys.exit(3)'"],
                          cwd=work, env=env, capture_output=True, text=True, timeout=HANG_S)
    assert proc.returncode == 3, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "failed (exit code 3)" in proc.stderr and "Traceback" not in proc.stderr
    assert len(_jobs(ray_head)) == len(before) + 1


def test_scaling_ray_get_auth_token(tmp_path):
    text = (REPO / "docs" / "scaling.md").read_text()
    cmd = re.search(r"`(ray get-auth-token --generate)`", text).group(1)
    _run(cmd, REPO, base_env(HOME=str(tmp_path)))
    assert len((tmp_path / ".ray" / "auth_token").read_text().strip()) >= 32


@pytest.fixture(scope="module")
def prefect_api(tmp_path_factory):
    import os

    from flowtest_support import free_port, stop, wait_http

    home = tmp_path_factory.mktemp("prefect_home")
    api = f"http://127.0.0.1:{free_port()}/api"
    env = {**base_env(), "PREFECT_HOME": str(home), "PREFECT_API_URL": api, "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS": "1"}  # the scheduler's pass, every second
    env.pop("PREFECT_PROFILES_PATH", None)
    log = home / "server.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen([str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port",
                                 api.rsplit(":", 1)[1].split("/")[0]], env=env, stdout=fh, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        wait_http(f"{api}/health", proc, 120, log)
        yield env
    finally:
        stop(proc)


def _auto_scheduled_runs(api: str, deployment_id: str) -> int:
    import httpx

    runs = httpx.post(f"{api}/flow_runs/filter", json={"deployments": {"id": {"any_": [deployment_id]}}}).json()
    return sum(1 for r in runs if r["auto_scheduled"] and r["state"]["type"] == "SCHEDULED")


def test_flows_schedule_switch_commands(prefect_api, tmp_path):
    """The nightly deployment ships with its schedule inactive: no run scheduled; the documented
    ``resume`` schedules runs, ``pause`` removes them; ``schedule ls`` says which."""
    import time

    from flowtest_support import deployments_by_name

    flows_md = (REPO / "docs" / "flows.md").read_text()
    lookup, on, off = _block_after(flows_md, "To switch the nightly schedule on")
    assert lookup.startswith("ID=$(prefect deployment schedule ls pretraining-pipeline/scheduled")
    assert on.startswith("prefect deployment schedule resume ") and off.startswith("prefect deployment schedule pause ")
    for cmd in (lookup, on, off):
        assert cmd in (REPO / "prefect.yaml").read_text()  # both documents give the same commands
    env = {**prefect_api, "PATH": f"{BIN}:/usr/bin:/bin"}  # .venv/bin on PATH, as the docs say
    api = env["PREFECT_API_URL"]

    def state() -> tuple[bool, list[bool], int]:
        dep = deployments_by_name(api)["pretraining-pipeline/scheduled"]
        return dep["paused"], [s["active"] for s in dep["schedules"]], _auto_scheduled_runs(api, dep["id"])

    def listed() -> str:
        return _run("prefect deployment schedule ls pretraining-pipeline/scheduled", tmp_path, env).stdout

    _run(f"{BIN / 'bertflow'} deploy --only pretraining-pipeline/scheduled", tmp_path, env, timeout=HANG_S)
    assert "False" in listed() and "True" not in listed()  # what a user sees: inactive
    time.sleep(3)  # three passes of a scheduler that runs every second
    assert state() == (False, [False], 0)  # shipped: registered, nothing scheduled

    _run(f"{lookup}\n{on}", tmp_path, env)  # switch on, exactly as written
    on_at = time.monotonic()
    while state()[2] == 0:
        assert time.monotonic() - on_at < HANG_S, f"no run scheduled {HANG_S:.0f} s after the switch-on command"
        time.sleep(0.5)
    paused, active, runs = state()
    assert (paused, active) == (False, [True]) and runs >= 1
    assert "True" in listed() and "False" not in listed()

    _run(f"{lookup}\n{off}", tmp_path, env)  # switch off again, exactly as written
    assert state() == (False, [False], 0)  # its scheduled runs are deleted with the switch
    assert "False" in listed() and "True" not in listed()
