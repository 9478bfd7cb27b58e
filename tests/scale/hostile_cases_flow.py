"""Hostile battery cases through the Prefect flows: a pipeline config (YAML, as a deployment or
``bertflow pipeline --config`` reads it) whose stage meets a hostile input or output directory. The
flows are called directly (no CLI preflight), so the refusal happens inside a stage's task; the flow
run must end Failed with the one-line user error as its state message, the user's files untouched and
no stage output that looks finished. Run by hostile_flow_driver.py under one Prefect test harness.

Every case has its own ``output_root``; planted files go where the plan puts each stage's output.
"""
from __future__ import annotations

import contextlib
import json
import socket
import sys
from pathlib import Path

import yaml

from hostile_check import Case
from scale_support import REPO, write_corpus

sys.path.insert(0, str(REPO / "tests" / "bert_core"))
from train_helpers import write_dataset  # noqa: E402


def _config(root: Path, corpus: Path, shard: dict | None = None, vocab: dict | None = None) -> dict:
    """A pipeline that runs in seconds without Ray: one shard, a small vocab, one tiny phase."""
    return {
        "output_root": str(root),
        "shard": {"inputs": [str(corpus)], "num_shards": 1, "num_workers": 1, "engine": "local", **(shard or {})},
        "vocab": vocab or {"vocab_size": 120, "min_frequency": 1},
        "phases": [{
            "name": "phase1",
            "instances": {"max_seq_length": 32, "max_predictions_per_seq": 5, "dupe_factor": 1, "num_workers": 1,
                          "engine": "local"},
            "train": {"model": "tiny", "max_steps": 1, "micro_batch_size": 4, "save_every": 1, "log_every": 1,
                      "tensorboard": False, "max_seq_length": 32},
        }],
        "orchestration": {"retries": 0, "retry_delay_s": [0.1], "train_retries": 0},
    }


def _plan(t: Path, name: str, data: dict):
    """Write the case's YAML; return (its path, the plan of every stage's output directory)."""
    from flows.config import PipelineConfig, make_plan

    cfg_file = t / "configs" / f"{name}.yaml"
    cfg_file.parent.mkdir(parents=True, exist_ok=True)
    cfg_file.write_text(yaml.safe_dump(data), encoding="utf-8")
    with contextlib.chdir(REPO):  # where the driver runs: the plan's names depend on the working directory
        return cfg_file, make_plan(PipelineConfig.model_validate(data))


def _plant(p: Path, body: bytes = b"user data, do not touch\n") -> Path:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(body)
    return p


def _live_lock(d: Path, pid: int) -> Path:
    from contracts.lock import LOCK_NAME

    return _plant(d / LOCK_NAME, json.dumps({"host": socket.gethostname(), "pid": pid}).encode())


def build(t: Path, holder_pid: int) -> dict[str, Case]:
    corpus = write_corpus(t / "corpus", files=1, docs_per_file=12, seed=3) / "part00.txt"
    bad = _plant(t / "bad" / "bad_utf8.txt", b"Good line here.\n\xff\xfe bad \xc3\x28 line.\n")
    plain = _plant(t / "plain" / "book.txt", b"A plain book. It has text.\n\nAnother part. More text.\n")
    no_mask = _plant(t / "no_mask_vocab.txt", "\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]"] +
                                                         [f"w{i}" for i in range(120)]).encode())
    c: dict[str, Case] = {}

    def case(name: str, stage: str, data: dict, expect: str, out: Path, user: list[Path] = (), model: str = ""):
        cfg_file = t / "configs" / f"{name}.yaml"
        c[name] = Case([stage, str(cfg_file), *([model] if model else [])], expect, entry="flow", out=out,
                       user=[corpus, *user])

    # ---- data stage: inputs refused inside the shard / vocab tasks
    for name, shard, expect in (("flow-data-missing-input", {"inputs": [str(t / "nope.txt")]}, "nope.txt"),
                                ("flow-data-strict-bad-utf8", {"inputs": [str(bad)], "input_format": "bert",
                                                               "on_bad_input": "fail"}, "bad_utf8.txt"),
                                ("flow-data-strict-wiki-format-on-plain-text", {
                                    "inputs": [str(plain)], "input_format": "wikiextractor", "on_bad_input": "fail"},
                                 "book.txt")):
        _, plan = _plan(t, name, _config(t / name, corpus, shard))
        case(name, "data", _config(t / name, corpus, shard), expect, Path(plan.shard.output_dir), [bad, plain])
    name = "flow-data-vocab-file-without-mask"
    data = _config(t / name, corpus, vocab={"vocab_file": str(no_mask)})
    _, plan = _plan(t, name, data)
    case(name, "data", data, "[MASK]", Path(plan.vocab.output_dir), [no_mask])

    # ---- data stage: output directories that are not the stage's own, or held by a live run
    def planted(name: str, where: str, fname: str, expect: str, lock: bool = False):
        data = _config(t / name, corpus)
        _, plan = _plan(t, name, data)
        d = {"shard": Path(plan.shard.output_dir), "vocab": Path(plan.vocab.output_dir),
             "instances": Path(plan.instances["phase1"].output_dir)}[where]
        user = _live_lock(d, holder_pid) if lock else _plant(d / fname)
        case(name, "data", data, expect, d, [user])

    planted("flow-data-shard-dir-user-file", "shard", "data.csv", "not a bertflow documents dataset")
    planted("flow-data-vocab-dir-user-vocab", "vocab", "vocab.txt", "vocab.txt")
    planted("flow-data-instances-dir-foreign-part", "instances", "part-00000-len0032.parquet",
            "part-00000-len0032.parquet")
    planted("flow-data-shard-dir-locked", "shard", "", "in use by another run", lock=True)
    planted("flow-data-instances-dir-locked", "instances", "", "in use by another run", lock=True)

    # ---- train stage: the phase's instances are where the plan says (made here), the run dir is not ok
    def train_case(name: str, expect: str, edit_vocab: bool = False, plant: str = "", lock: bool = False,
                   stage: str = "train", missing: bool = False, stale: bool = False):
        data = _config(t / name, corpus)
        _, plan = _plan(t, name, data)
        inst = Path(plan.instances["phase1"].output_dir)
        run = Path(plan.train["phase1"].output_dir)
        user = []
        if not missing:
            write_dataset(inst, n=16, vocab_size=100, max_seq=32)
            user.append(inst)
        if edit_vocab:
            (inst / "vocab.txt").write_text((inst / "vocab.txt").read_text().replace("w7\n", "zz\n"))
        if plant:
            user.append(_plant((plan.export_dir if stage == "export" else run) / plant))
        if lock:
            user.append(_live_lock(run, holder_pid))
        if stale:  # another config's run, and a user's notes beside it: the stale run is not all there is
            user.append(_plant(run / "train_config.json", b'{"config": {}, "resume_hash": "another config"}'))
        case(name, "train", data, expect, plan.export_dir if stage == "export" else run, user)

    train_case("flow-train-instances-missing", "phase1", missing=True)
    train_case("flow-train-vocab-edited-after-instances", "vocab hash", edit_vocab=True)
    train_case("flow-train-run-dir-locked", "in use by another run", lock=True)
    train_case("flow-train-export-dir-user-file", "my_model.bin", plant="my_model.bin", stage="export")
    train_case("flow-train-stale-run-dir-user-file", "notes.txt", plant="notes.txt", stale=True)

    # ---- eval stage: --model-path that is not a model
    name = "flow-eval-model-plain-directory"
    data = _config(t / name, corpus)
    data["evaluation"] = {"intrinsic": {"batch_size": 8, "max_batches": 1, "use_ray": False, "show_progress": False}}
    _, plan = _plan(t, name, data)
    write_dataset(Path(plan.heldout.output_dir), n=16, vocab_size=100, max_seq=32)  # the eval's own input
    notes = _plant(t / "plain_model" / "notes.txt", b"my notes\n")
    case(name, "eval", data, "not a model", Path(plan.evals["intrinsic"].output_dir), [notes],
         model=str(notes.parent))
    return c


IDS = [
    "flow-data-missing-input", "flow-data-strict-bad-utf8", "flow-data-strict-wiki-format-on-plain-text",
    "flow-data-vocab-file-without-mask", "flow-data-shard-dir-user-file", "flow-data-vocab-dir-user-vocab",
    "flow-data-instances-dir-foreign-part", "flow-data-shard-dir-locked", "flow-data-instances-dir-locked",
    "flow-train-instances-missing", "flow-train-vocab-edited-after-instances", "flow-train-run-dir-locked",
    "flow-train-export-dir-user-file", "flow-train-stale-run-dir-user-file", "flow-eval-model-plain-directory",
]
