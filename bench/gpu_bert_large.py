"""BERT-large phase-1 (seq 128) bf16 training throughput on one GPU, bert_core model under DeepSpeed ZeRO-1.

Prints sequences/s and MFU for a few variants measured in the same run; the plain-torch (no DeepSpeed)
step is the in-run baseline. Synthetic batches shaped like the instance loader's (20 masked positions
per sequence, as max_predictions_per_seq=20 at seq 128), so the data path is not what is measured.

    python bench/gpu_bert_large.py                 # on a GPU machine
    python bench/gpu_bert_large.py --smoke         # CPU, tiny model: checks the script itself
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bert_core.config import preset  # noqa: E402
from bert_core.flops import flops_per_token  # noqa: E402
from bert_core.losses import pretraining_loss  # noqa: E402
from bert_core.model import BertForPreTraining  # noqa: E402

MEASURED_BF16_PEAK = 790e12  # 8192^3 bf16 matmul on this workplace's H200 (device KINDS.md)
DATASHEET_BF16_PEAK = 989e12


def make_batch(B: int, S: int, P: int, vocab: int, device) -> dict:
    g = torch.Generator().manual_seed(0)
    pos_BP = torch.stack([torch.randperm(S - 2, generator=g)[:P] + 1 for _ in range(B)]).sort(-1).values
    flat_M = (pos_BP + torch.arange(B)[:, None] * S).reshape(-1)
    batch = dict(
        input_ids=torch.randint(1000, vocab, (B, S), generator=g),
        token_type_ids=(torch.arange(S)[None] >= S // 2).long().expand(B, S).contiguous(),
        attention_mask=torch.ones(B, S, dtype=torch.long),
        mlm_positions=flat_M,
        mlm_labels=torch.randint(1000, vocab, (B * P,), generator=g),
        nsp_labels=torch.randint(0, 2, (B,), generator=g),
    )
    return {k: v.to(device) for k, v in batch.items()}


def loss_of(model, b):
    out = model(b["input_ids"], b["token_type_ids"], b["attention_mask"], b["mlm_positions"])
    return pretraining_loss(out[0], out[1], b["mlm_labels"], b["nsp_labels"]).loss


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(step, device, warmup: int, iters: int) -> float:
    for _ in range(warmup):
        step()
    sync(device)
    t0 = time.perf_counter()
    for _ in range(iters):
        step()
    sync(device)
    return (time.perf_counter() - t0) / iters


def variant_torch(cfg, batch, device, warmup, iters, compile_=False):
    model = BertForPreTraining(cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    fwd = torch.compile(model) if compile_ else model

    def step():
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = loss_of(fwd, batch)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return timed(step, device, warmup, iters)


def compile_layers(model):
    """nn.Module.compile() in place on each encoder block and the MLM head: fuses LayerNorm, GELU,
    dropout and residual adds, and keeps parameter names (no '_orig_mod.' prefix), so DeepSpeed and
    checkpoints see the same module tree."""
    for layer in model.bert.encoder.layer:
        layer.compile()
    model.bert.embeddings.compile()
    model.cls.compile()
    return model


def variant_deepspeed(cfg, batch, device, warmup, iters, B, compile_=False, accum=1, compile_blocks=False):
    import deepspeed

    for k, v in dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="29512").items():
        os.environ.setdefault(k, v)
    if not torch.distributed.is_initialized():
        deepspeed.init_distributed(dist_backend="nccl" if device.type == "cuda" else "gloo")
    model = BertForPreTraining(cfg)
    if compile_blocks:
        compile_layers(model)
    ds_config = {
        "train_micro_batch_size_per_gpu": B,
        "gradient_accumulation_steps": accum,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": 1},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True, "adam_w_mode": True}},
        "gradient_clipping": 1.0,
        "steps_per_print": 10**9,
    }
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config)
    if compile_:
        engine.compile()

    def step():  # one optimizer step = accum micro-batches
        for _ in range(accum):
            loss = loss_of(engine, batch)
            engine.backward(loss)
            engine.step()

    return timed(step, device, warmup, iters) / accum  # seconds per micro-batch


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny model on CPU, to check the script")
    ap.add_argument("--batch", type=int, nargs="+", default=[256])
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--json", default=None, help="write results here")
    ap.add_argument("--accum", type=int, default=4, help="gradient accumulation of the accumulating variant")
    ap.add_argument("--variants", nargs="+", default=None, help="run only these variants")
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    S, P = 128, 20
    cfg = preset("tiny", max_position_embeddings=512) if args.smoke else preset("large")
    warmup, iters = (2, 2) if args.smoke else (6, args.iters)
    fpt = flops_per_token(cfg, S, mlm_fraction=P / S)
    print(f"device={torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'} torch={torch.__version__} "
          f"params={BertForPreTraining(cfg).num_parameters() / 1e6:.0f}M flops/token={fpt / 1e9:.2f} GFLOP", flush=True)
    torch.backends.cuda.matmul.allow_tf32 = True
    results = []
    variants = [("torch_eager_bf16", lambda B: variant_torch(cfg, make_batch(B, S, P, cfg.vocab_size, device), device, warmup, iters)),
                ("deepspeed_zero1_bf16", lambda B: variant_deepspeed(cfg, make_batch(B, S, P, cfg.vocab_size, device), device, warmup, iters, B)),
                ("deepspeed_zero1_bf16_compiled", lambda B: variant_deepspeed(cfg, make_batch(B, S, P, cfg.vocab_size, device), device, warmup, iters, B, compile_=True)),
                ("torch_compiled_bf16", lambda B: variant_torch(cfg, make_batch(B, S, P, cfg.vocab_size, device), device, warmup, iters, compile_=True)),
                ("deepspeed_zero1_bf16_blocks_compiled", lambda B: variant_deepspeed(cfg, make_batch(B, S, P, cfg.vocab_size, device), device, warmup, iters, B, compile_blocks=True)),
                ("deepspeed_zero1_bf16_blocks_compiled_accum", lambda B: variant_deepspeed(cfg, make_batch(B, S, P, cfg.vocab_size, device), device, warmup, iters, B, compile_blocks=True, accum=args.accum)),
                ("deepspeed_zero1_bf16_compiled_accum", lambda B: variant_deepspeed(cfg, make_batch(B, S, P, cfg.vocab_size, device), device, warmup, iters, B, compile_=True, accum=args.accum))]
    if args.variants:
        keep = set(args.variants) | {"torch_eager_bf16"}  # the baseline always runs
        variants = [v for v in variants if v[0] in keep]
    for name, fn in variants:
        for B in args.batch:
            try:
                s = fn(B)
                seq_s = B / s
                r = dict(variant=name, batch=B, step_s=s, seq_per_s=seq_s,
                         mfu_measured_peak=seq_s * S * fpt / MEASURED_BF16_PEAK,
                         mfu_datasheet=seq_s * S * fpt / DATASHEET_BF16_PEAK)
            except Exception as err:  # a failing variant must not cost the others' numbers
                r = dict(variant=name, batch=B, error=f"{type(err).__name__}: {str(err).splitlines()[0][:200]}")
            results.append(r)
            print(json.dumps(r), flush=True)
            if device.type == "cuda":
                torch.cuda.empty_cache()
    base = next((r["seq_per_s"] for r in results if r["variant"] == "torch_eager_bf16" and "seq_per_s" in r), None)
    print("\nvariant                          batch   seq/s   vs torch-eager   MFU(790T)  MFU(989T)")
    for r in results:
        if "seq_per_s" in r:
            ratio = f"{r['seq_per_s'] / base:.2f}x" if base else "-"
            print(f"{r['variant']:<32} {r['batch']:>5} {r['seq_per_s']:>8.0f}   {ratio:>8}      "
                  f"{r['mfu_measured_peak']:.3f}      {r['mfu_datasheet']:.3f}")
        else:
            print(f"{r['variant']:<32} {r['batch']:>5}  FAILED {r['error']}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
