"""Training engines behind one interface: plain torch (one process) and DeepSpeed ZeRO 0-3.

This is the ONLY module that imports DeepSpeed (lazily, so the torch path never pays for it).

    engine.step(micro_batches) -> metrics   one optimizer step over grad_accum_steps micro batches
    engine.save(dir, client_state)          collective: every rank calls it
    engine.load(dir) -> client_state        collective
    engine.lr() -> float

Both engines run the same optimizer (a client torch AdamW or our LAMB) and the same LambdaLR
schedule, and scale the loss by 1/grad_accum_steps, so a torch run and a DeepSpeed ZeRO-0 fp32 run
follow the same arithmetic.
"""
from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Any, NamedTuple, Sequence

import torch
import torch.distributed as dist

from bert_core.losses import pretraining_loss
from bert_core.model import BertForPreTraining, use_fast_paths
from bert_core.optim import attach_zero_partitions, make_optimizer, make_scheduler
from bert_core.runtime import device_for
from bert_core.train_config import TrainConfig, ds_config
from bert_core.zero_reshard import load_resharded, saved_world_size
from contracts.common import UserError

METRIC_KEYS = ("loss", "mlm_loss", "nsp_loss", "mlm_acc", "nsp_acc")
DS_TAG = "ds"


class World(NamedTuple):
    rank: int
    world_size: int
    local_rank: int


def init_distributed(config: TrainConfig) -> World:
    """Join the process group the launcher set up (torchrun, deepspeed, Ray Train) or make a 1-rank one."""
    rank, world_size = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    world = World(rank, world_size, local_rank)
    if config.engine == "torch":
        if world_size > 1:
            raise UserError("engine: torch runs one process; use engine deepspeed for several ranks")
        return world
    # DeepSpeed needs a process group even for one rank.
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path.home() / ".cache" / "torch_extensions"))
    warn_stale_build_locks(Path(os.environ["TORCH_EXTENSIONS_DIR"]))
    os.environ["PATH"] = own_ninja_first(os.environ.get("PATH", ""), sys.executable)
    for k, v in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}.items():
        os.environ.setdefault(k, v)
    if "MASTER_PORT" not in os.environ:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    import deepspeed

    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
    else:
        _skip_shm_comm_build()
    deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")
    return world


def _skip_shm_comm_build() -> None:
    """On CPU, DeepSpeed's process group JIT-builds its shared-memory all-reduce op (20-30 s of g++ on the
    first run of an environment, and a compiler it needs) for ``inference_all_reduce`` alone: the
    tensor-parallel inference kernels call it, training's collectives are torch.distributed's (gloo). Its
    builder returning nothing is DeepSpeed's own path where the op cannot be built (not Linux)."""
    import importlib

    # by name: ``import deepspeed.comm.torch as m`` gives torch itself (deepspeed.comm's attribute "torch")
    ds_torch = importlib.import_module("deepspeed.comm.torch")
    if callable(getattr(ds_torch, "build_shm_op", None)):
        ds_torch.build_shm_op = lambda: None


def own_ninja_first(path: str, executable: str) -> str:
    """``PATH`` with the interpreter's own bin directory first where it holds ``ninja`` (as activating the
    environment does). DeepSpeed's JIT ops (the shm comm op, 20-30 s to build here) are built by the first
    ``ninja`` on PATH, and two ninjas (the environment's 1.13, Debian's 1.11) do not read each other's build
    log: a launch from an activated environment and one from ``.venv/bin/python`` then rebuilt the op from
    scratch each time the other had built it last."""
    bindir = os.path.dirname(executable)
    if not bindir or not os.path.exists(os.path.join(bindir, "ninja")):
        return path
    rest = [p for p in path.split(os.pathsep) if p and p != bindir]
    return os.pathsep.join([bindir, *rest])


STALE_LOCK_S = 600  # DeepSpeed's JIT builds take under a minute here (shm comm 20-30 s, fused Adam about 45 s)


def warn_stale_build_locks(ext_dir: Path, now: float | None = None) -> list[Path]:
    """Name every JIT-build lock in ``ext_dir`` older than STALE_LOCK_S. torch's build lock
    (``<ext>/<op>/lock``) records no owner: a build killed mid-way leaves it, and every later run
    waits on it forever without a word. A warning naming the file turns that silent hang into one
    the user can end. Returns the stale locks."""
    import sys
    import time

    now = time.time() if now is None else now
    stale = []
    for lock in sorted(ext_dir.glob("*/lock")) if ext_dir.is_dir() else []:
        try:
            age = now - lock.stat().st_mtime
        except OSError:  # the build that held it just finished
            continue
        if age > STALE_LOCK_S:
            stale.append(lock)
            print(f"bertflow: warning: {lock} is {age / 60:.0f} min old: a DeepSpeed op build killed mid-way "
                  "leaves it and this run waits on it forever; delete it if no build is running", file=sys.stderr)
    return stale


def batch_to(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def forward_loss(model: torch.nn.Module, batch: dict[str, torch.Tensor]):
    out = model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"], batch["mlm_positions"])
    return pretraining_loss(out.mlm_logits, out.nsp_logits_B2, batch["mlm_labels"], batch["nsp_labels"])


def _reduce(values: list[float], world: World, device: torch.device) -> list[float]:
    """Mean over ranks (sum then divide: deterministic for a fixed world size)."""
    if world.world_size == 1 or not dist.is_initialized():
        return values
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return (t / world.world_size).tolist()


class _Accumulator:
    def __init__(self) -> None:
        self.sums = {k: 0.0 for k in METRIC_KEYS}
        self.n = 0
        self.tokens = 0  # real (non-pad) tokens
        self.seq_len = 0

    def add(self, out, batch: dict[str, torch.Tensor]) -> None:
        for k in METRIC_KEYS:
            self.sums[k] += float(getattr(out, k).detach())
        self.n += 1
        self.tokens += int(batch["attention_mask"].sum())
        self.seq_len = max(self.seq_len, batch["input_ids"].shape[1])

    def result(self, world: World, device: torch.device) -> dict[str, float]:
        vals = _reduce([self.sums[k] / self.n for k in METRIC_KEYS] + [float(self.tokens)], world, device)
        metrics = dict(zip(METRIC_KEYS, vals[:-1]))
        metrics["tokens"] = vals[-1] * world.world_size
        metrics["seq_len"] = self.seq_len
        return metrics


class TorchEngine:
    """Plain torch, one process: the reference arithmetic (autocast bf16 keeps fp32 master weights)."""

    def __init__(self, model: BertForPreTraining, config: TrainConfig, world: World):
        if config.precision == "fp16" and not torch.cuda.is_available():
            raise UserError("precision: fp16 needs a GPU; use bf16 or fp32 on CPU")
        self.config, self.world, self.device = config, world, device_for(world.local_rank)
        self.model = model.to(self.device)
        self.optimizer = make_optimizer(self.model, config)
        self.scheduler = make_scheduler(self.optimizer, config)
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(config.precision)
        self._autocast = (lambda: torch.autocast(self.device.type, dtype=dtype)) if dtype else contextlib.nullcontext
        self.scaler = torch.amp.GradScaler(enabled=config.precision == "fp16")

    def step(self, micro_batches: Sequence[dict[str, torch.Tensor]]) -> dict[str, float]:
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        acc = _Accumulator()
        for batch in micro_batches:
            batch = batch_to(batch, self.device)
            with self._autocast():
                out = forward_loss(self.model, batch)
            self.scaler.scale(out.loss / len(micro_batches)).backward()
            acc.add(out, batch)
        self.scaler.unscale_(self.optimizer)
        grad_norm = float("nan")
        if self.config.clip_grad_norm > 0:
            grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.clip_grad_norm))
        lr = self.lr()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.scheduler.step()
        return {**acc.result(self.world, self.device), "lr": lr, "grad_norm": grad_norm}

    def lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    def save(self, directory: Path, client_state: dict[str, Any]) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        torch.save(self.model.state_dict(), directory / "model.pt")
        torch.save(
            {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
             "scaler": self.scaler.state_dict(), "client_state": client_state},
            directory / "training_state.pt",
        )

    def load(self, directory: Path) -> dict[str, Any]:
        state = torch.load(directory / "training_state.pt", map_location=self.device, weights_only=False)
        self.model.load_state_dict(torch.load(directory / "model.pt", map_location=self.device, weights_only=True))
        self.model.tie_weights()
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        return state["client_state"]


class DeepSpeedEngine:
    """DeepSpeed ZeRO 0-3 around the same client optimizer and schedule."""

    def __init__(self, model: BertForPreTraining, config: TrainConfig, world: World):
        import deepspeed

        if config.precision == "fp16" and not torch.cuda.is_available():
            raise UserError("precision: fp16 is GPU-only in DeepSpeed; use bf16 or fp32 on CPU")
        self.config, self.world, self.device = config, world, device_for(world.local_rank)
        self.ds_config = ds_config(config, world.world_size)
        optimizer = make_optimizer(model, config)
        self.engine, self.optimizer, _, self.scheduler = deepspeed.initialize(
            model=model,
            optimizer=optimizer,
            lr_scheduler=lambda opt: make_scheduler(opt, config),
            config=self.ds_config,
            dist_init_required=False,
        )
        self.model = self.engine.module
        if config.optimizer == "lamb" and config.zero_stage in (1, 2):
            attach_zero_partitions(optimizer, self.engine.optimizer)  # per-layer trust ratio across ranks
        elif config.optimizer == "lamb":
            _check_per_layer(optimizer, self.model)

    def step(self, micro_batches: Sequence[dict[str, torch.Tensor]]) -> dict[str, float]:
        if len(micro_batches) != self.engine.gradient_accumulation_steps():
            raise ValueError(f"expected {self.engine.gradient_accumulation_steps()} micro batches, got {len(micro_batches)}")
        self.engine.train()
        acc = _Accumulator()
        lr = self.lr()
        for batch in micro_batches:
            batch = batch_to(batch, self.device)
            out = forward_loss(self.engine, batch)
            self.engine.backward(out.loss)  # DeepSpeed divides by gradient_accumulation_steps
            self.engine.step()  # steps the optimizer and schedule at the accumulation boundary only
            acc.add(out, batch)
        norm = self.engine.get_global_grad_norm()
        return {**acc.result(self.world, self.device), "lr": lr, "grad_norm": float(norm) if norm is not None else float("nan")}

    def lr(self) -> float:
        return float(self.engine.get_lr()[0])

    def save(self, directory: Path, client_state: dict[str, Any]) -> None:
        self.engine.save_checkpoint(str(directory), tag=DS_TAG, client_state=client_state, save_latest=False)

    def load(self, directory: Path) -> dict[str, Any]:
        saved_world = saved_world_size(directory / DS_TAG)
        if self.config.zero_stage in (1, 2) and saved_world not in (0, self.world.world_size):
            path, client_state = load_resharded(self.engine, directory, DS_TAG)  # elastic resume
        else:
            path, client_state = self.engine.load_checkpoint(
                str(directory), tag=DS_TAG, load_optimizer_states=True, load_lr_scheduler_states=True
            )
        if path is None:
            raise UserError(f"{directory}: DeepSpeed could not load this checkpoint")
        return client_state or {}


def _check_per_layer(optimizer: torch.optim.Optimizer, model: torch.nn.Module) -> None:
    """LAMB's trust ratio is per tensor: refuse to train if DeepSpeed handed it flattened buffers."""
    got = sorted(tuple(p.shape) for g in optimizer.param_groups for p in g["params"])
    want = sorted(tuple(p.shape) for p in model.parameters())
    if got != want:
        raise UserError(
            "optimizer lamb: DeepSpeed gave it flattened buffers instead of per-layer tensors with this "
            "configuration (the trust ratio would be per partition); use optimizer adamw or engine torch"
        )


def make_engine(model: BertForPreTraining, config: TrainConfig, world: World):
    """The engine the config asks for; DeepSpeed expects ``init_distributed`` to have run."""
    if config.fast_attention or config.compile_blocks:
        use_fast_paths(model, attention=config.fast_attention, compile_blocks=config.compile_blocks)
    return DeepSpeedEngine(model, config, world) if config.engine == "deepspeed" else TorchEngine(model, config, world)


def consolidated_state_dict(engine_dir: Path, engine: str, zero_stage: int) -> dict[str, torch.Tensor]:
    """Full fp32 weights of a saved engine, whatever the ZeRO stage (ZeRO-2/3 shards are merged)."""
    if engine == "torch":
        return torch.load(engine_dir / "model.pt", map_location="cpu", weights_only=True)
    if zero_stage >= 1:
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        return get_fp32_state_dict_from_zero_checkpoint(str(engine_dir), tag=DS_TAG)
    states = torch.load(engine_dir / DS_TAG / "mp_rank_00_model_states.pt", map_location="cpu", weights_only=False)
    return {k: v.float() if v.is_floating_point() else v for k, v in states["module"].items()}
