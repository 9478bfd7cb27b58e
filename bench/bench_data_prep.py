"""Data preparation, measured side by side in one run: our CLIs against Google's original
create_pretraining_data.py and against bare `tokenizers` encoding of the same text.

    make bench-data                          (= .venv/bin/python bench/bench_data_prep.py)
    .venv/bin/python bench/bench_data_prep.py [--reps 3] [--quick] [--parts startup,5mb] [--original-venv DIR]

Every figure is a median over interleaved repetitions (machine shared: the load average is printed);
every process tree (driver + workers) is measured whole (bench/treemeter.py). Input: Gutenberg books
from ../shared/data, sentence-split once by our shard job; the original reads the same sentences as a
text file (one a line, blank line between documents), ours reads them as Parquet shards.

  P1  `bertflow data instances` end to end (CLI, start-up included, default workers) vs the original,
      on ~5 MB and on ~50 MB (all 30 books plus a second copy of some: ~50 MB).  target >= 3x / >= 5x
  P2  ours / bare `tokenizers` encode_batch_fast of the same sentences on the same cores.  target <= 1.5x
      (wall, and CPU: our whole tree against the encode call's own CPU time)
  start-up: `bertflow data instances` on a tiny input (wall and CPU of the whole tree)
  P3  2 workers vs 1 worker on ~50 MB (target >= 1.8x; 5 interleaved repetitions, --p3-reps), and the
      host's own ceiling for it: two independent 1-worker jobs side by side; wall and peak
      RSS for 1x, 2x, 4x, 8x the 5 MB set (target: wall linear, memory flat)
  shard job: MB/s per CPU-second with each splitter vs reading the same files with no splitting

The original needs Google's file (not part of this repository); install it once with
    python3 -m venv /tmp/bert-original && /tmp/bert-original/bin/pip install --no-deps bert-tensorflow==1.0.4
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from contracts.schema import DOCUMENTS_SCHEMA, Manifest, file_entry  # noqa: E402
from bench_instances import pick_books  # noqa: E402
from treemeter import TreeRun, run_tree  # noqa: E402

BIN = Path(sys.executable).parent
SEQ, DUPE = 128, 5
PARTS = ("startup", "5mb", "50mb", "p3", "curve", "shard")
BARE = """
import json, os, sys, time
from data_jobs.tokenization import wordpiece_tokenizer
sents = [l for l in open(sys.argv[1], encoding="utf-8").read().split("\\n") if l]
tok = wordpiece_tokenizer(sys.argv[2], lowercase=True)
c0, t0 = time.process_time(), time.perf_counter()
encs = tok.encode_batch_fast(sents, add_special_tokens=False)
dt, cpu = time.perf_counter() - t0, time.process_time() - c0  # process_time counts every thread
print(json.dumps({"seconds": dt, "cpu_s": cpu, "sentences": len(sents), "tokens": sum(len(e.ids) for e in encs)}))
"""
PLAIN_READ = """
import sys, time
t0 = time.process_time(); n = 0
for p in sys.argv[1:]:
    n += len(open(p, encoding="utf-8-sig").read().splitlines())
print(time.process_time() - t0)
"""


def original_script(venv: Path) -> Path:
    found = sorted(venv.glob("lib/python*/site-packages/bert/create_pretraining_data.py"))
    if not found:
        sys.exit(f"bench_data_prep: Google's create_pretraining_data.py not found under {venv}; install it with\n"
                 f"    python3 -m venv {venv} && {venv}/bin/pip install --no-deps bert-tensorflow==1.0.4")
    return found[0]


def env_for(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAYON_NUM_THREADS")}
    env.update({"TOKENIZERS_PARALLELISM": "false", "RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": str(REPO), **extra})
    return env


def checked(r: TreeRun, what: str) -> TreeRun:
    if r.returncode != 0:
        sys.exit(f"bench_data_prep: {what} failed (rc {r.returncode}):\n{r.stderr[-3000:]}")
    return r


def shard_documents(books: list[Path], out: Path) -> list[list[str]]:
    """Sentence-split the books once with our shard job (blingfire), return their documents."""
    checked(run_tree([str(BIN / "bertflow"), "data", "shard", "--input", *map(str, books), "--format", "books",
                      "--output-dir", str(out), "--num-shards", "4", "--splitter", "blingfire"], env_for()),
            "shard job")
    docs = []
    for f in sorted(out.glob("shard-*.parquet")):
        docs += pq.read_table(f, columns=["sentences"]).column(0).to_pylist()
    return [[s.strip() for s in d if s and s.strip()] for d in docs]


def write_inputs(docs: list[list[str]], root: Path, num_shards: int) -> tuple[Path, Path, float]:
    """The same documents as our Parquet shards (document i -> shard i % n) and as the original's
    text file; returns (shards dir, text file, MB of sentence text)."""
    shards = root / "shards"
    shards.mkdir(parents=True)
    files = []
    for s in range(num_shards):
        rows = [{"doc_id": f"doc-{i:06d}", "source": "bench", "sentences": d}
                for i, d in enumerate(docs) if i % num_shards == s]
        path = shards / f"shard-{s:05d}.parquet"
        pq.write_table(pa.Table.from_pylist(rows, schema=DOCUMENTS_SCHEMA), path, compression="zstd")
        files.append(file_entry(path, len(rows), shard=s))
    Manifest(kind="documents", config={"made_by": "bench_data_prep"}, config_hash="bench", files=files).write(shards)
    text = root / "corpus.txt"
    text.write_text("\n\n".join("\n".join(d) for d in docs) + "\n", encoding="utf-8")
    return shards, text, text.stat().st_size / 1e6


class Bench:
    def __init__(self, args, tmp: Path):
        self.args, self.tmp = args, tmp
        self.vocab_txt = Path(args.shared_data) / "vocab/bert-base-uncased-vocab.txt"
        self.vocab_dir = tmp / "vocab"
        self.original = original_script(Path(args.original_venv))
        self.n = 0
        self.lock = threading.Lock()

    def ours(self, shards: Path, workers: int | None = None) -> TreeRun:
        with self.lock:  # side_by_side runs two at once
            self.n += 1
            out = self.tmp / f"inst{self.n}"
        cmd = [str(BIN / "bertflow"), "data", "instances", "--shards-dir", str(shards), "--vocab-dir",
               str(self.vocab_dir), "--output-dir", str(out), "--max-seq-length", str(SEQ), "--dupe-factor", str(DUPE)]
        r = checked(run_tree(cmd + (["--num-workers", str(workers)] if workers else []), env_for()), "instances job")
        r.instances = Manifest.read(out).totals["instances"]
        r.out = out
        return r

    def original_run(self, text: Path) -> TreeRun:
        cmd = [sys.executable, str(REPO / "bench/run_original.py"), "--script", str(self.original),
               f"--input_file={text}", f"--vocab_file={self.vocab_txt}", "--output_file=/dev/null",
               f"--max_seq_length={SEQ}", f"--dupe_factor={DUPE}", "--do_lower_case=True"]
        r = checked(run_tree(cmd, env_for()), "original")
        r.instances = json.loads(r.stdout.strip().splitlines()[-1])["records"]
        return r

    def bare(self, text: Path, threads: int) -> dict:
        env = env_for(TOKENIZERS_PARALLELISM="true", RAYON_NUM_THREADS=str(threads))
        r = checked(run_tree([sys.executable, "-c", BARE, str(text), str(self.vocab_txt)], env), "bare tokenizers")
        return json.loads(r.stdout.strip().splitlines()[-1])


def med(xs) -> float:
    return statistics.median(xs)


def say(line: str) -> None:
    print(line, flush=True)


def interleaved(reps: int, runs: dict) -> dict[str, list]:
    """Call every runner once per repetition, alternating the order between repetitions."""
    got: dict[str, list] = {k: [] for k in runs}
    names = list(runs)
    for rep in range(reps):
        for name in (names if rep % 2 == 0 else names[::-1]):
            r = runs[name]()
            got[name].append(r)
            wall = r["seconds"] if isinstance(r, dict) else r.wall_s
            extra = "" if isinstance(r, dict) else f", CPU {r.cpu_s:.1f} s, peak RSS {r.peak_rss_mb:.0f} MB"
            say(f"  rep {rep + 1} {name}: {wall:.2f} s{extra}")
    return got


def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def p1_p2(b: Bench, shards: Path, text: Path, mb: float, reps: int, label: str, ratios: dict) -> None:
    say(f"\n[P1/P2 {label}] {mb:.1f} MB of sentences; {load()}")
    runs = {"ours (CLI, default workers)": lambda: b.ours(shards), "original": lambda: b.original_run(text)}
    if label == "5MB":
        runs["bare tokenizers (2 threads)"] = lambda: b.bare(text, 2)
    got = interleaved(reps, runs)
    ours = med([r.wall_s for r in got["ours (CLI, default workers)"]])
    orig = med([r.wall_s for r in got["original"]])
    o, g = got["ours (CLI, default workers)"][0], got["original"][0]
    say(f"  instances: ours {o.instances:,}, original {g.instances:,}; peak RSS ours "
        f"{med([r.peak_rss_mb for r in got['ours (CLI, default workers)']]):.0f} MB, original "
        f"{med([r.peak_rss_mb for r in got['original']]):.0f} MB")
    ratios[f"P1 {label}: original wall / ours wall"] = (orig / ours, ">= 3" if label == "5MB" else ">= 5")
    ratios[f"P1 {label}: original CPU / ours CPU (whole trees)"] = (
        med([r.cpu_s for r in got["original"]]) / med([r.cpu_s for r in got["ours (CLI, default workers)"]]), "")
    if "bare tokenizers (2 threads)" in got:
        bare = med([r["seconds"] for r in got["bare tokenizers (2 threads)"]])
        ratios[f"P2 {label}: ours wall / bare tokenizers wall (2 cores)"] = (ours / bare, "<= 1.5")
        # CPU: our whole tree (start-up included) / the encode call's own CPU (less sensitive to load)
        ratios[f"P2 {label}: ours CPU / bare tokenizers CPU"] = (
            med([r.cpu_s for r in got["ours (CLI, default workers)"]])
            / med([r["cpu_s"] for r in got["bare tokenizers (2 threads)"]]), "")


def startup(b: Bench, docs5: list[list[str]], reps: int, ratios: dict) -> None:
    """The fixed cost of `bertflow data instances`: a run on two documents of 100 sentences each."""
    shards, _, mb = write_inputs([d[:100] for d in docs5[:2]], b.tmp / "tiny", 2)
    say(f"\n[start-up] `bertflow data instances` on {mb * 1000:.0f} kB (2 shards), default workers; {load()}")
    got = interleaved(reps, {"ours (CLI, tiny input)": lambda: b.ours(shards)})["ours (CLI, tiny input)"]
    ratios["start-up: wall s (tiny input)"] = (med([r.wall_s for r in got]), "")
    ratios["start-up: CPU s of the whole tree (tiny input)"] = (med([r.cpu_s for r in got]), "")


def side_by_side(b: Bench, shards: Path) -> dict:
    """Two independent 1-worker jobs started together, each its own output: the wall time of the later
    one to finish. No work is shared, so what it adds over one job alone is what the host takes when
    both cores are busy (memory bandwidth, caches, the hypervisor): the ceiling for 2 workers here."""
    got: list = [None, None]
    threads = [threading.Thread(target=lambda i=i: got.__setitem__(i, b.ours(shards, 1))) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if None in got:
        sys.exit("bench_data_prep: a side-by-side instances job failed")
    return {"seconds": max(r.wall_s for r in got)}


def p3(b: Bench, shards: Path, reps: int, ratios: dict) -> None:
    say(f"\n[P3 workers] 1 vs 2 workers on the ~50 MB input, and two 1-worker jobs side by side; {load()}")
    got = interleaved(reps, {"1 worker": lambda: b.ours(shards, 1), "2 workers": lambda: b.ours(shards, 2),
                             "two 1-worker jobs side by side": lambda: side_by_side(b, shards)})
    one, two = got["1 worker"][-1].out, got["2 workers"][-1].out
    same = all((one / p.name).read_bytes() == p.read_bytes() for p in two.glob("part-*.parquet"))
    n = got["1 worker"][-1].instances
    say(f"  1 vs 2 workers byte-identical: {same}; 1 worker: {n / med([r.cpu_s for r in got['1 worker']]):,.0f} "
        f"instances per CPU-second of the whole tree (the per-core rate docs/scaling.md uses)")
    pairs = [a.wall_s / w.wall_s for a, w in zip(got["1 worker"], got["2 workers"])]
    say("  per repetition, 1-worker wall / 2-worker wall: " + ", ".join(f"{x:.2f}" for x in pairs))
    side = [r["seconds"] for r in got["two 1-worker jobs side by side"]]
    say("  per repetition, 2 x 1-worker wall / side-by-side wall (the ceiling): "
        + ", ".join(f"{2 * a.wall_s / x:.2f}" for a, x in zip(got["1 worker"], side)))
    one_w = med([r.wall_s for r in got["1 worker"]])
    p3_ratio = one_w / med([r.wall_s for r in got["2 workers"]])
    ceiling = 2 * one_w / med(side)
    ratios["P3: 1-worker wall / 2-worker wall (50 MB)"] = (p3_ratio, ">= 1.8")
    ratios["P3 ceiling on this host: 2 x 1-worker wall / wall of two 1-worker jobs side by side"] = (ceiling, "")
    ratios["P3 / its ceiling (how much of what the host gives 2 workers gets used)"] = (p3_ratio / ceiling, "")


def curve(b: Bench, docs5: list[list[str]], reps: int, ratios: dict) -> None:
    say(f"\n[P3 scale] 1x..8x the 5 MB set (2 workers, 8 shards per x); {load()}")
    runs, sizes = {}, {}
    for k in (1, 2, 4, 8):
        shards, _, mb = write_inputs(docs5 * k, b.tmp / f"x{k}", 8 * k)
        sizes[k] = mb
        runs[f"{k}x"] = (lambda s=shards: b.ours(s, 2))
    got = interleaved(reps, runs)
    base = med([r.wall_s for r in got["1x"]])
    base_mem = med([r.peak_rss_mb for r in got["1x"]])
    for k in (1, 2, 4, 8):
        w, m = med([r.wall_s for r in got[f"{k}x"]]), med([r.peak_rss_mb for r in got[f"{k}x"]])
        say(f"  {k}x ({sizes[k]:.0f} MB): wall {w:.1f} s ({w / base:.2f}x of 1x), peak RSS {m:.0f} MB "
            f"({m / base_mem:.2f}x of 1x), {sizes[k] / w:.2f} MB/s")
    w8 = med([r.wall_s for r in got["8x"]])
    ratios["P3: wall 8x / (8 * wall 1x)  (1 = linear)"] = (w8 / (8 * base), "~1")
    ratios["P3: CPU 8x / (8 * CPU 1x)  (1 = linear; start-up is a fixed part)"] = (
        med([r.cpu_s for r in got["8x"]]) / (8 * med([r.cpu_s for r in got["1x"]])), "")
    ratios["P3: peak RSS 8x / peak RSS 1x  (1 = flat)"] = (med([r.peak_rss_mb for r in got["8x"]]) / base_mem, "~1")


def shard_rates(b: Bench, books: list[Path], reps: int, ratios: dict) -> None:
    mb = sum(p.stat().st_size for p in books) / 1e6
    say(f"\n[shard] {len(books)} books, {mb:.1f} MB, 1 worker, MB per CPU-second of the whole tree; {load()}")
    runs = {"plain read (no splitting)": lambda: _plain(books)}
    for sp in ("blingfire", "syntok", "pysbd"):
        runs[sp] = (lambda sp=sp: checked(run_tree(
            [str(BIN / "bertflow"), "data", "shard", "--input", *map(str, books), "--format", "books",
             "--output-dir", str(b.tmp / f"shard-{sp}-{os.urandom(4).hex()}"), "--num-shards", "4",
             "--num-workers", "1", "--splitter", sp], env_for()), f"shard job {sp}"))
    got = interleaved(reps, runs)
    plain = med([r["seconds"] for r in got["plain read (no splitting)"]])
    say(f"  plain read: {mb / plain:.1f} MB/s per core")
    for sp in ("blingfire", "syntok", "pysbd"):
        cpu, wall = med([r.cpu_s for r in got[sp]]), med([r.wall_s for r in got[sp]])
        say(f"  shard job, {sp}: {mb / cpu:.2f} MB/s per core ({mb / wall:.2f} MB/s wall, 1 worker)")
        ratios[f"shard {sp}: MB/s per core / plain read MB/s per core"] = ((mb / cpu) / (mb / plain), "")


def _plain(books: list[Path]) -> dict:
    r = checked(run_tree([sys.executable, "-c", PLAIN_READ, *map(str, books)], env_for()), "plain read")
    return {"seconds": float(r.stdout.strip())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shared-data", default=str(REPO.parent / "shared/data"))
    ap.add_argument("--original-venv", default="/tmp/bert-original")
    ap.add_argument("--reps", type=int, default=3, help="interleaved repetitions of each small measurement")
    ap.add_argument("--original-50mb-reps", type=int, default=1, help="runs of the original at ~50 MB (slow)")
    ap.add_argument("--p3-reps", type=int, default=5,
                    help="interleaved 1-worker/2-worker pairs at ~50 MB (the ratio moves with the host's speed: "
                         "identical runs took 25.6 to 29.6 CPU-s in one session)")
    ap.add_argument("--quick", action="store_true", help="1 repetition, no 50 MB, no 8x (a smoke run)")
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {','.join(PARTS)} "
                    "(e.g. --parts startup,5mb: the quick ones)")
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    if parts - set(PARTS):
        ap.error(f"--parts: unknown {','.join(sorted(parts - set(PARTS)))}; choose from {','.join(PARTS)}")
    if args.quick:
        parts -= {"50mb", "p3", "curve"}
    gutenberg = Path(args.shared_data) / "corpus/gutenberg"
    if not gutenberg.is_dir():
        sys.exit(f"bench_data_prep: needs the Gutenberg books in {gutenberg}")
    reps = 1 if args.quick else args.reps
    tmp = Path(tempfile.mkdtemp(prefix="bench_data_prep."))
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    say(f"bench_data_prep {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; {platform.node()}: "
        f"{os.cpu_count()} cores ({cpu}), {os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGE_SIZE') / 2**30:.0f} GiB; "
        f"{load()}; seq {SEQ}, dupe {DUPE}, bert-base-uncased vocab")
    try:
        b = Bench(args, tmp)
        checked(run_tree([str(BIN / "bertflow"), "data", "vocab", "--vocab-file", str(b.vocab_txt), "--output-dir",
                          str(b.vocab_dir)], env_for()), "vocab job")
        books5 = pick_books(gutenberg, 5)
        docs5 = shard_documents(books5, tmp / "split5")
        ratios: dict = {}
        if "startup" in parts:
            startup(b, docs5, reps, ratios)
        if "5mb" in parts:
            shards5, text5, mb5 = write_inputs(docs5, tmp / "in5", 8)
            p1_p2(b, shards5, text5, mb5, reps, "5MB", ratios)
        if parts & {"50mb", "p3"}:
            docs_all = shard_documents(sorted(gutenberg.glob("*.txt")), tmp / "split_all")
            extra, total = [], sum(len(s) for d in docs_all for s in d)
            for d in docs_all:  # a second copy of some books up to ~50 MB of sentence text
                if total >= 50e6:
                    break
                extra.append(d)
                total += sum(len(s) for s in d)
            shards50, text50, mb50 = write_inputs(docs_all + extra, tmp / "in50", 16)
            if "50mb" in parts:
                p1_p2(b, shards50, text50, mb50, args.original_50mb_reps, "50MB", ratios)
            if "p3" in parts:
                p3(b, shards50, 1 if args.quick else args.p3_reps, ratios)
        if "curve" in parts:
            curve(b, docs5, max(1, reps - 1), ratios)
        if "shard" in parts:
            shard_rates(b, pick_books(gutenberg, 2), reps, ratios)
        say(f"\nRatios (medians; {load()}):")
        for k, (v, target) in ratios.items():
            say(f"  {k}: {v:.3g}" + (f"   (target {target})" if target else ""))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
