"""``bertflow train`` / ``python -m bert_core.train``: the one training function every launcher calls.

    run(config, resume) -> TrainResult     single process, a torchrun/deepspeed rank, or a Ray Train worker

Every check that can refuse the run (config, data/model mismatch, batch arithmetic, init weights,
run directory, resume config) happens before anything is written, on every rank alike.
"""
from __future__ import annotations

import argparse
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import torch
import torch.distributed as dist

from bert_core.checkpoint import (CheckpointManager, is_hf_dir, load_model_from_checkpoint, read_state,
                                 resolve_checkpoint, verify_collective)
from bert_core.config import ModelConfig
from bert_core.engine import World, init_distributed, make_engine
from bert_core.loader import BatchLoader, InstanceDataset
from bert_core.model import BertForPreTraining
from bert_core.train_config import TrainConfig, ds_config, elastic_config
from bert_core.train_log import METRICS_FILE, MetricsLogger, peak_flops
from data_jobs.common import UserError, build_config, load_config, run_main, write_json_atomic

RUN_CONFIG = "train_config.json"
ARCH_FIELDS = set(ModelConfig.model_fields) - {"hidden_dropout_prob", "attention_probs_dropout_prob", "activation_checkpointing"}


@dataclass
class TrainResult:
    run_dir: Path
    last_checkpoint: Optional[Path]
    metrics_file: Path
    final_metrics: dict[str, Any] = field(default_factory=dict)


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def _seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _vocab_file(dataset: InstanceDataset) -> Optional[Path]:
    """The dataset's vocab: totals.vocab_file (absolute, or relative to the data dir), or vocab.txt beside it."""
    candidates = []
    if dataset.vocab_file:
        v = Path(dataset.vocab_file)
        candidates += [v, dataset.dir / v] if not v.is_absolute() else [v]
    candidates.append(dataset.dir / "vocab.txt")
    return next((c for c in candidates if c.is_file()), None)


def _read_tokens(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def _init_weights(config: TrainConfig, dataset: InstanceDataset, mc: ModelConfig, vocab: Optional[Path]):
    """Phase 2: weights of ``init_from``, whose architecture and vocabulary must match this run's."""
    if config.init_from is None:
        return None
    model, init_mc, init_vocab = load_model_from_checkpoint(config.init_from)
    diff = [k for k in sorted(ARCH_FIELDS) if getattr(init_mc, k) != getattr(mc, k)]
    if diff:
        k = diff[0]
        raise UserError(f"init_from: {config.init_from} has {k}={getattr(init_mc, k)} but this run's model has {getattr(mc, k)}")
    if not is_hf_dir(config.init_from):
        init_hash = read_state(resolve_checkpoint(config.init_from)).get("vocab_hash")
        dataset.check_model(mc, vocab_hash=init_hash)
    if vocab is not None and Path(init_vocab).is_file() and _read_tokens(Path(init_vocab)) != _read_tokens(vocab):
        raise UserError(f"init_from: {init_vocab} differs from the data's vocabulary {vocab}")
    return model.state_dict()


def _prepare_run_dir(config: TrainConfig, run_dir: Path, resume: bool) -> None:
    saved = run_dir / RUN_CONFIG
    if resume:
        if not saved.is_file():
            raise UserError(f"{run_dir}: nothing to resume (no {RUN_CONFIG})")
        try:
            old = json.loads(saved.read_text(encoding="utf-8"))
            old_cfg = build_config(TrainConfig, old["config"], str(saved))
        except (ValueError, KeyError) as err:
            raise UserError(f"{saved}: corrupt run config: {err}") from None
        if old_cfg.resume_hash() != config.resume_hash():
            a, b = old_cfg.model_dump(mode="json"), config.model_dump(mode="json")
            changed = sorted(k for k in a if a[k] != b.get(k) and k in TrainConfig.model_fields)
            raise UserError(f"--resume: config differs from the run's {saved} in {', '.join(changed)}")
    elif saved.exists() or (run_dir / "checkpoints").exists():
        raise UserError(f"output_dir: {run_dir} already holds a run; pass --resume or choose another directory")


@dataclass
class _Plan:
    """Everything checked before the first write: the run is refused here or not at all."""

    world: World
    dataset: InstanceDataset
    model_config: ModelConfig
    vocab: Optional[Path]
    init_state: Optional[dict]
    run_dir: Path
    ckpt: CheckpointManager
    latest: Optional[Path]
    config: TrainConfig  # the run's config, its accumulation adjusted on an elastic resume


def _check(config: TrainConfig, resume: bool) -> _Plan:
    world = init_distributed(config)
    dataset = InstanceDataset(config.data_dir)
    mc = config.build_model_config(dataset.vocab_size)
    dataset.check_model(mc, max_seq_length=config.max_seq_length, max_predictions_per_seq=config.max_predictions_per_seq)
    if not resume:  # a resumed run checks it below, on the accumulation of its world size
        config.global_batch(world.world_size)
    vocab = _vocab_file(dataset)
    init_state = _init_weights(config, dataset, mc, vocab)
    run_dir = Path(config.output_dir)
    _prepare_run_dir(config, run_dir, resume)
    ckpt = CheckpointManager(run_dir, config.keep_last, world.rank, _barrier)
    latest = ckpt.latest() if resume else None
    run_config = config
    if latest is not None:
        saved = read_state(latest)
        same_world = saved.get("world_size", world.world_size) == world.world_size
        verify_collective(latest, world.rank, same_world)  # a damaged file is refused before any write
        if not same_world:
            run_config = elastic_config(config, saved, world.world_size, latest)
    run_config.global_batch(world.world_size)
    return _Plan(world, dataset, mc, vocab, init_state, run_dir, ckpt, latest, run_config)


def _build(config: TrainConfig, plan: _Plan):
    """Model (same init on every rank), engine, loader; restored from the latest checkpoint on resume."""
    world = plan.world
    _seed_all(config.seed)
    model = BertForPreTraining(plan.model_config)
    if plan.init_state is not None:
        model.load_state_dict(plan.init_state)
        model.tie_weights()
    engine = make_engine(model, config, world)
    _seed_all(config.seed + 1 + world.rank)  # dropout differs across ranks, reproducibly
    loader = BatchLoader(plan.dataset, config.micro_batch_size, world.rank, world.world_size, config.seed,
                         plan.model_config.pad_token_id, grad_accum_steps=config.grad_accum_steps, prefetch=2)
    state = {"step": 0, "tokens_seen": 0}
    if plan.latest is not None:
        same_world = read_state(plan.latest).get("world_size", world.world_size) == world.world_size
        state = plan.ckpt.load(plan.latest, engine, check=False, same_world=same_world)  # + this rank's RNG
        loader.load_state_dict(state["loader"])
        if not same_world:  # the saved RNG streams were other ranks': a fresh one per (step, rank)
            _seed_all(config.seed + 1 + world.rank + 1_000_003 * int(state["step"]))
    return engine, loader, int(state["step"]), int(state["tokens_seen"])


def run(config: TrainConfig, resume: bool = False) -> TrainResult:
    """Train (or resume) one run; every rank of a launch calls this with the same config."""
    plan = _check(config, resume)
    world, run_dir, mc = plan.world, plan.run_dir, plan.model_config
    _barrier()  # every rank has checked before rank 0 writes anything
    if world.rank == 0:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(run_dir / RUN_CONFIG, {"config": config.model_dump(mode="json"), "resume_hash": config.resume_hash()})
    config = plan.config
    engine, loader, step, tokens_seen = _build(config, plan)
    logger = MetricsLogger(run_dir, world.rank == 0, mc, start_step=step, max_steps=config.max_steps,
                           log_every=config.log_every, tensorboard=config.tensorboard,
                           peak=peak_flops(config.peak_tflops, config.precision))
    logger.tokens_seen = tokens_seen
    files: dict[str, Any] = {"train_config.json": config.model_dump(mode="json"), "model_config.json": mc.model_dump(mode="json")}
    if config.engine == "deepspeed":
        files["ds_config.json"] = ds_config(config, world.world_size)
    if plan.vocab is not None:
        files["vocab.txt"] = plan.vocab
    last, record = plan.latest, {}
    try:
        while step < config.max_steps:
            metrics = engine.step([next(loader) for _ in range(config.grad_accum_steps)])
            step += 1
            record = logger.log(step, metrics, config.global_batch(world.world_size)) or record
            if step % config.save_every == 0 or step == config.max_steps:
                state = {"step": step, "tokens_seen": logger.tokens_seen, "loader": loader.state_dict(),
                         "engine": config.engine, "zero_stage": config.zero_stage,
                         "world_size": world.world_size, "vocab_hash": plan.dataset.vocab_hash,
                         "lowercase": bool(plan.dataset.manifest.totals.get("lowercase", True))}
                last = plan.ckpt.save(step, engine, state, files)
    finally:
        loader.close()
        logger.close()
    return TrainResult(run_dir, last, run_dir / METRICS_FILE, record)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bertflow train", description="Pretrain BERT on a static-instances dataset.")
    p.add_argument("--config", help="TrainConfig YAML file (flags below override its keys)")
    p.add_argument("--resume", action="store_true", help="continue the run in output_dir from its latest checkpoint")
    p.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)  # deepspeed launcher
    flags = {
        "data_dir": str, "output_dir": str, "init_from": str, "model": str, "engine": str, "zero_stage": int,
        "precision": str, "optimizer": str, "lr": float, "micro_batch_size": int, "grad_accum_steps": int,
        "global_batch_size": int, "max_steps": int, "save_every": int, "log_every": int, "seed": int,
        "launcher": str, "num_workers": int, "ray_address": str, "dropout": float,
    }
    for name, typ in flags.items():
        help_ = TrainConfig.model_fields[name].description
        p.add_argument("--" + name.replace("_", "-"), dest=name, type=typ, default=None, help=help_)
    return p


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    overrides = {k: v for k, v in vars(args).items() if k not in ("config", "resume", "local_rank") and v is not None}
    if args.config:
        return load_config(TrainConfig, args.config, overrides)
    return build_config(TrainConfig, overrides, "command line")


def _main(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    config = config_from_args(args)
    if config.launcher == "deepspeed" and config.hostfile:
        from bert_core.hostfile import read_hostfile

        read_hostfile(config.hostfile)  # unknown host: one line now, not an ssh timeout later
    if config.launcher == "ray":
        from bert_core.ray_train import launch

        result = launch(config, resume=args.resume)
    else:
        result = run(config, resume=args.resume)
    if result is not None and (not dist.is_initialized() or dist.get_rank() == 0):
        print(f"run dir: {result.run_dir}  last checkpoint: {result.last_checkpoint}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_main(_main, argv)


if __name__ == "__main__":
    # Run the copy imported under the package name: Ray pickles remote functions by module, and a
    # worker cannot import "__main__" (this is how `ray job submit -- python -m bert_core.train` runs).
    from bert_core.train import main as _package_main

    raise SystemExit(_package_main())
