"""Hostile battery cases: every user-facing command fed malformed input (the former bad-input battery).

Each runs ``bertflow ...`` (``python -m flows.cli``) against the shared two-node Ray cluster
(``--ray-address``) and must end with exit 2, exactly one ``bertflow: error:`` line naming the file or
option, no traceback, and nothing in its output directory that looks finished.

Damaged data (empty file, bad UTF-8, truncated archives...) is skipped and counted by default (one
bad file should not cost a day of preprocessing, see docs/data-shard.md); ``--on-bad-input fail`` is
the mode where each of these must be one clear error, and that is what these cases run.
"""
from __future__ import annotations

import bz2
import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from hostile_check import CLI, Case
from scale_support import REPO, base_env, write_corpus

sys.path.insert(0, str(REPO / "tests" / "bert_core"))
sys.path.insert(0, str(REPO / "tests" / "data_jobs"))
from instances_helpers import write_documents  # noqa: E402
from train_helpers import write_dataset, write_vocab  # noqa: E402

DROP_DAC = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]  # root that obeys file modes


def _C(argv: list[str], expect: str, out: Path | None = None, **kw) -> Case:
    return Case(argv, expect, out=out, **kw)


def _text(p: Path, body: str | bytes) -> Path:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(body if isinstance(body, bytes) else body.encode())
    return p


def _yaml(p: Path, data: dict) -> Path:
    import yaml

    return _text(p, yaml.safe_dump(data))


def _mount_tmpfs(d: Path, size: str) -> str:
    """A tiny tmpfs (a real disk-full); returns why not, where it cannot be mounted."""
    d.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        return "mounting a tmpfs needs root"
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(d)], capture_output=True, text=True)
    return "" if r.returncode == 0 else f"cannot mount a tmpfs here: {r.stderr.strip()}"


SENTENCES = "The first sentence is here.\nAnd a second one follows.\n\nAnother document starts.\nIt ends now.\n"


def build_cases(t: Path, ray_address: str) -> dict[str, Case]:
    """All cases, with their input files written under ``t``."""
    out = t / "out"
    shard = [*CLI, "data", "shard", "--num-shards", "2", "--num-workers", "1", "--ray-address", ray_address]
    strict = [*shard, "--on-bad-input", "fail"]
    docs = write_documents(t / "docs", [["Hello world .", "Second sentence ."], ["Another doc ."]] * 4, num_shards=2)
    vocab_txt = write_vocab(t / "vocab.txt", 100)
    good_vocab = t / "vocab_ds"
    subprocess.run([sys.executable, *CLI, "data", "vocab", "--vocab-file", str(vocab_txt), "--output-dir",
                    str(good_vocab)], env=base_env(), check=True, capture_output=True)
    instances = write_dataset(t / "instances", n=32, vocab_size=100, max_seq=32)
    inst = [*CLI, "data", "instances", "--shards-dir", str(docs), "--vocab-dir", str(good_vocab), "--ray-address", ray_address]
    train = [*CLI, "train", "--data-dir", str(instances), "--max-steps", "2", "--save-every", "1", "--micro-batch-size", "4"]

    gz = gzip.compress(SENTENCES.encode() * 200)
    bz = bz2.compress(SENTENCES.encode() * 200)
    other = out / "other_config"
    _text(other / "manifest.json", json.dumps({"schema_version": 1, "kind": "documents", "config": {"num_shards": 3},
                                               "config_hash": "0123456789abcdef", "files": []}))
    locked = t / "locked_corpus"
    _text(locked / "secret" / "a.txt", SENTENCES)
    os.chmod(locked / "secret", 0)
    no_mask = _text(t / "no_mask_vocab.txt", "\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]"] + [f"w{i}" for i in range(120)]))
    hostfile = _text(t / "hostfile", "127.0.0.1 slots=1\ngpu-node-99.invalid slots=8\n")
    full = t / "full"
    why_no_tmpfs = _mount_tmpfs(full, "256k")
    pq.write_table(pa.table({"body": ["some text here."]}), t / "no_text.parquet")

    c: dict[str, Case] = {
        # --- shard job: paths and damaged data
        "shard-missing-path": _C([*shard, "--input", str(t / "nope"), "--output-dir", str(out / "a")], str(t / "nope"), out / "a"),
        "shard-empty-file": _C([*strict, "--input", str(_text(t / "empty.txt", b"")), "--output-dir", str(out / "b")], "empty.txt", out / "b"),
        "shard-invalid-utf8": _C([*strict, "--format", "bert", "--input", str(_text(t / "bad_utf8.txt", b"Good line.\n\xff\xfe bad \xc3\x28 line.\n")),
                                    "--output-dir", str(out / "c")], "bad_utf8.txt", out / "c"),
        "shard-binary-file": _C([*strict, "--input", str(_text(t / "blob.bin", bytes(range(256)) * 64)), "--output-dir", str(out / "d")], "blob.bin", out / "d"),
        "shard-truncated-gz": _C([*strict, "--format", "bert", "--input", str(_text(t / "cut.txt.gz", gz[: len(gz) // 2])),
                                    "--output-dir", str(out / "e")], "cut.txt.gz", out / "e"),
        "shard-truncated-bz2": _C([*strict, "--format", "bert", "--input", str(_text(t / "cut.txt.bz2", bz[: len(bz) // 2])),
                                     "--output-dir", str(out / "f")], "cut.txt.bz2", out / "f"),
        "shard-malformed-xml": _C([*strict, "--format", "mediawiki", "--input", str(_text(t / "dump.xml",
                                     "<mediawiki><page><title>A</title><ns>0</ns><id>1</id><revision><text>Some text.</text></revision></page>"
                                     "<page><title>B</ti></page>")), "--output-dir", str(out / "g")], "dump.xml", out / "g"),
        "shard-jsonl-bad-line": _C([*strict, "--input", str(_text(t / "docs.jsonl", '{"text": "A fine document."}\n{"text": broken\n')),
                                      "--output-dir", str(out / "h")], "docs.jsonl", out / "h"),
        "shard-parquet-without-text-column": _C([*shard, "--input", str(t / "no_text.parquet"), "--output-dir", str(out / "i")], "text", out / "i"),
        "shard-output-dir-of-another-config": _C([*shard, "--input", str(_text(t / "ok.txt", SENTENCES)), "--output-dir", str(other)], str(other)),
        "shard-unreadable-directory": _C([*shard, "--input", str(locked), "--output-dir", str(out / "j")], str(locked / "secret"), out / "j",
                                           prefix=DROP_DAC),
        "shard-config-typo": _C([*shard, "--config", str(_yaml(t / "typo.yaml", {"inputs": [str(t / "ok.txt")], "output_dir": str(out / "k"),
                                   "num_shard": 4}))], "num_shard", out / "k"),
        "shard-config-wrong-type": _C([*shard, "--config", str(_yaml(t / "types.yaml", {"inputs": [str(t / "ok.txt")], "output_dir": str(out / "l"),
                                         "dedup": "sometimes"}))], "dedup", out / "l"),
        "shard-zero-shards": _C([*shard, "--input", str(t / "ok.txt"), "--output-dir", str(out / "m"), "--num-shards", "0"], "num_shards", out / "m"),
        "shard-negative-workers": _C([*shard, "--input", str(t / "ok.txt"), "--output-dir", str(out / "n"), "--num-workers", "-2"], "num_workers", out / "n"),
        "shard-disk-full": _C([*shard, "--format", "bert", "--input", str(write_corpus(t / "big", files=2, docs_per_file=3000)),
                                 "--output-dir", str(full / "docs")],
                                "No space left", full / "docs", skip=why_no_tmpfs),
        # --- vocab job
        "vocab-without-mask": _C([*CLI, "data", "vocab", "--vocab-file", str(no_mask), "--output-dir", str(out / "v1")], "[MASK]", out / "v1"),
        "vocab-missing-shards-dir": _C([*CLI, "data", "vocab", "--shards-dir", str(t / "nope"), "--output-dir", str(out / "v2")], str(t / "nope"), out / "v2"),
        "vocab-zero-size": _C([*CLI, "data", "vocab", "--shards-dir", str(docs), "--vocab-size", "0", "--output-dir", str(out / "v3")], "vocab_size", out / "v3"),
        # --- instances job
        "instances-max-seq-length-below-8": _C([*inst, "--output-dir", str(out / "i1"), "--max-seq-length", "4"], "max_seq_length", out / "i1"),
        "instances-masked-lm-prob-above-1": _C([*inst, "--output-dir", str(out / "i2"), "--masked-lm-prob", "1.5"], "masked_lm_prob", out / "i2"),
        "instances-masked-lm-prob-zero": _C([*inst, "--output-dir", str(out / "i3"), "--masked-lm-prob", "0"], "masked_lm_prob", out / "i3"),
        "instances-negative-dupe-factor": _C([*inst, "--output-dir", str(out / "i4"), "--dupe-factor", "-1"], "dupe_factor", out / "i4"),
        "instances-shards-dir-not-a-dataset": _C([*CLI, "data", "instances", "--shards-dir", str(t / "locked_corpus"), "--vocab-dir", str(good_vocab),
                                                    "--output-dir", str(out / "i5")], str(t / "locked_corpus"), out / "i5"),
        "instances-vocab-dir-is-documents": _C([*CLI, "data", "instances", "--shards-dir", str(docs), "--vocab-dir", str(docs),
                                                  "--output-dir", str(out / "i6")], str(docs), out / "i6"),
        "inspect-missing-dir": _C([*CLI, "data", "inspect", str(t / "nope")], str(t / "nope")),
        # --- training
        "train-missing-data-dir": _C([*train, "--data-dir", str(t / "nope"), "--output-dir", str(out / "t1")], str(t / "nope"), out / "t1"),
        "train-data-dir-holds-documents": _C([*train, "--data-dir", str(docs), "--output-dir", str(out / "t2")], str(docs), out / "t2"),
        "train-zero-max-steps": _C([*train, "--output-dir", str(out / "t3"), "--max-steps", "0"], "max_steps", out / "t3"),
        "train-negative-micro-batch": _C([*train, "--output-dir", str(out / "t4"), "--micro-batch-size", "-4"], "micro_batch_size", out / "t4"),
        "train-config-typo": _C([*CLI, "train", "--config", str(_yaml(t / "train_typo.yaml", {"data_dir": str(instances),
                                   "output_dir": str(out / "t5"), "max_step": 3}))], "max_step", out / "t5"),
        "train-config-wrong-type": _C([*CLI, "train", "--config", str(_yaml(t / "train_types.yaml", {"data_dir": str(instances),
                                         "output_dir": str(out / "t6"), "lr": "fast"}))], "lr", out / "t6"),
        "train-hostfile-unknown-host": _C([*CLI, "train", "--config", str(_yaml(t / "train_host.yaml", {"data_dir": str(instances),
                                             "output_dir": str(out / "t7"), "launcher": "deepspeed", "engine": "deepspeed",
                                             "hostfile": str(hostfile)}))], "gpu-node-99.invalid", out / "t7"),
        "train-resume-nothing": _C([*train, "--output-dir", str(out / "t8"), "--resume"], str(out / "t8"), out / "t8"),
        "train-disk-full": _C([*train, "--output-dir", str(full / "run"), "--model", "mini"], "No space left", full / "run", skip=why_no_tmpfs),
        "export-missing-checkpoint": _C([*CLI, "export", "--checkpoint", str(t / "nope"), "--out", str(out / "x1")], str(t / "nope"), out / "x1"),
        "eval-missing-model": _C([*CLI, "eval", "intrinsic", "--model", str(t / "nope"), "--instances-dir", str(instances), "--no-ray",
                                    "--output-dir", str(out / "e1")], str(t / "nope"), out / "e1"),
        # --- flows
        "pipeline-config-typo": _C([*CLI, "pipeline", "--config", str(_yaml(t / "pipe_typo.yaml", {"output_root": str(out / "p1"),
                                      "shard": {"inputs": [str(t / "ok.txt")], "num_shard": 2}}))], "num_shard", out / "p1"),
        "pipeline-config-wrong-type": _C([*CLI, "pipeline", "--config", str(_yaml(t / "pipe_types.yaml", {"output_root": str(out / "p2"),
                                            "shard": {"inputs": [str(t / "ok.txt")], "num_shards": "two"}}))], "num_shards", out / "p2"),
        # --- argparse itself (CLIs generated from the config models): one line, exit 2, no usage block
        "cli-flag-not-a-number": _C([*shard, "--input", str(t / "ok.txt"), "--num-shards", "two"], "--num-shards"),
        "cli-unknown-flag": _C([*CLI, "train", "--data-dir", str(instances), "--max-stepz", "3"], "--max-stepz"),
        "cli-bad-choice": _C([*CLI, "eval", "intrinsic", "--model-format", "onnx"], "--model-format"),
        "cli-unknown-data-job": _C([*CLI, "data", "shardz"], "shardz"),
    }
    c["shard-output-dir-of-another-config"].user.append(other / "manifest.json")
    for name, case in c.items():
        case.bare = name.startswith("cli-")  # argparse errors: that one line is all there is (no usage block)
        case.ray = True  # --ray-address of the shared cluster (its token in the environment)
    return c


def build(t: Path, ray_address: str) -> dict[str, Case]:
    os.chmod(t, 0o755)  # DROP_DAC cases: root without DAC override must still reach its inputs
    return build_cases(t, ray_address)


def cleanup(t: Path) -> None:
    subprocess.run(["umount", str(t / "full")], capture_output=True)
    for p in t.rglob("*"):
        if p.is_dir() and not p.is_symlink():
            os.chmod(p, 0o755)
    shutil.rmtree(t, ignore_errors=True)


IDS = [
    "shard-missing-path", "shard-empty-file", "shard-invalid-utf8", "shard-binary-file", "shard-truncated-gz",
    "shard-truncated-bz2", "shard-malformed-xml", "shard-jsonl-bad-line", "shard-parquet-without-text-column",
    "shard-output-dir-of-another-config", "shard-unreadable-directory", "shard-config-typo", "shard-config-wrong-type",
    "shard-zero-shards", "shard-negative-workers", "shard-disk-full", "vocab-without-mask", "vocab-missing-shards-dir",
    "vocab-zero-size", "instances-max-seq-length-below-8", "instances-masked-lm-prob-above-1",
    "instances-masked-lm-prob-zero", "instances-negative-dupe-factor", "instances-shards-dir-not-a-dataset",
    "instances-vocab-dir-is-documents", "inspect-missing-dir", "train-missing-data-dir", "train-data-dir-holds-documents",
    "train-zero-max-steps", "train-negative-micro-batch", "train-config-typo", "train-config-wrong-type",
    "train-hostfile-unknown-host", "train-resume-nothing", "train-disk-full", "export-missing-checkpoint",
    "eval-missing-model", "pipeline-config-typo", "pipeline-config-wrong-type",
    "cli-flag-not-a-number", "cli-unknown-flag", "cli-bad-choice", "cli-unknown-data-job",
]
