"""Our trainer against a reference (issue 26): ``bertflow train`` and Hugging Face
``transformers.BertForPreTraining`` in a plain PyTorch loop, trained on the same instance files with
the same config (batch, lr, warmup, linear schedule, steps, fp32, weight-decay rule, gradient clip,
seed), both scored on the same held-out rows; and their step times, measured in the same run.

- Data: the shared corpus's three Wikipedia files (``--docs small``: the first documents of wiki_00,
  for quick checks) -> shards -> WordPiece vocab -> training instances (one shard held out) and
  held-out instances (that shard, another masking seed), with the data jobs' CLIs.
- Ours: ``bertflow train --config`` with max_steps = --steps-b and a checkpoint every --steps-a.
- Reference: this file with ``--reference-worker CONFIG``, reading the same TrainConfig YAML:
  ``BertForPreTraining(BertConfig)`` of the config's architecture, seeded with the same seed but
  initialised by transformers itself; torch AdamW on ``bert_core.optim.param_groups`` (no decay on
  biases and LayerNorm, as ours); ``get_linear_schedule_with_warmup``; the same clip; rows of
  bertflow's ``InstanceDataset`` in a seeded ``torch.Generator`` permutation (each row once per
  epoch), collated by ``InstanceDataset.collate`` and turned into transformers' inputs (labels -100
  except at masked positions; padded to the batch's longest row). It saves ``save_pretrained`` +
  vocab.txt at both step counts; those directories are imported (``bertflow import``'s function).
- Scores: held-out MLM loss (``evaluation.intrinsic``: the same evenly spaced rows for every model)
  of both at --steps-a and --steps-b; the aim is ours <= reference + 0.05 nats.
- Step time: --rounds rounds of --timing-steps steps each, ours and the reference taking turns (which
  goes first alternates), each a whole process tree (treemeter.run_tree); per step from the steady
  part (the metrics.jsonl line times between the first log line and the last step).

    .venv/bin/python bench/bench_reference_trainer.py [--steps-a 1000] [--steps-b 2000] [--docs full|small]
        [--rounds 3] [--timing-steps 100] [--out FILE]
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(REPO))
from treemeter import TreeRun, emit, run_tree  # noqa: E402

PY = str(REPO / ".venv" / "bin" / "python") if (REPO / ".venv" / "bin" / "python").exists() else sys.executable
BERTFLOW = str(Path(PY).parent / "bertflow")
DATA = REPO.parent / "shared" / "data" / "corpus"
WIKI = DATA / "wikipedia_mlperf"
SMALL_LINES = 300  # --docs small: wiki_00 up to the first </doc> line at or after this line
HELDOUT_SEED = 987654321  # masking seed of the held-out instances (the training instances keep the default)


def load() -> str:
    return open("/proc/loadavg").read().split()[0]


def inputs(work: Path, docs: str) -> Path:
    """The corpus to shard: the Wikipedia folder, or (small) the first documents of wiki_00."""
    if docs == "full":
        return WIKI
    src = work / "src"
    src.mkdir()
    kept = []
    with open(WIKI / "wiki_00", encoding="utf-8") as fh:
        for line in fh:
            kept.append(line)
            if len(kept) >= SMALL_LINES and line.strip() == "</doc>":
                break
    (src / "wiki_00").write_text("".join(kept), encoding="utf-8")
    return src


def checked(cmd: list[str]) -> None:
    done = subprocess.run(cmd, cwd=str(REPO), capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stderr[-3000:]}")


def prepare(work: Path, docs: str) -> tuple[Path, Path]:
    """(training instances, held-out instances), made by the data jobs' CLIs."""
    shards, vocab, train, held = work / "shards", work / "vocab", work / "train", work / "heldout"
    checked([PY, "-m", "data_jobs.shard_job", "--inputs", str(inputs(work, docs)), "--input-format", "wikiextractor",
             "--output-dir", str(shards), "--engine", "local", "--num-workers", "2", "--num-shards", "4"])
    checked([PY, "-m", "data_jobs.vocab_job", "--shards-dir", str(shards), "--output-dir", str(vocab),
             "--vocab-size", "8000"])
    common = [PY, "-m", "data_jobs.instances_job", "--shards-dir", str(shards), "--vocab-dir", str(vocab),
              "--max-seq-length", "128", "--max-predictions-per-seq", "20", "--dupe-factor", "2", "--engine", "local",
              "--num-workers", "2", "--heldout-shards", "1"]
    checked(common + ["--output-dir", str(train), "--split", "train"])
    checked(common + ["--output-dir", str(held), "--split", "heldout", "--seed", str(HELDOUT_SEED)])
    return train, held


def write_config(args, data: Path, run: Path, steps: int, save_every: int, path: Path) -> Path:
    """One TrainConfig YAML, read by ``bertflow train`` and by the reference worker alike."""
    path.write_text(yaml.safe_dump({
        "model": args.model, "data_dir": str(data), "output_dir": str(run), "max_seq_length": 128,
        "micro_batch_size": args.batch, "lr": args.lr, "warmup_proportion": args.warmup, "schedule": "linear",
        "weight_decay": 0.01, "clip_grad_norm": 1.0, "max_steps": steps, "save_every": save_every,
        "keep_last": steps // save_every + 1, "log_every": args.log_every, "seed": args.seed, "precision": "fp32",
        "tensorboard": False,
    }))
    return path


def ours(config: Path) -> list[str]:
    return [BERTFLOW, "train", "--config", str(config)]


def reference(config: Path) -> list[str]:
    return [PY, str(Path(__file__).resolve()), "--reference-worker", str(config)]


def measured(cmd: list[str]) -> TreeRun:
    run = run_tree(cmd, cwd=str(REPO))
    if run.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {run.returncode}:\n{run.stderr[-3000:]}")
    return run


def steady_step_s(run: Path) -> float:
    """Seconds per step between the first and the last metrics.jsonl line (start-up and the first
    log_every steps left out)."""
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    first, last = lines[0], lines[-1]
    return (last["time"] - first["time"]) / (last["step"] - first["step"])


def heldout(model_path: Path, held: Path, out: Path, args) -> dict[int, dict]:
    """{step: curve point} of every checkpoint of ``model_path`` on the held-out instances."""
    from evaluation.config import IntrinsicConfig
    from evaluation.intrinsic import run_intrinsic

    res = run_intrinsic(IntrinsicConfig(model_path=str(model_path), instances_dir=str(held), output_dir=str(out),
                                        batch_size=args.eval_batch, max_batches=args.eval_batches, use_ray=False,
                                        show_progress=False))
    return {p["step"]: p for p in res["curve"]}


def hf_batch(ds, rows) -> dict:
    """bertflow's collated rows as transformers' inputs, padded to the batch's longest row."""
    import torch

    from bert_core.losses import NO_SENTENCE_TASK

    b = ds.collate(rows, ds.max_seq_length)
    B, S = b["input_ids"].shape
    labels = torch.full((B * S,), -100, dtype=torch.long)  # transformers' ignore index
    labels[b["mlm_positions"]] = b["mlm_labels"]  # mlm_positions: flat indices into the B*S tokens
    L = int(b["attention_mask"].sum(1).max())
    return {"input_ids": b["input_ids"][:, :L], "token_type_ids": b["token_type_ids"][:, :L],
            "attention_mask": b["attention_mask"][:, :L], "labels": labels.view(B, S)[:, :L],
            "next_sentence_label": b["nsp_labels"].masked_fill(b["nsp_labels"] == NO_SENTENCE_TASK, -100)}


def reference_worker(config_path: str) -> int:
    """The reference loop: transformers.BertForPreTraining trained on the TrainConfig ours runs."""
    import torch
    import transformers

    from bert_core.loader import InstanceDataset
    from bert_core.optim import param_groups
    from bert_core.train import _checked_vocab
    from bert_core.train_config import TrainConfig
    from contracts.common import build_config, load_yaml

    cfg = build_config(TrainConfig, load_yaml(config_path), config_path)
    if (cfg.optimizer, cfg.schedule, cfg.precision, cfg.grad_accum_steps, cfg.engine) != ("adamw", "linear", "fp32",
                                                                                          1, "torch"):
        raise SystemExit("the reference loop runs AdamW, a linear schedule, fp32, no accumulation, one process")
    ds = InstanceDataset(cfg.data_dir)
    vocab = _checked_vocab(ds)
    mc = cfg.build_model_config(ds.vocab_size)
    torch.manual_seed(cfg.seed)
    hf_config = transformers.BertConfig(**mc.model_dump(exclude={"activation_checkpointing"}))
    model = transformers.BertForPreTraining(hf_config)
    model.train()
    opt = torch.optim.AdamW(param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=cfg.betas, eps=cfg.eps)
    sched = transformers.get_linear_schedule_with_warmup(opt, cfg.warmup_steps(), cfg.max_steps)
    gen = torch.Generator().manual_seed(cfg.seed)
    B, order, at = cfg.micro_batch_size, None, len(ds)
    run = Path(cfg.output_dir)
    run.mkdir(parents=True)
    with open(run / "metrics.jsonl", "w", encoding="utf-8") as log:
        for step in range(1, cfg.max_steps + 1):
            if at + B > len(ds):  # a new epoch: every row once, the tail that fills no batch left out
                order, at = torch.randperm(len(ds), generator=gen).numpy(), 0
            loss = model(**hf_batch(ds, order[at:at + B])).loss
            at += B
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.clip_grad_norm > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_grad_norm)
            lr = sched.get_last_lr()[0]
            opt.step()
            sched.step()
            if step % cfg.log_every == 0:
                log.write(json.dumps({"step": step, "loss": float(loss), "lr": lr, "time": time.time()}) + "\n")
                log.flush()
            if step % cfg.save_every == 0 or step == cfg.max_steps:
                model.save_pretrained(run / f"hf-step{step}")
                shutil.copyfile(vocab, run / f"hf-step{step}" / "vocab.txt")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps-a", type=int, default=1000, help="first scored step count (a checkpoint of each run)")
    p.add_argument("--steps-b", type=int, default=2000, help="second scored step count (the runs' max_steps)")
    p.add_argument("--docs", choices=["full", "small"], default="full",
                   help="full: the three Wikipedia files; small: the first documents of wiki_00 (quick checks)")
    p.add_argument("--model", default="tiny", help="bertflow model preset (the reference is built to its shape)")
    p.add_argument("--batch", type=int, default=32, help="micro batch = global batch (one process, no accumulation)")
    p.add_argument("--lr", type=float, default=1e-3, help="peak learning rate")
    p.add_argument("--warmup", type=float, default=0.1, help="warmup proportion of max_steps")
    p.add_argument("--seed", type=int, default=42, help="seed of both runs (each framework's own init)")
    p.add_argument("--log-every", type=int, default=10, help="metrics line every N steps (step times read them)")
    p.add_argument("--eval-batch", type=int, default=64, help="held-out rows per batch")
    p.add_argument("--eval-batches", type=int, default=32, help="held-out batches (an evenly spaced sample)")
    p.add_argument("--rounds", type=int, default=3, help="timing rounds (ours and the reference each once)")
    p.add_argument("--timing-steps", type=int, default=100, help="steps of each timing run")
    p.add_argument("--out", help="also write the report here")
    p.add_argument("--reference-worker", metavar="CONFIG", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.reference_worker:
        return reference_worker(args.reference_worker)
    if not 0 < args.steps_a < args.steps_b:
        raise SystemExit("needs 0 < --steps-a < --steps-b")
    if args.timing_steps <= args.log_every:
        raise SystemExit("--timing-steps must exceed --log-every (the steady part starts at the first log line)")
    if not WIKI.is_dir():
        raise SystemExit(f"needs the shared corpus's Wikipedia files at {WIKI}")
    a, b = args.steps_a, args.steps_b
    work = Path(tempfile.mkdtemp(prefix="bench-reference-"))
    load0 = load()
    try:
        from bert_core.export import import_hf
        from bert_core.loader import InstanceDataset

        train, held = prepare(work, args.docs)
        train_ds = InstanceDataset(train)
        lines = [f"bench_reference_trainer: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, docs {args.docs} "
                 f"({len(train_ds)} training instances, {len(InstanceDataset(held))} held-out), {args.model} model, "
                 f"vocab {train_ds.vocab_size}, seq 128, batch {args.batch}, lr {args.lr}, warmup {args.warmup} then "
                 f"linear decay, weight decay 0.01 (not biases/LayerNorm), clip 1.0, fp32, seed {args.seed}, {a} and "
                 f"{b} steps, load at start {load0}",
                 "seed policy: the same seed, each framework its own init (bertflow: truncated normal within 2 std; "
                 "transformers: normal) and its own data order (bertflow: length-binned block shuffle, padded to the "
                 "bin; reference: torch.Generator permutation of all rows, padded to the batch's longest row)",
                 "other differences: transformers' warmup starts at lr 0 (step/warmup, ours (step+1)/warmup; the same "
                 "after warmup); transformers projects every position onto the vocabulary, ours the masked ones only"]
        runs = {"ours": work / "ours", "reference": work / "reference"}
        walls = {}
        for name, cmd in (("ours", ours), ("reference", reference)):
            cfg = write_config(args, train, runs[name], b, a, work / f"{name}.yaml")
            walls[name] = measured(cmd(cfg))
        lines.append("convergence runs, one after the other (whole process tree): " + "; ".join(
            f"{n} wall {t.wall_s:.1f} s, CPU {t.cpu_s:.1f} s, peak RSS {t.peak_rss_mb:.0f} MB" for n, t in walls.items()))
        ours_points = heldout(runs["ours"], held, work / "eval" / "ours", args)
        lines.append("")
        lines.append(f"held-out MLM loss (nats; the same {args.eval_batches} x {args.eval_batch} rows at most, "
                     "bert_core's forward for both; aim: ours <= reference + 0.05):")
        for s in (a, b):
            imported = import_hf(runs["reference"] / f"hf-step{s}", work / "imported" / f"step{s}")
            ref = heldout(imported, held, work / "eval" / f"reference-{s}", args)[0]
            mine = ours_points[s]
            diff = mine["mlm_loss"] - ref["mlm_loss"]
            lines.append(f"    step {s}: ours {mine['mlm_loss']:.4f} (acc {mine['mlm_acc']:.3f}), reference "
                         f"{ref['mlm_loss']:.4f} (acc {ref['mlm_acc']:.3f}), difference {diff:+.4f}: aim "
                         f"{'met' if diff <= 0.05 else 'NOT met'} ({mine['mlm_count']} masked tokens)")
        # Step time: short runs taking turns, so both see the same background load.
        lines.append("")
        lines.append(f"step time, {args.rounds} rounds of {args.timing_steps}-step runs taking turns (steady: "
                     f"metrics line times from step {args.log_every} to {args.timing_steps}; whole process tree):")
        steady: dict[str, list[float]] = {"ours": [], "reference": []}
        ratios: list[float] = []
        for r in range(args.rounds):
            pair = [("ours", ours), ("reference", reference)]
            row = []
            for name, cmd in (pair if r % 2 == 0 else pair[::-1]):
                run = work / "timing" / f"{name}-{r}"
                cfg = write_config(args, train, run, args.timing_steps, args.timing_steps, work / f"timing-{name}.yaml")
                t = measured(cmd(cfg))
                steady[name].append(steady_step_s(run))
                row.append(f"{name} {steady[name][-1] * 1000:.1f} ms/step (wall {t.wall_s:.1f} s, CPU {t.cpu_s:.1f} s)")
            ratios.append(steady["ours"][-1] / steady["reference"][-1])
            lines.append(f"    round {r + 1}: " + ", ".join(row) + f"; ratio ours/reference {ratios[-1]:.2f}")
        # The ratio of each round's adjacent pair: background load drifts between rounds, less within one.
        lines.append(f"median: ours {statistics.median(steady['ours']) * 1000:.1f} ms/step, reference "
                     f"{statistics.median(steady['reference']) * 1000:.1f} ms/step; ratio ours/reference, median of "
                     f"the rounds' ratios: {statistics.median(ratios):.2f}")
        lines.append(f"load at end {load()}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    emit(lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
