"""Hostile battery cases of "never lose or corrupt a user's data" (issue 10), through ``bertflow ...`` and
the ``python -m`` job modules (what ``ray job submit -- python -m ...`` runs).

Covered: the one-writer lock (a live holder, another host's, a half-written one, a stale one of a dead
pid taken over), output ownership (a foreign part-*.parquet, a user's vocab.txt, a user's file in an
export dir), non-finite config numbers and a non-finite loss, the vocab hash at train/resume/export,
and ``--resume previous-good``. Beyond hostile_check.verify, a case may name paths that must not exist
afterwards (no checkpoint of a refused step, not even the output directory).
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Callable, Optional

from hostile_check import CLI, Case
from scale_support import REPO, base_env, write_corpus

sys.path.insert(0, str(REPO / "tests" / "bert_core"))
sys.path.insert(0, str(REPO / "tests" / "data_jobs"))
from instances_helpers import write_documents  # noqa: E402
from train_helpers import write_dataset, write_vocab  # noqa: E402

from contracts.lock import LOCK_NAME  # noqa: E402

TRAIN = ["--max-steps", "2", "--save-every", "1", "--micro-batch-size", "4", "--model", "tiny"]
LOCAL = ["--engine", "local", "--num-workers", "1"]


def _case(argv: list[str], expect: str = "", unfinished: list[Path] = (), untouched: list[Path] = (),
          check: Optional[Callable[[dict], None]] = None, out: Optional[Path] = None) -> Case:
    """A refusal (``expect`` given: exit 2) or a run that must succeed; ``unfinished`` must not exist
    afterwards, ``untouched`` must keep its bytes, ``check`` sees the outcome."""
    def more(case: Case, res: dict) -> None:
        for p in unfinished:
            assert not p.exists(), f"{p} exists after the refusal"
        if check is not None:
            check(res)
    return Case(argv, expect, rc=2 if expect else 0, user=list(untouched), check=more, out=out)


def _lock(d: Path, pid: int, host: str | None = None, raw: str | None = None) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    body = raw if raw is not None else json.dumps({"host": host or socket.gethostname(), "pid": pid})
    (d / LOCK_NAME).write_text(body, encoding="utf-8")
    return d / LOCK_NAME


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid  # reaped: no such process (pid reuse within the test is vanishingly unlikely)


def _user_file(p: Path, body: bytes = b"user data, do not touch\n") -> Path:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(body)
    return p


def _flip(p: Path) -> None:
    """Damage a file in place, same size (what a bad disk or a stray write does)."""
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0xFF
    p.write_bytes(bytes(data))


def _cases(t: Path, holder_pid: int) -> dict[str, Case]:
    corpus = write_corpus(t / "corpus", files=2, docs_per_file=6)
    docs = write_documents(t / "docs", [["Hello world .", "Second sentence ."], ["Another doc ."]] * 4, num_shards=2)
    vocab_txt = write_vocab(t / "vocab.txt", 100)
    vocab_ds = t / "vocab_ds"
    subprocess.run([sys.executable, *CLI, "data", "vocab", "--vocab-file", str(vocab_txt), "--output-dir",
                    str(vocab_ds)], env=base_env(), check=True, capture_output=True, cwd=REPO)
    data = write_dataset(t / "data", n=32, vocab_size=100, max_seq=32)
    run = t / "run"  # one short run (2 checkpoints), copied for each case that needs one
    subprocess.run([sys.executable, *CLI, "train", "--data-dir", str(data), "--output-dir", str(run), *TRAIN],
                   env=base_env(), check=True, capture_output=True, cwd=REPO)
    shard = [*CLI, "data", "shard", "--inputs", str(corpus), "--num-shards", "2", *LOCAL]
    vocab = [*CLI, "data", "vocab", "--vocab-file", str(vocab_txt)]
    inst = [*CLI, "data", "instances", "--shards-dir", str(docs), "--vocab-dir", str(vocab_ds), *LOCAL]
    train = [*CLI, "train", "--data-dir", str(data), *TRAIN]
    cases: dict[str, Case] = {}

    # ---- one writer per output directory: a live holder, another host's lock, a half-written lock
    live = {"shard": shard, "vocab": vocab, "instances": inst, "train": train}
    for name, argv in live.items():
        d = t / f"live_{name}"
        lock = _lock(d, holder_pid)
        cases[f"lock-live-{name}"] = _case([*argv, "--output-dir", str(d)], "in use by another run",
                                          [d / "manifest.json", d / "checkpoints"], [lock])
    d = t / "live_export"
    lock = _lock(d, holder_pid)
    cases["lock-live-export"] = _case([*CLI, "export", "--checkpoint", str(run), "--out", str(d)],
                                     "in use by another run", [d / "export.json", d / "config.json"], [lock])
    d = t / "remote_lock"
    lock = _lock(d, os.getpid(), host="some-other-node")
    cases["lock-other-host"] = _case([*vocab, "--output-dir", str(d)], "another host", [d / "manifest.json"], [lock])
    d = t / "garbled_lock"
    lock = _lock(d, 0, raw='{"host": ')
    cases["lock-half-written"] = _case([*vocab, "--output-dir", str(d)], LOCK_NAME, [d / "manifest.json"], [lock])
    # a holder killed with SIGKILL leaves its lock: taken over, and the run completes and releases it
    for name, argv in {"vocab": vocab, "instances": inst, "shard": shard}.items():
        d = t / f"stale_{name}"
        _lock(d, _dead_pid())

        def stale_ok(proc, d=d):
            assert "taking over the stale lock" in proc["stderr"]
            assert (d / "manifest.json").is_file() and not (d / LOCK_NAME).exists()
        cases[f"lock-stale-{name}"] = _case([*argv, "--output-dir", str(d)], check=stale_ok)

    # ---- output ownership: never delete or overwrite a file no record of ours names
    for fname in ("part-00000-len0032.parquet", "part-00001.done.json", "notes.txt", "_SUCCESS"):
        d = t / f"foreign_inst_{fname}"
        user = _user_file(d / fname)
        cases[f"own-instances-{fname}"] = _case([*inst, "--output-dir", str(d)], fname, [d / "manifest.json"], [user])
    for fname in ("vocab.txt", "README.md"):
        d = t / f"foreign_vocab_{fname}"
        user = _user_file(d / fname, b"[PAD]\nmy own vocab\n")
        cases[f"own-vocab-{fname}"] = _case([*vocab, "--output-dir", str(d)], fname, [d / "manifest.json"], [user])
    d = t / "foreign_export"
    user = _user_file(d / "my_model.bin")
    cases["own-export-user-file"] = _case([*CLI, "export", "--checkpoint", str(run), "--out", str(d)], "my_model.bin",
                                         [d / "export.json", d / "config.json"], [user])
    d = t / "foreign_shard"
    user = _user_file(d / "data.csv")
    cases["own-shard-user-file"] = _case([*shard, "--output-dir", str(d)], str(d), [d / "manifest.json"], [user])
    d = t / "rerun_vocab"  # our own finished output is ours: a rerun is not refused
    shutil.copytree(vocab_ds, d)
    cases["own-vocab-rerun-ok"] = _case([*vocab, "--output-dir", str(d)],
                                       check=lambda proc, d=d: (d / "manifest.json").is_file())

    # ---- non-finite numbers are refused where configs are read
    for flag, value in (("--lr", "inf"), ("--lr", "nan"), ("--lr", "-inf"), ("--eps", "nan"),
                        ("--weight-decay", "inf"), ("--clip-grad-norm", "nan"), ("--warmup-proportion", "nan"),
                        ("--poly-power", "inf")):
        d = t / f"nonfinite{flag}{value}"
        cases[f"finite-train{flag}={value}"] = _case([*train, "--output-dir", str(d), flag, value],
                                                    flag.lstrip("-").replace("-", "_"), [d])
    cfg = t / "lr_nan.yaml"
    cfg.write_text(f"data_dir: {data}\noutput_dir: {t / 'yaml_nan'}\nlr: .nan\n", encoding="utf-8")
    cases["finite-train-yaml-lr-nan"] = _case([*CLI, "train", "--config", str(cfg)], "lr", [t / "yaml_nan"])
    for flag in ("--masked-lm-prob", "--short-seq-prob"):
        d = t / f"nonfinite_inst{flag}"
        cases[f"finite-instances{flag}=nan"] = _case([*inst, "--output-dir", str(d), flag, "nan"],
                                                    flag.lstrip("-").replace("-", "_"), [d / "manifest.json"])

    for name, body, expect in (("model-overrides-nan", "model_overrides: {layer_norm_eps: .nan}\n", "model_overrides"),
                               ("dropout-inf", "dropout: .inf\n", "dropout")):
        cfg = t / f"{name}.yaml"
        cfg.write_text(f"data_dir: {data}\noutput_dir: {t / name}\n{body}", encoding="utf-8")
        cases[f"finite-train-yaml-{name}"] = _case([*CLI, "train", "--config", str(cfg)], expect, [t / name])
    d = t / "lr_overflow"  # 1e400 parses as inf
    cases["finite-train--lr=1e400"] = _case([*train, "--output-dir", str(d), "--lr", "1e400"], "lr", [d])
    cfg = t / "inst_inf.yaml"
    cfg.write_text(f"shards_dir: {docs}\nvocab_dir: {vocab_ds}\noutput_dir: {t / 'inst_inf'}\nmasked_lm_prob: .inf\n")
    cases["finite-instances-yaml-inf"] = _case([*CLI, "data", "instances", "--config", str(cfg), *LOCAL],
                                              "masked_lm_prob", [t / "inst_inf" / "manifest.json"])

    # ---- the `python -m` entry points (what `ray job submit -- python -m ...` runs) hold the same lock
    for mod, argv in (("shard_job", shard[4:]), ("vocab_job", vocab[4:]), ("instances_job", inst[4:])):
        d = t / f"module_live_{mod}"
        lock = _lock(d, holder_pid)
        cases[f"lock-live-python-m-{mod}"] = _case(["-m", f"data_jobs.{mod}", *argv, "--output-dir", str(d)],
                                                  "in use by another run", [d / "manifest.json"], [lock])
    d = t / "module_foreign_instances"
    user = _user_file(d / "part-00000-len0064.parquet")
    cases["own-python-m-instances"] = _case(["-m", "data_jobs.instances_job", *inst[4:], "--output-dir", str(d)],
                                           "part-00000-len0064.parquet", [d / "manifest.json"], [user])
    # --overwrite replaces another config's dataset: only the files its manifest names
    d = t / "shard_overwrite"
    subprocess.run([sys.executable, *shard, "--output-dir", str(d)], env=base_env(), check=True,
                   capture_output=True, cwd=REPO)
    user = _user_file(d / "shard-mine.parquet")
    cases["own-shard-overwrite-keeps-user-file"] = _case(
        [*CLI, "data", "shard", "--inputs", str(corpus), "--num-shards", "3", *LOCAL, "--output-dir", str(d),
         "--overwrite"], untouched=[user], check=lambda proc, d=d: (d / "manifest.json").is_file())
    d = t / "inst_rerun"  # the job's own finished output: a rerun is not refused and changes nothing
    subprocess.run([sys.executable, *inst, "--output-dir", str(d)], env=base_env(), check=True,
                   capture_output=True, cwd=REPO)
    mine = sorted(d.glob("part-*.parquet"))
    cases["own-instances-rerun-ok"] = _case([*inst, "--output-dir", str(d)], untouched=mine,
                                           check=lambda proc, d=d: (d / "manifest.json").is_file())

    # ---- a non-finite loss stops training with one line and never becomes the latest checkpoint
    d = t / "diverge"

    def no_bad_checkpoint(proc, d=d):
        steps = sorted(p.name for p in (d / "checkpoints").glob("step_*"))
        assert steps == ["step_00000001"], steps  # the diverged step 2 was never saved
    cases["nonfinite-loss"] = _case([*train, "--output-dir", str(d), "--lr", "1e30"], "non-finite",
                                    [d / "checkpoints" / "step_00000002"], check=no_bad_checkpoint,
                                    out=d / "checkpoints" / "step_00000002")  # step 1 was finished and kept

    # ---- the vocab hash is checked at train, resume and export
    edited = t / "data_edited"
    shutil.copytree(data, edited)
    (edited / "vocab.txt").write_text((edited / "vocab.txt").read_text().replace("w7\n", "zz\n"), encoding="utf-8")
    d = t / "vocab_edited_run"
    cases["vocab-edited-train"] = _case([*CLI, "train", "--data-dir", str(edited), "--output-dir", str(d), *TRAIN],
                                       "vocab hash", [d / "checkpoints"])
    moved = t / "data_vocab_moved"
    shutil.copytree(data, moved)
    (moved / "vocab.txt").unlink()
    d = t / "vocab_moved_run"
    cases["vocab-moved-train"] = _case([*CLI, "train", "--data-dir", str(moved), "--output-dir", str(d), *TRAIN],
                                      "vocab", [d / "checkpoints"])
    resumed_data, resumed_run = t / "data_resume_edit", t / "run_resume_edit"
    shutil.copytree(data, resumed_data)
    shutil.copytree(run, resumed_run)
    # (the vocab is checked before the run dir's config and inputs: it is what this case is about)
    (resumed_data / "vocab.txt").write_text((resumed_data / "vocab.txt").read_text().replace("w9\n", "yy\n"))
    cases["vocab-edited-resume"] = _case([*CLI, "train", "--data-dir", str(resumed_data), "--output-dir",
                                         str(resumed_run), *TRAIN, "--resume"], "vocab hash",
                                        [resumed_run / "checkpoints" / "step_00000003"])
    exp_run = t / "run_export_edit"
    shutil.copytree(run, exp_run)
    vt = exp_run / "checkpoints" / "step_00000002" / "vocab.txt"
    vt.write_text(vt.read_text().replace("w3\n", "xx\n"))
    d = t / "export_edited"
    cases["vocab-edited-export"] = _case([*CLI, "export", "--checkpoint", str(exp_run), "--out", str(d)],
                                        "vocab.txt", [d / "export.json", d / "config.json"])

    # ---- --resume on a damaged latest names the previous complete one; previous-good uses it
    for name in ("damaged", "previous_good"):
        r = t / f"run_{name}"
        shutil.copytree(run, r)
        target = sorted(p for p in (r / "checkpoints" / "step_00000002").rglob("*") if p.is_file()
                        and p.stat().st_size > 64 and p.name not in ("COMPLETE", "trainer_state.json"))[0]
        _flip(target)
    r = t / "run_damaged"
    cases["resume-damaged-latest"] = _case([*CLI, "train", "--data-dir", str(data), "--output-dir", str(r), *TRAIN,
                                           "--resume"], "previous-good",
                                          check=lambda proc: "step_00000001" in proc["stderr"])
    r = t / "run_previous_good"

    def resumed_from_previous(proc, r=r):
        assert (r / "checkpoints" / "damaged-step_00000002").is_dir()
        assert (r / "checkpoints" / "step_00000002" / "COMPLETE").is_file()
    cases["resume-previous-good"] = _case([*CLI, "train", "--data-dir", str(data), "--output-dir", str(r), *TRAIN,
                                          "--resume", "previous-good"], check=resumed_from_previous)
    r = t / "run_bad_mode"  # a copy of its own: previous-good above writes to its run meanwhile
    shutil.copytree(run, r)
    cases["resume-bad-mode"] = _case([*CLI, "train", "--data-dir", str(data), "--output-dir", str(r), *TRAIN,
                                      "--resume", "yesterday"], "--resume")
    return cases


def build(t: Path, holder_pid: int) -> dict[str, Case]:
    """The cases; ``holder_pid`` is a live process on this host that "holds" the live locks."""
    return _cases(t, holder_pid)


IDS = [  # listed here so that pytest can parametrize before the fixture builds them
    *[f"lock-live-{n}" for n in ("shard", "vocab", "instances", "train", "export")],
    "lock-other-host", "lock-half-written", *[f"lock-stale-{n}" for n in ("vocab", "instances", "shard")],
    *[f"own-instances-{f}" for f in ("part-00000-len0032.parquet", "part-00001.done.json", "notes.txt", "_SUCCESS")],
    "own-vocab-vocab.txt", "own-vocab-README.md", "own-export-user-file", "own-shard-user-file", "own-vocab-rerun-ok",
    *[f"finite-train{f}={v}" for f, v in (("--lr", "inf"), ("--lr", "nan"), ("--lr", "-inf"), ("--eps", "nan"),
                                         ("--weight-decay", "inf"), ("--clip-grad-norm", "nan"),
                                         ("--warmup-proportion", "nan"), ("--poly-power", "inf"))],
    "finite-train-yaml-lr-nan", "finite-instances--masked-lm-prob=nan", "finite-instances--short-seq-prob=nan",
    "finite-train-yaml-model-overrides-nan", "finite-train-yaml-dropout-inf", "finite-train--lr=1e400",
    "finite-instances-yaml-inf",
    *[f"lock-live-python-m-{m}" for m in ("shard_job", "vocab_job", "instances_job")], "own-python-m-instances",
    "own-shard-overwrite-keeps-user-file", "own-instances-rerun-ok",
    "nonfinite-loss", "vocab-edited-train", "vocab-moved-train", "vocab-edited-resume", "vocab-edited-export",
    "resume-damaged-latest", "resume-previous-good", "resume-bad-mode",
]
