"""Training-step throughput: bert_core.BertForPreTraining against transformers.BertForPreTraining,
same architecture, same batch, same optimizer, measured in the same run.

    .venv/bin/python bench/bench_train_step.py [--preset mini] [--batch 32] [--seq 128] [--masked 20]
        [--threads 2] [--steps 5] [--device cpu|cuda]

A step is forward + MLM/NSP loss + backward + AdamW. ``masked`` positions per sequence carry MLM
labels. bert_core computes vocabulary logits only at those positions; transformers projects every
position onto the vocabulary and ignores the rest through label -100 (its only way). The figure is
tokens/s (batch x seq / median step time). bf16 autocast is measured for bert_core only. Variants alternate step by step (the machine is shared).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bert_core.config import PRESETS, preset  # noqa: E402
from bert_core.flops import flops_per_token  # noqa: E402
from bert_core.losses import pretraining_loss  # noqa: E402
from bert_core.model import BertForPreTraining, flat_positions  # noqa: E402


def make_batch(B: int, S: int, masked: int, vocab: int, device: str, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, vocab, (B, S), generator=g)
    types = torch.zeros(B, S, dtype=torch.long)
    types[:, S // 2 :] = 1
    # `masked` distinct positions per row, never [CLS] (position 0), sorted as the data jobs write them.
    pos_BP = torch.stack([torch.randperm(S - 1, generator=g)[:masked] + 1 for _ in range(B)]).sort(1).values
    labels_BP = torch.randint(1000, vocab, (B, masked), generator=g)
    hf_labels = torch.full((B, S), -100, dtype=torch.long)
    hf_labels.scatter_(1, pos_BP, labels_BP)
    batch = dict(
        input_ids=ids, token_type_ids=types, attention_mask=torch.ones(B, S, dtype=torch.long),
        mlm_positions=flat_positions(pos_BP, torch.ones_like(pos_BP, dtype=torch.bool), S),
        mlm_labels=labels_BP.reshape(-1), nsp_labels=torch.randint(0, 2, (B,), generator=g), hf_labels=hf_labels,
    )
    return {k: v.to(device) for k, v in batch.items()}


def ours_step(model, opt, batch, autocast_dtype=None) -> Callable[[], float]:
    device_type = batch["input_ids"].device.type

    def step() -> float:
        with torch.autocast(device_type, dtype=autocast_dtype or torch.float32, enabled=autocast_dtype is not None):
            out = model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"], batch["mlm_positions"])
            loss = pretraining_loss(out.mlm_logits, out.nsp_logits_B2, batch["mlm_labels"], batch["nsp_labels"]).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss.detach())

    return step


def hf_step(model, opt, batch) -> Callable[[], float]:
    def step() -> float:
        out = model(input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"],
                    attention_mask=batch["attention_mask"], labels=batch["hf_labels"],
                    next_sentence_label=batch["nsp_labels"])
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(out.loss.detach())

    return step


class Timing(NamedTuple):
    wall_s: float  # median wall-clock seconds per step
    cpu_s: float  # median CPU seconds per step of this process (less sensitive to other users' load)


def time_interleaved(steps: dict[str, Callable[[], float]], rounds: int, warmup: int, device: str) -> dict[str, Timing]:
    """Median seconds per step of each variant. Variants take turns step by step, so on a shared
    machine they all see the same background load; the median drops the odd stalled step."""
    for step in steps.values():
        for _ in range(warmup):
            step()
    wall: dict[str, list[float]] = {name: [] for name in steps}
    cpu: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            if device == "cuda":
                torch.cuda.synchronize()
            t0, c0 = time.perf_counter(), time.process_time()
            step()
            if device == "cuda":
                torch.cuda.synchronize()
            wall[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
    return {n: Timing(statistics.median(wall[n]), statistics.median(cpu[n])) for n in steps}


def _adamw(model: torch.nn.Module, device: str) -> torch.optim.Optimizer:
    # fused: one kernel for all parameters (on CPU too, since torch 2.4); the same for both models.
    return torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="mini", choices=sorted(PRESETS), help="model size (default: BERT-mini L=4 H=256)")
    p.add_argument("--batch", type=int, default=32, help="sequences per step")
    p.add_argument("--seq", type=int, default=128, help="tokens per sequence")
    p.add_argument("--masked", type=int, default=20, help="MLM positions per sequence")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    p.add_argument("--steps", type=int, default=5, help="timed steps per variant, interleaved (after 2 warm-up steps each)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where to run")
    p.add_argument("--skip-hf", action="store_true", help="only bert_core (e.g. sizes where HF is too slow)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    config = preset(args.preset)
    B, S, dev = args.batch, args.seq, args.device
    batch = make_batch(B, S, args.masked, config.vocab_size, dev)
    tokens = B * S
    print(f"config {args.preset}: L={config.num_hidden_layers} H={config.hidden_size} A={config.num_attention_heads} "
          f"V={config.vocab_size}; batch {B}x{S}, {args.masked} masked/seq, AdamW, {args.threads} threads, {dev}")

    steps: dict[str, Callable[[], float]] = {}
    if not args.skip_hf:
        import transformers

        torch.manual_seed(0)
        hf_cfg = transformers.BertConfig(**config.model_dump(exclude={"activation_checkpointing"}))
        hf = transformers.BertForPreTraining(hf_cfg).to(dev).train()
        steps["transformers fp32"] = hf_step(hf, _adamw(hf, dev), batch)
    for name, dtype in (("bert_core fp32", None), ("bert_core bf16 autocast", torch.bfloat16)):
        torch.manual_seed(0)
        model = BertForPreTraining(config).to(dev).train()
        steps[name] = ours_step(model, _adamw(model, dev), batch, dtype)
    results = time_interleaved(steps, args.steps, 2, dev)

    frac = args.masked / S
    for name, t in results.items():
        f = flops_per_token(config, S, 1.0 if name.startswith("transformers") else frac)
        print(f"{name:24s} {t.wall_s:7.3f} s/step {tokens / t.wall_s:9,.0f} tokens/s "
              f"{tokens / t.wall_s * f / 1e9:7.1f} GFLOP/s (model)   cpu {t.cpu_s:7.3f} s/step")
    if "transformers fp32" in results:
        base = results["transformers fp32"]
        for name in ("bert_core fp32", "bert_core bf16 autocast"):
            print(f"speed-up {name} / transformers fp32: {base.wall_s / results[name].wall_s:.2f}x wall-clock, "
                  f"{base.cpu_s / results[name].cpu_s:.2f}x CPU time")
    return 0


if __name__ == "__main__":
    sys.exit(main())
