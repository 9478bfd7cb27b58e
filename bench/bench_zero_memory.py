"""BERT-large memory per rank under DeepSpeed ZeRO 0/1/2/3: computed for world sizes 1/2/8/64, and
measured on CPU (2 ranks, gloo, bf16, micro batch 2 x 128, one AdamW step) with --measure.

    .venv/bin/python bench/bench_zero_memory.py                  # computed table only
    .venv/bin/python bench/bench_zero_memory.py --measure 2 3    # + measured peak RSS per rank

Model-state bytes per parameter (ZeRO paper, mixed precision with Adam): bf16 weights 2 + bf16
gradients 2 + fp32 master weights, momentum and variance 12 = 16. Stage 1 partitions the 12, stage 2
also the gradients, stage 3 also the weights. Activations are not partitioned and come on top.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GiB = 1024**3


def model_state_bytes(params: int, stage: int, world: int) -> float:
    w, g, opt = 2.0 * params, 2.0 * params, 12.0 * params
    if stage >= 1:
        opt /= world
    if stage >= 2:
        g /= world
    if stage >= 3:
        w /= world
    return w + g + opt


def computed_table(params: int) -> str:
    worlds = (1, 2, 8, 64)
    lines = [f"BERT-large: {params / 1e6:.1f} M parameters; model states per rank (GiB), bf16 + Adam",
             "stage " + "".join(f"{f'N={n}':>10}" for n in worlds)]
    for stage in range(4):
        lines.append(f"ZeRO-{stage}" + "".join(f"{model_state_bytes(params, stage, n) / GiB:10.2f}" for n in worlds))
    return "\n".join(lines)


def worker(stage: int) -> None:
    """One rank: build BERT-large under DeepSpeed, one step, report peak RSS growth."""
    import torch

    from bert_core.config import preset
    from bert_core.engine import init_distributed, make_engine
    from bert_core.model import BertForPreTraining
    from bert_core.train_config import TrainConfig

    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    cfg = TrainConfig(data_dir="-", output_dir="-", model="large", engine="deepspeed", zero_stage=stage,
                      precision="bf16", micro_batch_size=2, max_steps=10, dropout=0.0)
    world = init_distributed(cfg)
    torch.manual_seed(0)
    model = BertForPreTraining(preset("large"))
    engine = make_engine(model, cfg, world)
    ids = torch.randint(5, 30522, (2, 128))
    batch = {"input_ids": ids, "token_type_ids": torch.zeros_like(ids), "attention_mask": torch.ones_like(ids),
             "mlm_positions": torch.arange(0, 256, 7), "mlm_labels": torch.randint(5, 30522, (37,)),
             "nsp_labels": torch.tensor([0, 1])}
    t = time.perf_counter()
    engine.step([batch])
    step_s = time.perf_counter() - t
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    out = {"stage": stage, "rank": world.rank, "peak_rss_gib": peak / GiB, "growth_gib": (peak - base_rss) / GiB, "step_s": step_s}
    # one file per rank: two ranks printing at once can interleave on a shared stdout
    Path(os.environ["BENCH_OUT"], f"rank{world.rank}.json").write_text(json.dumps(out))


def measure(stage: int) -> list[dict]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = Path(tempfile.mkdtemp(prefix="zero-mem-"))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "BENCH_OUT": str(out)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port),
           __file__, "--worker", str(stage)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    results = [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]
    if proc.returncode or len(results) != 2:
        raise SystemExit(f"ZeRO-{stage} measurement failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return sorted(results, key=lambda r: r["rank"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--measure", type=int, nargs="*", default=None, help="ZeRO stages to measure on CPU (2 ranks)")
    p.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker is not None:
        worker(args.worker)
        return
    from bert_core.config import preset
    from bert_core.model import BertForPreTraining

    params = BertForPreTraining(preset("large")).num_parameters()
    print(computed_table(params))
    for stage in args.measure or []:
        for r in measure(stage):
            computed = model_state_bytes(params, stage, 2) / GiB
            print(f"measured ZeRO-{stage} rank {r['rank']}: peak RSS {r['peak_rss_gib']:.2f} GiB "
                  f"(growth {r['growth_gib']:.2f} GiB; computed model states {computed:.2f} GiB), step {r['step_s']:.1f} s")


if __name__ == "__main__":
    main()
