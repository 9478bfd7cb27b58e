"""Continual pretraining measured on the shared corpus (issue 25): the corpus cut into snapshots
(books, then Wikipedia, then WikiText) plus two junk snapshots (one Wikipedia file four times over:
mass-duplicated text; books with every document's words shuffled), decided by one firing of ``bertflow continual``.

Prints, from the records the flow wrote (its per-firing tables are copied beside the result, unedited):
- per snapshot: the decision and reason, held-out MLM loss of the promoted model (before) and the
  candidate (after) on every snapshot's held-out documents;
- each continued candidate against from-scratch runs on the same training data (the same instances
  file), scored on the same held-out documents: one with the candidate's own steps (the compute a
  firing spends), one with its whole lineage's (first_train's steps plus train's steps per continued
  snapshot: retraining on the new data instead of continuing); and one with the lineage's steps on the
  training instances of every snapshot of its lineage, all of each (retraining on the accumulated corpus,
  what a team without continual pretraining does);
- the firing's whole process tree (wall, CPU, peak RSS), and each snapshot's overhead beyond its
  training stage (firing seconds minus train seconds, from the firing record);
- the no-new-data firing against the same command's ``--help`` (the process start-up it cannot avoid),
  interleaved, whole process trees; and once through Prefect's temporary API (its start-up included).

    .venv/bin/python bench/bench_continual.py [--first-steps 2000] [--steps 600] [--baselines own,lineage,every]
                                              [--out FILE] [--tables DIR]
"""
from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(REPO))
from treemeter import emit, run_tree  # noqa: E402

PY = str(REPO / ".venv" / "bin" / "python") if (REPO / ".venv" / "bin" / "python").exists() else sys.executable
DATA = REPO.parent / "shared" / "data" / "corpus"
BOOKS = ["pg11_alice_in_wonderland", "pg74_tom_sawyer", "pg84_frankenstein", "pg174_dorian_gray",
         "pg27761_hamlet", "pg2591_grimms_fairy_tales", "pg1661_sherlock_holmes", "pg45_anne_of_green_gables",
         "pg76_huckleberry_finn", "pg205_walden", "pg1342_pride_and_prejudice", "pg768_wuthering_heights",
         "pg1727_odyssey", "pg6130_iliad", "pg1260_jane_eyre", "pg2554_crime_and_punishment"]
SHUFFLED = ["pg345_dracula", "pg98_tale_of_two_cities", "pg1400_great_expectations", "pg514_little_women"]


def snapshots(src: Path) -> list[str]:
    """The snapshot folders, in the order their names sort."""
    plan = {"2026-01-books": [DATA / "gutenberg" / f"{b}.txt" for b in BOOKS],
            "2026-02-wikipedia": sorted((DATA / "wikipedia_mlperf").iterdir()),
            "2026-03-wikitext": [DATA / "wikitext2" / "wiki.valid.tokens"]}
    for name, files in plan.items():
        (src / name).mkdir(parents=True)
        for f in files:
            shutil.copy(f, src / name / f.name)
    # Mass-duplicated: one Wikipedia file four times over (a crawler that fetched it again and again).
    (src / "2026-04-duplicated").mkdir()
    for i in range(4):
        shutil.copy(DATA / "wikipedia_mlperf" / "wiki_02", src / "2026-04-duplicated" / f"wiki_02_{i}")
    # Shuffled words: four other books cut into documents of 40 lines, each document's words shuffled.
    rng = random.Random(0)
    junk = src / "2026-05-shuffled-words"
    junk.mkdir()
    with open(junk / "shuffled.jsonl", "w", encoding="utf-8") as out:
        for b in SHUFFLED:
            lines = (DATA / "gutenberg" / f"{b}.txt").read_text(encoding="utf-8-sig").splitlines()
            for i in range(0, len(lines), 40):
                words = " ".join(lines[i:i + 40]).split()
                if len(words) > 50:
                    rng.shuffle(words)
                    out.write(json.dumps({"id": f"{b}-{i}", "text": " ".join(words)}) + "\n")
    return sorted(p.name for p in src.iterdir())


def config(src: Path, out: Path, first_steps: int, steps: int) -> dict:
    common = {"model": "tiny", "max_seq_length": 128, "micro_batch_size": 32, "log_every": 50, "tensorboard": False}
    return {
        "source": str(src), "output_root": str(out),
        "shard": {"num_shards": 4, "num_workers": 2},
        "vocab": {"vocab_size": 8000},
        "instances": {"max_seq_length": 128, "max_predictions_per_seq": 20, "dupe_factor": 2, "num_workers": 2},
        "replay": 0.25,
        "train": {**common, "max_steps": steps, "save_every": steps, "lr": 5e-4, "warmup_proportion": 0.1},
        "first_train": {**common, "max_steps": first_steps, "save_every": first_steps, "lr": 1e-3,
                        "warmup_proportion": 0.1},
        "intrinsic": {"batch_size": 64, "max_batches": 16, "use_ray": False, "show_progress": False},
    }


def every_snapshot(cfg, rec: dict, lineage: list[str], firings, work: Path) -> str:
    """The training instances of the candidate's snapshot and of every earlier snapshot of its lineage, all
    of each (mix weight 1): what a team that retrains from scratch on its accumulated corpus trains on."""
    from data_jobs.config import MixConfig
    from flows.continual import _direct
    from flows.stages import DataStage

    sources = [rec["train_instances"]] + [firings.read(s)["train_instances"] for s in lineage]
    mix = MixConfig(sources=sources, weights=[1.0] * len(sources), seed=cfg.seed,
                    output_dir=str(work / "every-snapshot" / rec["snapshot"]))
    _direct(DataStage("mix", mix, cfg.orchestration.ray_job_address, cfg.orchestration.job_python))
    return mix.output_dir


def from_scratch(cfg, rec: dict, steps: int, work: Path, data_dir: str | None = None) -> dict[str, float]:
    """A from-scratch run of ``steps`` on the candidate's own training data (or ``data_dir``), scored like
    the candidate."""
    from bert_core.export import export_checkpoint
    from bert_core.launch import launch
    from bert_core.train_config import TrainConfig
    from flows.continual import _direct, heldout_loss, root_of

    spec = cfg.first_train.model_dump(mode="python")
    run = work / "scratch" / rec["snapshot"]
    tcfg = TrainConfig.model_validate({**spec, "max_steps": steps, "save_every": steps,
                                       "data_dir": data_dir or rec["data_dir"], "output_dir": str(run)})
    launch(tcfg, False, log=lambda line: None)
    hf = work / "scratch-hf" / rec["snapshot"]
    export_checkpoint(str(run), str(hf))
    return {s: heldout_loss(cfg, root_of(cfg), str(hf), rec_held, _direct)
            for s, rec_held in rec["heldout_sets"].items()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--first-steps", type=int, default=2000, help="first model's steps (from scratch)")
    p.add_argument("--steps", type=int, default=600, help="steps of each continued run")
    p.add_argument("--rounds", type=int, default=3, help="no-new-data firings (each beside a --help)")
    p.add_argument("--baselines", default="own,lineage,every",
                   help="from-scratch runs per candidate, comma-separated: own (the candidate's steps), lineage (the "
                        "lineage's steps, same data), every (the lineage's steps on every snapshot's training data)")
    p.add_argument("--out", help="also write the report here")
    p.add_argument("--tables", help="copy the flow's per-firing tables (reports/*.md) into this folder")
    args = p.parse_args()
    if not DATA.is_dir():
        raise SystemExit(f"needs the shared corpus at {DATA}")
    work = Path(tempfile.mkdtemp(prefix="bench-continual-"))
    load0 = open("/proc/loadavg").read().split()[0]
    lines = [f"bench_continual: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, tiny model, seq 128, "
             f"first model {args.first_steps} steps, each continued run {args.steps} steps, replay 0.25, "
             f"from-scratch baselines {args.baselines}, "
             f"load at start {load0}"]
    try:
        from flows.continual import ContinualConfig, Firings
        from flows.registry import Registry

        names = snapshots(work / "src")
        data = config(work / "src", work / "out", args.first_steps, args.steps)
        cfg_file = work / "continual.yaml"
        cfg_file.write_text(yaml.safe_dump(data))
        cfg = ContinualConfig.model_validate(data)
        firing = run_tree([PY, "-m", "flows.continual", "--config", str(cfg_file), "--no-prefect"], cwd=str(REPO))
        if firing.returncode != 0:
            raise SystemExit(f"firing exited {firing.returncode}:\n{firing.stderr[-3000:]}")
        lines.append(f"firing of {len(names)} snapshots (whole process tree): wall {firing.wall_s:.1f} s, "
                     f"CPU {firing.cpu_s:.1f} s, peak RSS {firing.peak_rss_mb:.0f} MB")
        firings, reg = Firings(work / "out"), Registry(str(work / "out" / "registry"))
        recs = [firings.read(n) for n in names]
        lines.append("")
        lines.append("per snapshot: decision; held-out MLM loss (nats) promoted -> candidate on each snapshot's "
                     "held-out documents; seconds")
        for rec in recs:
            lines.append(f"{rec['snapshot']}: {rec['decision']} ({rec['reason']})")
            lines.append(f"    documents read {rec['documents_read']}, kept {rec['documents_kept']}, dropped "
                         f"{rec['dropped'] or 'none'}")
            cand, prom = (rec.get("losses") or {}).get("candidate", {}), (rec.get("losses") or {}).get("promoted", {})
            for s, v in cand.items():
                before = f"{prom[s]:.4f}" if s in prom else "—"
                lines.append(f"    held-out {s}{' (new)' if s == rec['snapshot'] else ''}: {before} -> {v:.4f}")
            sec = rec["seconds"]
            train = sec.get("train", 0.0)
            lines.append(f"    seconds: firing {sec['firing']:.1f}, train {train:.1f}, overhead beyond training "
                         f"{sec['firing'] - train:.1f}" + (f" ({(sec['firing'] - train) / train:.2f}x the training "
                                                            "time)" if train else "")
                         + "; by stage " + ", ".join(f"{k} {v:.1f}" for k, v in sec.items() if k != "firing"))
        # From scratch, for every continued candidate: with the candidate's own steps (the compute a firing
        # spends), with its whole lineage's (retraining on the new data instead of continuing), and with the
        # lineage's on every snapshot's training data (retraining on the accumulated corpus).
        wanted = set(args.baselines.split(","))
        lines.append("")
        lines.append("continued candidate vs from scratch (on the candidate's training data unless said), same "
                     "held-out documents (nats; difference = continued - from scratch):")
        for rec in recs:
            if not rec.get("losses") or rec.get("parent") is None:
                continue
            entry = reg.get(rec["model"])
            lineage = args.first_steps + args.steps * (len(entry.snapshots) - 1)
            rec["heldout_sets"] = {rec["snapshot"]: rec["heldout_instances"],
                                   **{s: firings.read(s)["heldout_instances"] for s in entry.snapshots[:-1]}}
            cand = rec["losses"]["candidate"]
            union = every_snapshot(cfg, rec, entry.snapshots[:-1], firings, work) if "every" in wanted else None
            for key, steps, what, data_dir in (
                    ("own", args.steps, "the candidate's own compute", None),
                    ("lineage", lineage, "the lineage's compute", None),
                    ("every", lineage, "the lineage's compute on every snapshot's training data", union)):
                if key not in wanted:
                    continue
                scratch = from_scratch(cfg, rec, steps, work / f"scratch-{steps}-{'every' if data_dir else 'own'}",
                                       data_dir)
                for s, v in scratch.items():
                    lines.append(f"    {rec['snapshot']} candidate, held-out {s}{' (new)' if s == rec['snapshot'] else ''}: "
                                 f"continued {cand[s]:.4f}, from scratch with {what} ({steps} steps) {v:.4f}, "
                                 f"difference {cand[s] - v:+.4f}")
        # The no-new-data firing, beside the same command's --help (start-up), interleaved.
        lines.append("")
        idle, helps = [], []
        for r in range(args.rounds):
            pair = [("idle", [PY, "-m", "flows.continual", "--config", str(cfg_file), "--no-prefect"]),
                    ("help", [PY, "-m", "flows.continual", "--help"])]
            for name, cmd in (pair if r % 2 == 0 else pair[::-1]):
                t = run_tree(cmd, cwd=str(REPO))
                if t.returncode != 0:
                    raise SystemExit(f"{' '.join(cmd)} exited {t.returncode}:\n{t.stderr[-2000:]}")
                (idle if name == "idle" else helps).append(t)
        best = lambda runs: min(runs, key=lambda t: t.wall_s)
        i, h = best(idle), best(helps)
        lines.append(f"no-new-data firing (--no-prefect, best of {args.rounds}): wall {i.wall_s:.2f} s, CPU {i.cpu_s:.2f} s; "
                     f"--help: wall {h.wall_s:.2f} s, CPU {h.cpu_s:.2f} s; ratio {i.wall_s / h.wall_s:.2f}x wall")
        pf = run_tree([PY, "-m", "flows.continual", "--config", str(cfg_file)], cwd=str(REPO))
        lines.append(f"no-new-data firing as a Prefect flow on the temporary local API (its start-up included): "
                     f"wall {pf.wall_s:.1f} s, CPU {pf.cpu_s:.1f} s, exit {pf.returncode}")
        lines.append(f"load at end {open('/proc/loadavg').read().split()[0]}")
        if args.tables:
            dest = Path(args.tables)
            dest.mkdir(parents=True, exist_ok=True)
            for md in sorted((work / "out" / "continual" / "reports").glob("*.md")):
                shutil.copy(md, dest / md.name)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    emit(lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
