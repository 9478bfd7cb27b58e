"""BERT-large bf16 training throughput on one GPU: every step variant side by side in ONE run, with
the plain-torch eager step as the in-run baseline (always run first, whatever ``--variants`` says).

Variants (``--variants`` picks some; ``--list`` prints them):
- engines: plain torch (fused AdamW), DeepSpeed ZeRO-1/2 (client torch AdamW, or DeepSpeed's
  FusedAdam with ``fusedadam``), and plain-torch sharded optimizers: ``torch.distributed``
  ``ZeroRedundancyOptimizer`` (ZeRO-1 equivalent, under DDP) and FSDP2 ``fully_shard`` per block;
- ``fast``: attention without the additive mask (flash SDPA) on full-length batches, a boolean mask
  on padded ones (``bert_core.model.use_fast_paths``);
- ``compiled``: ``torch.compile`` of each encoder block (bias+GELU, dropout+residual+LayerNorm fused);
- ``accum``: gradient accumulation (``--accum`` micro batches per optimizer step; seconds are per
  micro batch, so the optimizer/ZeRO bookkeeping is amortised);
- ``tuned``: DeepSpeed contiguous gradients, larger reduce/allgather buckets, overlap_comm;
- ``padded``: a batch with ``--short-fraction`` of its rows shorter than S (the boolean-mask path).
Every variant runs at seq 128 (micro batch ``--batch``) and, with ``--seq 128 512``, at seq 512
(micro batch ``--batch512``, 76 masked positions): seq 512 is measured, not extrapolated.

Synthetic batches shaped like the instance loader's (20 masked positions per sequence at seq 128),
so the data path is not what is measured (see bench/bench_loader.py for the loader's share).

    python bench/gpu_bert_large.py --json out.json                 # on a GPU machine, default plan
    python bench/gpu_bert_large.py --seq 128 512 --variants all    # everything (long)
    python bench/gpu_bert_large.py --smoke                         # CPU, tiny model: checks the script
    python bench/gpu_bert_large.py --report out.json               # the table of a run (written per variant)
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
from bert_core.model import BertForPreTraining, use_fast_paths  # noqa: E402

MEASURED_BF16_PEAK = 790e12  # 8192^3 bf16 matmul on this workplace's H200 (device KINDS.md)
DATASHEET_BF16_PEAK = 989e12
TUNED = {"contiguous_gradients": True, "reduce_bucket_size": 5e8, "allgather_bucket_size": 5e8, "overlap_comm": True,
         "reduce_scatter": True}

# name -> options; engine: torch | ds | zro (ZeroRedundancyOptimizer + DDP) | fsdp2
VARIANTS = {
    "torch_eager": dict(engine="torch"),
    "torch_eager_padded": dict(engine="torch", padded=True),
    "torch_fast": dict(engine="torch", fast=True),
    "torch_fast_padded": dict(engine="torch", fast=True, padded=True),
    "torch_fast_compiled": dict(engine="torch", fast=True, compiled=True),
    "torch_fast_compiled_accum": dict(engine="torch", fast=True, compiled=True, accum=True),
    "ds_zero1": dict(engine="ds", stage=1),
    "ds_zero1_fast": dict(engine="ds", stage=1, fast=True),
    "ds_zero1_fast_compiled": dict(engine="ds", stage=1, fast=True, compiled=True),
    "ds_zero1_fast_compiled_accum": dict(engine="ds", stage=1, fast=True, compiled=True, accum=True),
    "ds_zero1_fast_compiled_tuned": dict(engine="ds", stage=1, fast=True, compiled=True, ds=TUNED),
    "ds_zero1_fast_compiled_fusedadam": dict(engine="ds", stage=1, fast=True, compiled=True, fusedadam=True),
    "ds_zero1_fast_compiled_tuned_fusedadam_accum": dict(engine="ds", stage=1, fast=True, compiled=True, ds=TUNED,
                                                         fusedadam=True, accum=True),
    "ds_zero2_fast_compiled_tuned": dict(engine="ds", stage=2, fast=True, compiled=True, ds=TUNED),
    "zro_fast_compiled": dict(engine="zro", fast=True, compiled=True),
    "zro_fast_compiled_accum": dict(engine="zro", fast=True, compiled=True, accum=True),
    "fsdp2_fast_compiled": dict(engine="fsdp2", fast=True, compiled=True),
}
DEFAULT_PLAN = ["torch_eager", "torch_eager_padded", "torch_fast", "torch_fast_padded", "torch_fast_compiled",
                "ds_zero1", "ds_zero1_fast_compiled", "ds_zero1_fast_compiled_accum", "ds_zero1_fast_compiled_tuned",
                "ds_zero1_fast_compiled_tuned_fusedadam_accum", "zro_fast_compiled", "fsdp2_fast_compiled"]


def make_batch(B: int, S: int, P: int, vocab: int, device, short_fraction: float = 0.0) -> dict:
    """Rows of length S, except ``short_fraction`` of them with lengths in [S/2, S) (padded)."""
    g = torch.Generator().manual_seed(0)
    lens_B = torch.full((B,), S)
    n_short = int(round(short_fraction * B))
    lens_B[:n_short] = torch.randint(S // 2, S, (n_short,), generator=g)
    pos_BP = torch.stack([torch.randperm(int(n) - 2, generator=g)[:P] + 1 for n in lens_B]).sort(-1).values
    flat_M = (pos_BP + torch.arange(B)[:, None] * S).reshape(-1)
    mask_BS = (torch.arange(S)[None] < lens_B[:, None]).long()
    batch = dict(
        input_ids=torch.randint(1000, vocab, (B, S), generator=g) * mask_BS,
        token_type_ids=(torch.arange(S)[None] >= S // 2).long().expand(B, S) * mask_BS,
        attention_mask=mask_BS,
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


def init_dist(device) -> None:
    for k, v in dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="29512").items():
        os.environ.setdefault(k, v)
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group("nccl" if device.type == "cuda" else "gloo")


def build_model(cfg, opts, device):
    torch.manual_seed(0)
    model = BertForPreTraining(cfg)
    use_fast_paths(model, attention=bool(opts.get("fast")), compile_blocks=bool(opts.get("compiled")))
    return model.to(device) if opts["engine"] != "ds" else model


def torch_like_step(cfg, opts, batch, device, accum):
    """Plain torch, DDP + ZeroRedundancyOptimizer, or FSDP2: autocast bf16, fused AdamW."""
    model = build_model(cfg, opts, device)
    fused = device.type == "cuda"
    if opts["engine"] == "zro":
        from torch.distributed.optim import ZeroRedundancyOptimizer
        from torch.nn.parallel import DistributedDataParallel

        init_dist(device)
        model = DistributedDataParallel(model, device_ids=[device.index] if fused else None)
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-4, fused=fused)
    elif opts["engine"] == "fsdp2":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        init_dist(device)
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for block in model.bert.encoder.layer:
            fully_shard(block, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused)

    def step():
        for _ in range(accum):
            with torch.autocast(device.type, dtype=torch.bfloat16):
                loss = loss_of(model, batch) / accum
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def deepspeed_step(cfg, opts, batch, device, accum, B):
    import deepspeed

    init_dist(device)
    model = build_model(cfg, opts, device)
    zero = {"stage": opts["stage"], **opts.get("ds", {})}
    ds_config = {
        "train_micro_batch_size_per_gpu": B,
        "gradient_accumulation_steps": accum,
        "bf16": {"enabled": True},
        "zero_optimization": zero,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": not opts.get("fusedadam"), "adam_w_mode": True}},
        "gradient_clipping": 1.0,
        "steps_per_print": 10**9,
    }
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config)

    def step():  # one optimizer step = accum micro batches
        for _ in range(accum):
            loss = loss_of(engine, batch)
            engine.backward(loss)
            engine.step()

    return step


def run_variant(name, cfg, S, B, args, device) -> dict:
    opts = VARIANTS[name]
    P = 20 if S <= 128 else 76
    batch = make_batch(B, S, P, cfg.vocab_size, device, args.short_fraction if opts.get("padded") else 0.0)
    accum = args.accum if opts.get("accum") else 1
    make = deepspeed_step if opts["engine"] == "ds" else torch_like_step
    step = make(cfg, opts, batch, device, accum, B) if opts["engine"] == "ds" else make(cfg, opts, batch, device, accum)
    warmup, iters = (2, 2) if args.smoke else (args.warmup, args.iters)
    s = timed(step, device, warmup, iters) / accum  # seconds per micro batch
    seq_s = B / s
    fpt = flops_per_token(cfg, S, mlm_fraction=P / S)
    return dict(variant=name, seq=S, batch=B, accum=accum, step_s=s, seq_per_s=seq_s,
                mfu_measured_peak=seq_s * S * fpt / MEASURED_BF16_PEAK, mfu_datasheet=seq_s * S * fpt / DATASHEET_BF16_PEAK,
                peak_mem_gib=torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None)


def report(results: list[dict]) -> None:
    print("\nvariant                                        seq batch   seq/s  vs eager  MFU(790T) MFU(989T)  peak GiB")
    for r in results:
        base = next((b["seq_per_s"] for b in results if b["variant"] == "torch_eager" and b["seq"] == r["seq"]
                     and "seq_per_s" in b), None)
        if "seq_per_s" in r:
            ratio = f"{r['seq_per_s'] / base:.2f}x" if base else "-"
            mem = f"{r['peak_mem_gib']:>9.1f}" if r.get("peak_mem_gib") is not None else f"{'-':>9}"
            print(f"{r['variant']:<46} {r['seq']:>3} {r['batch']:>5} {r['seq_per_s']:>7.0f} {ratio:>8}  "
                  f"{r['mfu_measured_peak']:>8.3f} {r['mfu_datasheet']:>9.3f} {mem}")
        else:
            print(f"{r['variant']:<46} {r['seq']:>3} {r['batch']:>5}  FAILED {r['error']}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="tiny model on CPU, to check the script")
    ap.add_argument("--seq", type=int, nargs="+", default=[128])
    ap.add_argument("--batch", type=int, default=256, help="micro batch at seq 128")
    ap.add_argument("--batch512", type=int, default=32, help="micro batch at seq 512")
    ap.add_argument("--accum", type=int, default=4, help="micro batches per optimizer step of the accum variants")
    ap.add_argument("--short-fraction", type=float, default=0.1, help="short rows in the padded variants")
    ap.add_argument("--warmup", type=int, default=6)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--variants", nargs="+", default=DEFAULT_PLAN, help="names, or 'all'")
    ap.add_argument("--list", action="store_true", help="print the variants and exit")
    ap.add_argument("--json", default=None, help="write results here")
    ap.add_argument("--report", metavar="JSON", help="print the table of a run's --json file and exit (no GPU needed)")
    args = ap.parse_args()
    if args.report:
        report(json.loads(Path(args.report).read_text()))
        return 0
    if args.list:
        for name, opts in VARIANTS.items():
            print(f"{name:<46} {opts}")
        return 0
    names = list(VARIANTS) if args.variants == ["all"] else args.variants
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        ap.error(f"unknown variant(s) {unknown}; --list shows them")
    names = ["torch_eager"] + [n for n in names if n != "torch_eager"]  # the in-run baseline first
    device = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    cfg = preset("tiny", max_position_embeddings=512) if args.smoke else preset("large")
    if args.smoke:
        args.batch, args.batch512 = min(args.batch, 8), min(args.batch512, 4)
        torch.set_num_threads(1)  # spinning OpenMP threads make a tiny model crawl on a busy machine
    print(f"device={torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'} torch={torch.__version__} "
          f"params={BertForPreTraining(cfg).num_parameters() / 1e6:.0f}M", flush=True)
    torch.backends.cuda.matmul.allow_tf32 = True
    results = []
    for S in args.seq:
        B = args.batch if S <= 128 else args.batch512
        for name in names:
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
            try:
                r = run_variant(name, cfg, S, B, args, device)
            except Exception as err:  # a failing variant must not cost the others' numbers
                r = dict(variant=name, seq=S, batch=B, error=f"{type(err).__name__}: {str(err).splitlines()[0][:200]}")
            results.append(r)
            print(json.dumps(r), flush=True)
            if args.json:  # after every variant: a run stopped at its time limit keeps what it measured
                Path(args.json).write_text(json.dumps(results, indent=2))
            if device.type == "cuda":
                torch.cuda.empty_cache()
            torch._dynamo.reset()  # compiled graphs of one variant must not serve the next
    report(results)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
