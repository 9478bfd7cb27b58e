"""Step rates behind the cpu-tiny recipe's budget (docs/recipe.md): pretraining steps of the tiny and mini
presets (seq 128 and seq 512) and GLUE fine-tuning steps (batch 32) of mini and of MiniLM's shape
(6 layers, hidden 384), on this machine. Variants alternate round by round (the machine is shared);
the figure is the median seconds per step over rounds.

    .venv/bin/python bench/bench_recipe_budget.py [--rounds 3] [--steps 2] [--threads 2]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bert_core.config import ModelConfig, preset  # noqa: E402
from bert_core.heads import BertForSequenceClassification  # noqa: E402
from bert_core.losses import pretraining_loss  # noqa: E402
from bert_core.model import BertForPreTraining, flat_positions  # noqa: E402

VOCAB = 30522  # the recipe adopts bert-base-uncased's vocab
MINILM = dict(num_hidden_layers=6, hidden_size=384, num_attention_heads=12, intermediate_size=1536)


def _ids(B: int, S: int):
    g = torch.Generator().manual_seed(0)
    ids_BS = torch.randint(1000, VOCAB, (B, S), generator=g)
    return ids_BS, torch.zeros(B, S, dtype=torch.long), torch.ones(B, S, dtype=torch.long)


def pretrain_step(config: ModelConfig, B: int, S: int, P: int):
    model = BertForPreTraining(config)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids_BS, types_BS, mask_BS = _ids(B, S)
    pos_BP = torch.stack([torch.randperm(S - 1)[:P] + 1 for _ in range(B)]).sort(1).values
    labels_M = torch.randint(1000, VOCAB, (B * P,))
    flat_M = flat_positions(pos_BP, torch.ones_like(pos_BP, dtype=torch.bool), S)
    nsp_B = torch.randint(0, 2, (B,))

    def step():
        out = model(ids_BS, types_BS, mask_BS, flat_M)
        loss = pretraining_loss(out.mlm_logits, out.nsp_logits_B2, labels_M, nsp_B).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    return step


def finetune_step(config: ModelConfig, B: int, S: int):
    model = BertForSequenceClassification(config, num_labels=2)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-5)
    ids_BS, types_BS, mask_BS = _ids(B, S)
    y_B = torch.randint(0, 2, (B,))

    def step():
        logits = model(input_ids=ids_BS, token_type_ids=types_BS, attention_mask=mask_BS)
        loss = torch.nn.functional.cross_entropy(logits, y_B)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return step


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    variants = {
        "pretrain tiny  B32 S128": pretrain_step(preset("tiny", vocab_size=VOCAB), 32, 128, 20),
        "pretrain mini  B32 S128": pretrain_step(preset("mini", vocab_size=VOCAB), 32, 128, 20),
        "pretrain mini  B8  S512": pretrain_step(preset("mini", vocab_size=VOCAB), 8, 512, 80),
        "finetune mini  B32 S64": finetune_step(preset("mini", vocab_size=VOCAB), 32, 64),
        "finetune MiniLM B32 S64": finetune_step(preset("mini", **MINILM, vocab_size=VOCAB), 32, 64),
    }
    times: dict[str, list[float]] = {k: [] for k in variants}
    for name, fn in variants.items():  # warm-up: allocator, first-call overheads
        fn()
        print(f"  warmed {name}", flush=True)
    for _ in range(a.rounds):
        for name, fn in variants.items():
            t0 = time.perf_counter()
            for _ in range(a.steps):
                fn()
            times[name].append((time.perf_counter() - t0) / a.steps)
            print(f"  {name}: {times[name][-1]:.3f} s/step", flush=True)
    for name, ts in times.items():
        s = statistics.median(ts)
        print(f"{name}: {s:.3f} s/step  ({1 / s:.2f} steps/s; rounds {[round(t, 3) for t in ts]})")


if __name__ == "__main__":
    main()
