"""Step costs behind the cpu-tiny recipe's budget (docs/recipe.md): its pretraining step (BERT-tiny,
2 x 128, batch 32 x seq 128, 20 masked positions) and GLUE fine-tuning steps (batch 32, seq 40: SST-2's
batches after trimming) of BERT-tiny and of MiniLM's shape (6 x 384), each under four settings:
fp32 or bf16 autocast, on 1 thread or on all of ``--threads``.

The baseline is what the recipe ran with before (fp32, 1 thread); every other setting is printed as a
ratio of the baseline's seconds per step. Settings alternate step by step within each round and rounds
repeat (the machine is shared), so a load spike hits all settings alike; the figure is the median. After
each switch of settings one step runs unmeasured (a thread pool that changed size, first bf16 kernels).

    .venv/bin/python bench/bench_recipe_budget.py [--rounds 5] [--steps 3] [--threads 2] [--quick]
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bert_core.config import ModelConfig  # noqa: E402
from bert_core.heads import BertForSequenceClassification  # noqa: E402
from bert_core.losses import classification_loss, pretraining_loss  # noqa: E402
from bert_core.model import BertForPreTraining, flat_positions  # noqa: E402

VOCAB = 30522  # the recipe adopts bert-base-uncased's vocab
TINY = dict(num_hidden_layers=2, hidden_size=128, num_attention_heads=2, intermediate_size=512)  # the recipe's
MINILM = dict(num_hidden_layers=6, hidden_size=384, num_attention_heads=12, intermediate_size=1536)


def _config(shape: dict) -> ModelConfig:
    return ModelConfig(**shape, vocab_size=VOCAB)


def _ids(B: int, S: int):
    g = torch.Generator().manual_seed(0)
    ids_BS = torch.randint(1000, VOCAB, (B, S), generator=g)
    return ids_BS, torch.zeros(B, S, dtype=torch.long), torch.ones(B, S, dtype=torch.long)


def _autocast(precision: str):
    return torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16" else contextlib.nullcontext()


def pretrain_step(shape: dict, B: int, S: int, P: int) -> Callable[[str], None]:
    model = BertForPreTraining(_config(shape))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids_BS, types_BS, mask_BS = _ids(B, S)
    pos_BP = torch.stack([torch.randperm(S - 1)[:P] + 1 for _ in range(B)]).sort(1).values
    labels_M = torch.randint(1000, VOCAB, (B * P,))
    flat_M = flat_positions(pos_BP, torch.ones_like(pos_BP, dtype=torch.bool), S)
    nsp_B = torch.randint(0, 2, (B,))

    def step(precision: str) -> None:
        with _autocast(precision):  # as bert_core.engine.TorchEngine runs a step
            out = model(ids_BS, types_BS, mask_BS, flat_M)
            loss = pretraining_loss(out.mlm_logits, out.nsp_logits_B2, labels_M, nsp_B).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    return step


def finetune_step(shape: dict, B: int, S: int) -> Callable[[str], None]:
    model = BertForSequenceClassification(_config(shape), num_labels=2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids_BS, types_BS, mask_BS = _ids(B, S)
    y_B = torch.randint(0, 2, (B,))

    def step(precision: str) -> None:
        with _autocast(precision):  # as evaluation.finetune.fit runs a step
            loss = classification_loss(model(input_ids=ids_BS, token_type_ids=types_BS, attention_mask=mask_BS), y_B)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return step


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=3, help="steps per setting per round")
    p.add_argument("--threads", type=int, default=2, help="the 'all threads' settings (the recipe's: the cores)")
    p.add_argument("--quick", action="store_true", help="BERT-tiny shapes only, 1 round of 1 step (a smoke run)")
    a = p.parse_args(argv)
    if a.quick:
        a.rounds, a.steps = 1, 1
    torch.manual_seed(0)
    workloads = {"pretrain BERT-tiny B32 S128": pretrain_step(TINY, 32, 128, 20),
                 "finetune BERT-tiny B32 S40": finetune_step(TINY, 32, 40)}
    if not a.quick:
        workloads["finetune MiniLM    B32 S40"] = finetune_step(MINILM, 32, 40)
    settings = [("fp32", 1), ("fp32", a.threads), ("bf16", 1), ("bf16", a.threads)]
    times = {(w, s): [] for w in workloads for s in settings}
    for w, fn in workloads.items():  # warm-up: allocator, oneDNN primitives, first-call overheads
        for prec, threads in settings:
            torch.set_num_threads(threads)
            fn(prec)
    for r in range(a.rounds):
        for _ in range(a.steps):
            for w, fn in workloads.items():
                for prec, threads in settings:
                    torch.set_num_threads(threads)
                    fn(prec)  # unmeasured: the first step after a thread-count switch wakes the pool
                    t0 = time.perf_counter()
                    fn(prec)
                    times[(w, (prec, threads))].append(time.perf_counter() - t0)
        print(f"  round {r + 1}/{a.rounds} done", flush=True)
    print(f"\nmedian seconds per step over {a.rounds} rounds x {a.steps} steps; ratio = baseline (fp32, 1 thread) / setting")
    for w in workloads:
        base = statistics.median(times[(w, settings[0])])
        for prec, threads in settings:
            s = statistics.median(times[(w, (prec, threads))])
            print(f"{w}  {prec} {threads} thread{'s' if threads > 1 else ' '}: {s:.3f} s/step  {base / s:.2f}x")


if __name__ == "__main__":
    main()
