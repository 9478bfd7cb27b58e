"""Hostile battery cases on a cluster (issue 10): relative paths given to the ``python -m`` job modules
from a user's directory while the Ray cluster runs elsewhere, user errors inside ``ray job submit -- python
-m ...`` (the README's command, against the shared two-node cluster with token auth), and a rank's user
error under torchrun. Checked by hostile_check.verify like every other case.

``ray job submit`` shows the job's log: the one ``bertflow: error:`` line (Ray may print it twice) and
Ray's own exit code 1 for a failed job.
"""
from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import yaml

from hostile_check import CLI, Case
from scale_support import REPO, base_env

sys.path.insert(0, str(REPO / "tests" / "bert_core"))
sys.path.insert(0, str(REPO / "tests" / "data_jobs"))
from instances_helpers import write_documents  # noqa: E402
from train_helpers import write_dataset, write_vocab  # noqa: E402

RJS_RC = 1  # `ray job submit` exits 1 when the job fails
TORCHRUN = ["-m", "bert_core.launch", "--launcher", "torchrun", "--num-workers", "2", "--engine", "deepspeed",
            "--zero-stage", "1", "--micro-batch-size", "2", "--log-every", "1"]


def _plant(p: Path, body: bytes = b"user data, do not touch\n") -> Path:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(body)
    return p


def build(t: Path, holder_pid: int, ray_address: str) -> dict[str, Case]:
    from contracts.lock import LOCK_NAME

    user = t / "user"  # the user's directory, not the cluster's working directory
    docs = write_documents(user / "reldocs", [["Hello world .", "Second sentence ."], ["Another doc ."]] * 4,
                           num_shards=2)
    vocab_txt = write_vocab(t / "vocab.txt", 100)
    subprocess.run([sys.executable, *CLI, "data", "vocab", "--vocab-file", str(vocab_txt), "--output-dir",
                    str(user / "relvocab")], env=base_env(), check=True, capture_output=True, cwd=REPO)
    vocab = user / "relvocab"
    ray = ["--engine", "ray", "--ray-address", ray_address]
    c: dict[str, Case] = {}

    # ---- relative paths from the user's directory: the line names the absolute path they meant
    for flag, value in (("--shards-dir", "no_such_docs"), ("--vocab-dir", "no_such_vocab")):
        args = {"--shards-dir": "reldocs", "--vocab-dir": "relvocab", flag: value}
        c[f"cluster-relative-missing{flag}"] = Case(
            ["-m", "data_jobs.instances_job", *sum(([k, v] for k, v in args.items()), []), "--output-dir",
             "relout_missing", *ray], str(user / value), out=user / "relout_missing", cwd=user, ray=True,
            user=[docs, vocab])
    c["cluster-relative-glob-no-match"] = Case(["-m", "data_jobs.shard_job", "--inputs", "nothing/*.txt",
                                                "--output-dir", "relnone", *ray], "nothing",
                                               out=user / "relnone", cwd=user, ray=True)
    for n, (job, args) in enumerate((
            ("shard_job", ["--inputs", "no_such_corpus", "--output-dir", "o1"]),
            ("shard_job", ["--inputs", "no_such/*.txt", "--output-dir", "o2"]),
            ("vocab_job", ["--shards-dir", "no_such_docs", "--output-dir", "o3"]),
            ("vocab_job", ["--vocab-file", "no_such_vocab.txt", "--output-dir", "o4"]),
            ("instances_job", ["--shards-dir", "no_such_docs", "--vocab-dir", "no_such_vocab", "--output-dir", "o5"]))):
        engine = [] if job == "vocab_job" else ["--engine", "local"]
        c[f"local-relative-missing-{n + 1}-{job}"] = Case(["-m", f"data_jobs.{job}", *args, *engine],
                                                           str(user / "no_such"), out=user / f"o{n + 1}", cwd=user,
                                                           user=[docs, vocab])

    # ---- a rank's user error under torchrun: one line and exit 2, not torchrun's ChildFailedError page
    def no_child_failed(case: Case, res: dict) -> None:
        assert "ChildFailedError" not in res["stdout"] + res["stderr"], res["stderr"][-2000:]
    c["torchrun-rank-user-error"] = Case([*TORCHRUN, "--data-dir", str(t / "no_data"), "--output-dir",
                                          str(t / "torchrun_run"), "--max-steps", "2"], "no_data",
                                         check=no_child_failed)

    # ---- user errors inside `ray job submit --runtime-env cluster/ray/runtime_env.yaml -- python -m ...`
    def rjs(name: str, argv: list[str], expect: str, user_files: list[Path] = ()):
        c[name] = Case(argv, expect, rc=RJS_RC, entry="ray-job-submit", user=list(user_files))

    # One case per job module, and the config path; each of these errors also has a faster case through
    # the CLI or `python -m` elsewhere in the battery (a job submission costs ~6-10 s: the same promise,
    # the same run_main wrapper, so the rest of each module's errors are not resubmitted here).
    o = t / "rjs"
    bad = _plant(t / "bad_utf8.txt", b"Good line here.\n\xff\xfe bad \xc3\x28 line.\n")
    typo = _plant(t / "typo.yaml", yaml.safe_dump({"inputs": [str(bad)], "output_dir": str(o / "typo"),
                                                   "num_shard": 2}).encode())
    rjs("rjs-shard-config-typo", ["-m", "data_jobs.shard_job", "--config", str(typo)], "num_shard")
    d = o / "shard_locked"
    lock = _plant(d / LOCK_NAME, json.dumps({"host": socket.gethostname(), "pid": holder_pid}).encode())
    rjs("rjs-shard-live-lock", ["-m", "data_jobs.shard_job", "--inputs", str(bad), "--output-dir", str(d)],
        "in use by another run", [lock])
    d = o / "vocab_user"
    mine = _plant(d / "vocab.txt", b"[PAD]\nmy own vocab\n")
    rjs("rjs-vocab-user-vocab-txt", ["-m", "data_jobs.vocab_job", "--vocab-file", str(vocab_txt), "--output-dir",
                                     str(d)], "vocab.txt", [mine])
    d = o / "inst_foreign"
    part = _plant(d / "part-00000-len0032.parquet")
    inst = ["-m", "data_jobs.instances_job", "--shards-dir", str(docs), "--vocab-dir", str(vocab)]
    rjs("rjs-instances-foreign-part", [*inst, "--output-dir", str(d)], "part-00000-len0032.parquet", [part])
    rjs("rjs-train-missing-data-dir", ["-m", "bert_core.train", "--data-dir", str(t / "no_data"), "--output-dir",
                                       str(o / "train"), "--max-steps", "1"], "no_data")

    # ---- more `python -m` entry points: training, evaluation, inspect
    data = write_dataset(t / "data", n=16, vocab_size=100, max_seq=32)
    c["python-m-train-lr-inf"] = Case(["-m", "bert_core.train", "--data-dir", str(data), "--output-dir",
                                       str(t / "pm_train_inf"), "--max-steps", "1", "--lr", "inf"], "lr")
    c["python-m-train-missing-data-dir"] = Case(["-m", "bert_core.train", "--data-dir", str(t / "no_data"),
                                                 "--output-dir", str(t / "pm_train"), "--max-steps", "1"], "no_data")
    plain = _plant(t / "plain_dir" / "notes.txt", b"my notes\n").parent
    c["python-m-eval-intrinsic-not-a-model"] = Case(["-m", "evaluation.cli", "intrinsic", "--model", str(plain),
                                                     "--instances-dir", str(data), "--no-ray", "--output-dir",
                                                     str(t / "pm_eval")], "not a model")
    c["python-m-eval-unknown-task"] = Case(["-m", "evaluation.cli", "glue", "--tasks", "RTX", "--model", str(plain),
                                            "--glue-dir", str(plain), "--output-dir", str(t / "pm_glue")], "RTX")
    c["python-m-inspect-missing-dir"] = Case(["-m", "data_jobs.inspect", str(t / "nope")], str(t / "nope"))
    return c


IDS = [
    "cluster-relative-missing--shards-dir", "cluster-relative-missing--vocab-dir", "cluster-relative-glob-no-match",
    *[f"local-relative-missing-{n}-{job}" for n, job in enumerate(
        ("shard_job", "shard_job", "vocab_job", "vocab_job", "instances_job"), 1)],
    "torchrun-rank-user-error",
    "rjs-shard-config-typo", "rjs-shard-live-lock", "rjs-vocab-user-vocab-txt", "rjs-instances-foreign-part",
    "rjs-train-missing-data-dir",
    "python-m-train-lr-inf", "python-m-train-missing-data-dir", "python-m-eval-intrinsic-not-a-model",
    "python-m-eval-unknown-task", "python-m-inspect-missing-dir",
]
