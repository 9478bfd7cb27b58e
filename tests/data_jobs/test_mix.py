"""The mix job on two tiny instances datasets made by the real jobs: row counts by the weight rule, rows
taken from their source, byte identity, loading, rerun skipping, refusals, the CLI and the documented
command."""
from __future__ import annotations

import hashlib
import math
import os
import random
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from bert_core.loader import InstanceDataset
from contracts.common import UserError
from contracts.schema import Manifest
from data_jobs import instances_job, vocab_job
from data_jobs.config import InstancesConfig, MixConfig, VocabConfig
from data_jobs.mix_job import main, run, status
from instances_helpers import write_documents, write_tiny_vocab

REPO = Path(__file__).resolve().parents[2]
WORDS = "the cat sat on a mat dog ran far away from home and then came back to eat some food".split()


def _docs(seed: int, n: int) -> list[list[str]]:
    r = random.Random(seed)
    return [[" ".join(r.choice(WORDS) for _ in range(r.randint(4, 12))) + "." for _ in range(r.randint(3, 8))]
            for _ in range(n)]


def _instances(root: Path, docs: str, vocab: str, out: Path) -> Path:
    instances_job.run(InstancesConfig(shards_dir=str(root / docs), vocab_dir=str(root / vocab), output_dir=str(out),
                                      max_seq_length=64, dupe_factor=2, random_pool_docs=16, num_workers=1,
                                      engine="local"))
    return out


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """inst_a (40 documents), inst_b (30 documents), same vocab; inst_c: inst_b's documents, another vocab."""
    root = tmp_path_factory.mktemp("mix")
    write_documents(root / "docs_a", _docs(1, 40), num_shards=2)
    write_documents(root / "docs_b", _docs(2, 30), num_shards=2)
    vocab_job.run(VocabConfig(output_dir=str(root / "vocab"),
                              vocab_file=str(write_tiny_vocab(root / "v.txt", WORDS + ["."]))))
    vocab_job.run(VocabConfig(output_dir=str(root / "vocab2"),
                              vocab_file=str(write_tiny_vocab(root / "v2.txt", WORDS + [".", "extra"]))))
    _instances(root, "docs_a", "vocab", root / "inst_a")
    _instances(root, "docs_b", "vocab", root / "inst_b")
    _instances(root, "docs_b", "vocab2", root / "inst_c")
    return root


def _cfg(data: Path, out: Path, weights: list[float], seed: int = 0) -> MixConfig:
    return MixConfig(sources=[str(data / "inst_a"), str(data / "inst_b")], weights=weights, output_dir=str(out),
                     seed=seed)


def _rows(path: Path) -> list[tuple]:
    t = pq.read_table(path)
    return [tuple(map(lambda v: tuple(v) if isinstance(v, list) else v, r.values())) for r in t.to_pylist()]


@pytest.mark.parametrize("weights", [[1, 0.25], [2.5, 0.4], [0, 1.7]])
def test_counts_follow_the_weights_and_rows_come_from_their_source(data, tmp_path, weights):
    out = tmp_path / "mix"
    m = run(_cfg(data, out, weights))
    sources = [Manifest.read(data / n) for n in ("inst_a", "inst_b")]
    taken = [0, 0]
    for i, (src, w) in enumerate(zip(sources, weights)):
        n = sum(f.rows for f in src.files)
        expect = math.floor(w) * n + math.floor((w - math.floor(w)) * n + 0.5)
        assert m.totals["sources"][i]["rows_in"] == n and m.totals["sources"][i]["rows_taken"] == expect
        assert m.totals["sources"][i]["weight"] == w
        copies = math.floor(w)
        for f in src.files:
            name = f"s{i:02d}-{f.name}"
            entry = next((e for e in m.files if e.name == name), None)
            if entry is None:
                assert copies == 0
                continue
            assert entry.meta["bin"] == f.meta["bin"] and entry.meta["source"] == i
            assert sum(entry.meta["row_groups"]) == entry.rows
            original, mixed = _rows(data / ("inst_a", "inst_b")[i] / f.name), _rows(out / name)
            assert len(mixed) == entry.rows
            # full copies first, then the sample: an ascending subsequence of the source file's rows
            assert mixed[:copies * len(original)] == original * copies
            it = iter(original)
            assert all(row in it for row in mixed[copies * len(original):])
            taken[i] += entry.rows
    assert taken == [s["rows_taken"] for s in m.totals["sources"]] and sum(taken) == m.totals["instances"]
    t = m.totals
    assert m.kind == "instances" and m.vocab_hash == sources[0].vocab_hash
    for key in ("vocab_size", "vocab_file", "lowercase", "max_seq_length", "max_predictions_per_seq",
                "length_bin_size", "sentence_task", "masked_lm_prob", "whole_word_masking", "dupe_factor"):
        assert t[key] == sources[0].totals[key], key
    ds = InstanceDataset(out, verify="deep")
    assert len(ds) == t["instances"] and ds.vocab_hash == sources[0].vocab_hash


def test_same_inputs_config_and_seed_give_the_same_bytes(data, tmp_path):
    def digests(d: Path) -> dict[str, str]:
        return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.glob("*.parquet"))}

    m1 = run(_cfg(data, tmp_path / "one", [2.5, 0.4], seed=7))
    m2 = run(_cfg(data, tmp_path / "two", [2.5, 0.4], seed=7))
    assert digests(tmp_path / "one") == digests(tmp_path / "two") and len(digests(tmp_path / "one")) == len(m1.files)
    assert m1.files == m2.files and m1.config_hash == m2.config_hash
    # a manifest listing the same files in another order: the same mixture
    shutil.copytree(data / "inst_b", tmp_path / "b_reordered")
    mb = Manifest.read(tmp_path / "b_reordered")
    mb.model_copy(update={"files": mb.files[::-1]}).write(tmp_path / "b_reordered")
    run(MixConfig(sources=[str(data / "inst_a"), str(tmp_path / "b_reordered")], weights=[2.5, 0.4],
                  output_dir=str(tmp_path / "reordered"), seed=7))
    assert digests(tmp_path / "reordered") == digests(tmp_path / "one")
    # another seed: another sample (the full copies stay)
    run(_cfg(data, tmp_path / "three", [2.5, 0.4], seed=8))
    d1, d3 = digests(tmp_path / "one"), digests(tmp_path / "three")
    assert any(d1.get(n) != d for n, d in d3.items()) and d1 != d3


@pytest.mark.parametrize("shift", [48, 62])  # 62: four buckets, so the boundary bucket holds many rows
@pytest.mark.parametrize("sizes", [[5, 0, 7], [1], [300, 2, 41]])
def test_sample_is_the_rows_with_the_smallest_keys(sizes, shift, monkeypatch):
    """The three-pass selection against the obvious one: all keys at once, sorted (key, file, row)."""
    import numpy as np

    from contracts.schema import FileEntry
    from data_jobs import mix_job
    from data_jobs.mix_job import _keys, _sample

    monkeypatch.setattr(mix_job, "BUCKET_SHIFT", np.uint64(shift))

    files = [FileEntry(name=f"f{j}", rows=n, bytes=0, sha256="") for j, n in enumerate(sizes)]
    keys = [(int(k), j, r) for j, f in enumerate(files) for r, k in enumerate(_keys(3, 1, f.name, f.rows))]
    for k in sorted({0, 1, sum(sizes) // 3, sum(sizes) - 1, sum(sizes)}):
        want = {f.name: sorted(r for _, j, r in sorted(keys)[:k] if j == i) for i, f in enumerate(files)}
        got = _sample(files, k, 3, 1)
        assert {n: list(v) for n, v in got.items()} == want and all(np.all(np.diff(v) > 0) for v in got.values())


def test_rerun_is_skipped_and_inputs_are_compared_by_content(data, tmp_path, capsys):
    cfg = _cfg(data, tmp_path / "mix", [1, 0.25])
    m = run(cfg)
    assert status(cfg).done
    before = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "mix").iterdir()}
    assert run(cfg) == m
    assert "stage mix: skipped (complete)" in capsys.readouterr().err
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "mix").iterdir()} == before
    # the same datasets elsewhere are the same inputs
    shutil.copytree(data / "inst_a", tmp_path / "copy_a")
    moved = MixConfig(sources=[str(tmp_path / "copy_a"), str(data / "inst_b")], weights=[1, 0.25],
                      output_dir=str(tmp_path / "mix"))
    assert status(moved).done
    # other inputs with the same config: made again in place, the earlier mixture's files removed
    swapped = MixConfig(sources=[str(data / "inst_b"), str(data / "inst_a")], weights=[1, 0.25],
                        output_dir=str(tmp_path / "mix"))
    assert status(swapped).reason == "inputs changed: instances datasets"
    m2 = run(swapped)
    assert sorted(p.name for p in (tmp_path / "mix").glob("*.parquet")) == sorted(f.name for f in m2.files)
    assert status(swapped).done and not status(cfg).done
    # other weights: another config's data, refused
    with pytest.raises(UserError, match="holds another config's data"):
        run(_cfg(data, tmp_path / "mix", [1, 0.5]))


def test_unmixable_sources_are_refused_naming_them(data, tmp_path):
    out = tmp_path / "mix"
    with pytest.raises(UserError, match=re.escape(str(data / "inst_c")) + ": vocab hash .* differs"):
        run(MixConfig(sources=[str(data / "inst_a"), str(data / "inst_c")], weights=[1, 1], output_dir=str(out)))
    with pytest.raises(UserError, match=re.escape(str(data / "docs_a")) + ": manifest is of kind 'documents'"):
        run(MixConfig(sources=[str(data / "inst_a"), str(data / "docs_a")], weights=[1, 1], output_dir=str(out)))
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.parametrize("weights, problem", [(["-1", "1"], "-1.0 is negative"), (["0", "0"], "all are 0"),
                                              (["1"], "1 given for 2 sources"), (["inf", "1"], "finite")])
def test_cli_refuses_bad_weights_in_one_line(data, tmp_path, capsys, weights, problem):
    argv = ["--sources", str(data / "inst_a"), str(data / "inst_b"), "--weights", *weights,
            "--output-dir", str(tmp_path / "o")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("bertflow: error:") and problem in err
    assert not (tmp_path / "o").exists()


def test_cli_help_and_run(data, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0 and "--weights" in capsys.readouterr().out
    assert main(["--sources", str(data / "inst_a"), str(data / "inst_b"), "--weights", "1", "0.25",
                 "--output-dir", str(tmp_path / "o"), "--seed", "3"]) == 0
    line = capsys.readouterr().out.strip()
    m = Manifest.read(tmp_path / "o")
    assert line.startswith("mix: source 0 ") and f"{m.totals['instances']} instances" in line
    assert m.config["seed"] == 3


def test_sources_and_output_on_object_storage(data, tmp_path, s3_env, scratch):
    """Sources on a real S3-compatible server, read through checked local copies; the output uploaded:
    the bytes of the same mixture made locally."""
    from contracts.storage import location

    uris = []
    for name in ("inst_a", "inst_b"):
        loc = location(f"{s3_env}/{name}")
        for path in sorted((data / name).iterdir()):
            loc.upload(path.name, path)
        uris.append(f"{s3_env}/{name}")
    remote_cfg = MixConfig(sources=uris, weights=[1.5, 0.25], output_dir=f"{s3_env}/mix", seed=1)
    remote = run(remote_cfg)
    local = run(_cfg(data, tmp_path / "local", [1.5, 0.25], seed=1))
    assert [(f.name, f.rows, f.sha256) for f in remote.files] == [(f.name, f.rows, f.sha256) for f in local.files]
    assert remote.totals["input_hash"] == local.totals["input_hash"] and status(remote_cfg).done
    assert Manifest.read(f"{s3_env}/mix").totals["instances"] == local.totals["instances"]
    assert not any(scratch.iterdir())  # scratch copies removed


def _documented_command() -> str:
    text = (REPO / "docs" / "data-instances.md").read_text()
    section = text[text.index("## Mixing instance datasets (`bertflow data mix`)"):]
    block = section[section.index("```bash") + 7:section.index("```", section.index("```bash") + 7)]
    (cmd,) = [c.strip() for c in block.splitlines() if c.strip()]
    return cmd


def test_documented_command_runs_as_written(data, tmp_path):
    cmd = _documented_command()
    argv = shlex.split(cmd)
    sources = argv[argv.index("--sources") + 1:argv.index("--weights")]
    for src, made in zip(sources, ("inst_a", "inst_b")):
        shutil.copytree(data / made, tmp_path / src)
    env = dict(os.environ, PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    proc = subprocess.run(["bash", "-c", cmd], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and proc.stdout.startswith("mix: ")
    out = tmp_path / argv[argv.index("--output-dir") + 1]
    assert len(InstanceDataset(out)) == Manifest.read(out).totals["instances"] > 0
