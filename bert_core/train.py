"""The one training function every launcher calls, and the training stage's status.

    run(config, resume) -> TrainResult     single process, a torchrun/deepspeed rank, or a Ray Train worker
    status(config) -> Status               done | partial | absent, asked by the CLI and the flows

Which processes call ``run`` is decided by ``bert_core.launch`` (``bertflow train``, ``python -m
bert_core.train``, the flows).

Every check that can refuse the run (config, data/model mismatch, batch arithmetic, init weights,
run directory, resume config) happens before anything is written, on every rank alike.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch.distributed as dist

from bert_core.checkpoint import (CheckpointManager, agree, is_hf_dir, load_model_from_checkpoint, read_state,
                                 resolve_checkpoint, step_of, verify_collective)
from bert_core.config import ModelConfig
from bert_core.engine import World, init_distributed, make_engine
from bert_core.identity import CHECKPOINTS
# The stage's status, its run-dir facts and its result live in a torch-free module (the flows ask a
# skipped stage without importing torch); they are the training job's own, re-exported here.
from bert_core.stage import (RUN_CONFIG, TrainResult, discard, input_identity, refuse_foreign,  # noqa: F401
                             run_stage, status)
from bert_core.loader import BatchLoader, InstanceDataset
from bert_core.model import BertForPreTraining
from bert_core.remote_run import RemoteRun, remote_for
from bert_core.runtime import seed_all
from bert_core.train_config import TrainConfig, ds_config, elastic_config
from bert_core.train_log import METRICS_FILE, MetricsLogger, peak_flops
from contracts.common import UserError, build_config, one_line
from contracts.lock import output_lock
from contracts.schema import Manifest

ARCH_FIELDS = set(ModelConfig.model_fields) - {"hidden_dropout_prob", "attention_probs_dropout_prob", "activation_checkpointing"}


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def _vocab_file(dataset: InstanceDataset) -> Optional[Path]:
    """The dataset's vocab: totals.vocab_file (absolute, or relative to the data dir), or vocab.txt beside it;
    on an object store, a node-local copy of it (checked by the caller against the data's vocab hash)."""
    from contracts.storage import is_uri

    v = dataset.vocab_file
    if (v and is_uri(v)) or is_uri(dataset.loc.uri):
        uri = v if v and is_uri(v) else f"{dataset.loc.uri.rstrip('/')}/{v or 'vocab.txt'}"
        return fetched_vocab(uri)
    candidates = []
    if dataset.vocab_file:
        v = Path(dataset.vocab_file)
        candidates += [v, dataset.dir / v] if not v.is_absolute() else [v]
    candidates.append(dataset.dir / "vocab.txt")
    return next((c for c in candidates if c.is_file()), None)


def fetched_vocab(uri: str) -> Optional[Path]:
    """A node-local copy of the vocab object ``uri`` (None where it is missing), named by the object's
    URI and version tag: the ranks of a node share it, a changed object is fetched anew."""
    import hashlib
    import tempfile

    from contracts.storage import location, scratch_root

    parent, _, name = uri.rpartition("/")
    loc = location(parent)
    meta = loc.head(name)
    if meta is None:
        return None
    key = hashlib.sha256(f"{uri}\0{meta.etag}\0{meta.size}".encode()).hexdigest()[:16]
    dest = scratch_root() / f"bertflow-vocab-{key}" / name
    if not dest.is_file():
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".fetch-")
        os.close(fd)
        try:
            loc.download(name, tmp)
            os.replace(tmp, dest)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return dest


def _checked_vocab(dataset: InstanceDataset) -> Optional[Path]:
    """The dataset's vocab file, refused unless its tokens hash to the vocab_hash recorded with the
    data: a vocab edited in place (or a vocab dir moved away) after the instances were made must not
    be shipped in the checkpoint and the export."""
    from data_jobs.tokenization import vocab_hash

    vocab = _vocab_file(dataset)
    if dataset.vocab_hash is None:
        return vocab
    if vocab is None:
        where = dataset.vocab_file or f"{dataset.loc.uri.rstrip('/')}/vocab.txt"
        raise UserError(f"{where}: the data's vocabulary is missing (vocab dir moved or deleted?); "
                        f"the instances in {dataset.loc.uri} were made with it")
    found = vocab_hash(vocab)
    if found != dataset.vocab_hash:
        raise UserError(f"{vocab}: vocab hash {found} != {dataset.vocab_hash} recorded with the data in "
                        f"{dataset.loc.uri} (edited after the instances were made?)")
    return vocab


def _check_finite(step: int, metrics: dict[str, Any], config: TrainConfig) -> None:
    """Stop before a non-finite step can be saved: it would become the latest checkpoint."""
    loss = float(metrics.get("loss", 0.0))
    norm = float(metrics.get("grad_norm", 0.0))
    # grad_norm is NaN by convention where no norm was computed (no clipping, or DeepSpeed without one)
    bad_norm = math.isinf(norm) or (math.isnan(norm) and config.engine == "torch" and config.clip_grad_norm > 0)
    if not math.isfinite(loss) or bad_norm:
        what = f"loss {loss}" if not math.isfinite(loss) else f"gradient norm {norm}"
        raise UserError(f"step {step}: non-finite {what}; training stopped, nothing saved for this step "
                        "(lower lr? check the data)")


def _read_tokens(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def _local_model(path: str) -> str:
    """``init_from`` as a local path: itself, or this node's verified copy of a checkpoint or run
    (bert_core.remote_run.cached_checkpoint) or of a Hugging Face directory (contracts.views) on a store."""
    from contracts.storage import is_uri, location

    if not is_uri(path):
        return path
    from bert_core.remote_run import cached_checkpoint, checkpoint_uri

    if checkpoint_uri(path) is not None:
        return str(cached_checkpoint(path))
    if location(path.rstrip("/")).exists("config.json"):
        from contracts.views import local_view

        return str(local_view(path))
    raise UserError(f"init_from: {path.rstrip('/')}: holds no complete checkpoint (no COMPLETE marker) and no "
                    "Hugging Face directory (config.json)")


def _init_weights(config: TrainConfig, dataset: InstanceDataset, mc: ModelConfig, vocab: Optional[Path]):
    """Phase 2: weights of ``init_from``, whose architecture and vocabulary must match this run's."""
    if config.init_from is None:
        return None
    src = _local_model(config.init_from)
    model, init_mc, init_vocab = load_model_from_checkpoint(src)
    diff = [k for k in sorted(ARCH_FIELDS) if getattr(init_mc, k) != getattr(mc, k)]
    if diff:
        k = diff[0]
        raise UserError(f"init_from: {config.init_from} has {k}={getattr(init_mc, k)} but this run's model has {getattr(mc, k)}")
    if not is_hf_dir(src):
        init_hash = read_state(resolve_checkpoint(src)).get("vocab_hash")
        dataset.check_model(mc, vocab_hash=init_hash)
    if vocab is not None and Path(init_vocab).is_file() and _read_tokens(Path(init_vocab)) != _read_tokens(vocab):
        raise UserError(f"init_from: {init_vocab} differs from the data's vocabulary {vocab}")
    return model.state_dict()


def _prepare_run_dir(config: TrainConfig, run_dir: Path, resume: bool, shown: Optional[str] = None) -> None:
    """``shown``: how messages name the run (its URI where ``run_dir`` is an object store's mirror)."""
    saved = run_dir / RUN_CONFIG
    shown_saved = f"{shown}/{RUN_CONFIG}" if shown else str(saved)
    if resume:
        if not saved.is_file():
            raise UserError(f"{shown or run_dir}: nothing to resume (no {RUN_CONFIG})")
        try:
            old = json.loads(saved.read_text(encoding="utf-8"))
            if not isinstance(old, dict) or not isinstance(old.get("inputs") or {}, dict):
                raise ValueError("not a run config record (an object with config and inputs)")
            old_cfg = build_config(TrainConfig, old["config"], shown_saved)
        except (ValueError, KeyError, RecursionError) as err:
            raise UserError(f"{shown_saved}: corrupt run config: {one_line(str(err) or type(err).__name__)}") from None
        if old_cfg.resume_hash() != config.resume_hash():
            changed = ", ".join(_blocking_differences(old_cfg, config))
            raise UserError(f"--resume: config differs from the run's {shown_saved} in {changed} (the fields that "
                            "decide what a run computes; where and how widely it runs may change on resume)")
        inputs = input_identity(config)
        changed = [k for k, v in (old.get("inputs") or inputs).items() if inputs.get(k) != v]
        if changed:
            raise UserError(f"--resume: inputs changed since the run in {shown or run_dir} started: {', '.join(changed)} "
                            "(other content)")
    elif saved.exists() or (run_dir / CHECKPOINTS).exists():
        raise UserError(f"output_dir: {run_dir} already holds a run: {_occupied(config, run_dir)}")
    else:
        refuse_foreign(run_dir)  # a fresh run never writes over a user's metrics.jsonl (or beside their files)


def _blocking_differences(old: TrainConfig, new: TrainConfig) -> list[str]:
    """The fields that make ``new`` another run than ``old``: those of the config hash, not the run fields
    (launcher, num_workers, output_dir... may change on resume) nor the input paths (compared by content)."""
    a, b = old.model_dump(mode="json"), new.model_dump(mode="json")
    skip = TrainConfig.run_fields | TrainConfig.input_fields
    return sorted(k for k in a if k not in skip and a[k] != b.get(k)) or ["fields of an older version"]


def _occupied(config: TrainConfig, run_dir: Path) -> str:
    """What to do about a run directory that already holds a run, said by its status: --resume only
    where it can work (this very config and these inputs, not finished)."""
    st = status(config)
    if st.state == "partial":
        return f"this config's, {st.reason}; pass --resume to continue it, or choose another directory"
    if st.done:
        return "this config's, finished (every step checkpointed); nothing to train: choose another directory"
    if st.reason == "config differs":
        try:
            old = build_config(TrainConfig, json.loads((run_dir / RUN_CONFIG).read_text(encoding="utf-8"))["config"],
                               str(run_dir / RUN_CONFIG))
            why = f"another config's (differs in {', '.join(_blocking_differences(old, config))})"
        except (OSError, ValueError, KeyError, TypeError, UserError):
            why = "another config's"
    else:
        why = f"not this one ({st.reason})"
    return f"{why}, which --resume cannot continue; choose another directory"


def _resume_point(ckpt: CheckpointManager, rank: int, resume) -> Optional[Path]:
    """The checkpoint to resume from, verified on every rank before any write. A damaged latest is
    refused naming the previous complete one; ``resume="previous-good"`` takes the newest that verifies."""
    first_problem = None
    for path in reversed(ckpt.all()):
        same_world = read_state(path).get("world_size", 1) == dist_world_size()
        try:
            verify_collective(path, rank, same_world)  # a damaged file is refused before any write
        except UserError as err:
            first_problem = first_problem or str(err)
            continue
        if first_problem is None or resume == "previous-good":
            return path
        raise UserError(f"{first_problem}; the previous complete checkpoint is {path}: pass "
                        "`--resume previous-good` to resume from it")
    if first_problem is not None:
        raise UserError(f"{first_problem} (no earlier complete checkpoint to resume from)")
    return None


def dist_world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


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


def _check(config: TrainConfig, resume: bool, remote: Optional[RemoteRun] = None) -> _Plan:
    # A missing or foreign data dir is refused before the process group forms: every rank says so at
    # once, instead of first waiting for its peers (and DeepSpeed's op builds) under a loaded machine.
    Manifest.read(config.data_dir, kind="instances")
    if remote is not None:  # an s3:// run: reachable, nothing foreign, a run there exactly when resuming
        remote.refuse(resume)
    world = init_distributed(config)
    if remote is not None:  # the node-local mirror: the run's records and latest complete checkpoint
        problem = None
        try:
            remote.pull(resume, world.local_rank)
        except UserError as err:
            problem = str(err)
        agree(problem)  # also the barrier: no rank reads the mirror before it is complete
    dataset = InstanceDataset(config.data_dir)
    mc = config.build_model_config(dataset.vocab_size)
    dataset.check_model(mc, max_seq_length=config.max_seq_length, max_predictions_per_seq=config.max_predictions_per_seq)
    if not resume:  # a resumed run checks it below, on the accumulation of its world size
        config.global_batch(world.world_size)
    vocab = _checked_vocab(dataset)
    init_state = _init_weights(config, dataset, mc, vocab)
    run_dir = remote.local if remote is not None else Path(config.output_dir)
    _prepare_run_dir(config, run_dir, resume, remote.uri if remote is not None else None)
    ckpt = CheckpointManager(run_dir, config.keep_last, world.rank, _barrier, remote=remote)
    latest = _resume_point(ckpt, world.rank, resume) if resume else None
    run_config = config
    if latest is not None:
        saved = read_state(latest)
        if dataset.vocab_hash and saved.get("vocab_hash") not in (None, dataset.vocab_hash):
            raise UserError(f"--resume: {latest} was trained with vocab hash {saved['vocab_hash']}, the data "
                            f"in {dataset.dir} has {dataset.vocab_hash}")
        same_world = saved.get("world_size", world.world_size) == world.world_size
        if not same_world:
            run_config = elastic_config(config, saved, world.world_size, latest)
    run_config.global_batch(world.world_size)
    return _Plan(world, dataset, mc, vocab, init_state, run_dir, ckpt, latest, run_config)


def _build(config: TrainConfig, plan: _Plan):
    """Model (same init on every rank), engine, loader; restored from the latest checkpoint on resume."""
    world = plan.world
    seed_all(config.seed)
    model = BertForPreTraining(plan.model_config)
    if plan.init_state is not None:
        model.load_state_dict(plan.init_state)
        model.tie_weights()
    engine = make_engine(model, config, world)
    seed_all(config.seed + 1 + world.rank)  # dropout differs across ranks, reproducibly
    loader = BatchLoader(plan.dataset, config.micro_batch_size, world.rank, world.world_size, config.seed,
                         plan.model_config.pad_token_id, grad_accum_steps=config.grad_accum_steps, prefetch=2)
    state = {"step": 0, "tokens_seen": 0}
    if plan.latest is not None:
        same_world = read_state(plan.latest).get("world_size", world.world_size) == world.world_size
        state = plan.ckpt.load(plan.latest, engine, check=False, same_world=same_world)  # + this rank's RNG
        loader.load_state_dict(state["loader"])
        if not same_world:  # the saved RNG streams were other ranks': a fresh one per (step, rank)
            seed_all(config.seed + 1 + world.rank + 1_000_003 * int(state["step"]))
    return engine, loader, int(state["step"]), int(state["tokens_seen"])


def run(config: TrainConfig, resume: bool = False) -> TrainResult:
    """Train (or resume) one run; every rank of a launch calls this with the same config.
    Rank 0 holds the output directory's one-writer lock (contracts.lock; on an object store the lease
    of contracts.lease, renewed while training) for the whole run."""
    remote = remote_for(config.output_dir)
    if int(os.environ.get("RANK", "0")) != 0:
        return _run(config, resume, remote)
    if remote is None:
        with output_lock(config.output_dir):
            return _run(config, resume)
    stage = run_stage(remote.uri)
    with stage.lock():
        remote.lease = stage.store._lease
        return _run(config, resume, remote)


def _run(config: TrainConfig, resume: bool, remote: Optional[RemoteRun] = None) -> TrainResult:
    plan = _check(config, resume, remote)
    world, run_dir, mc = plan.world, plan.run_dir, plan.model_config
    _barrier()  # every rank has checked before rank 0 writes anything
    if world.rank == 0:
        run_dir.mkdir(parents=True, exist_ok=True)
        if plan.latest is not None:  # --resume previous-good: the damaged later ones never become latest
            for later in [c for c in plan.ckpt.all() if step_of(c) > step_of(plan.latest)]:
                later.rename(later.with_name(f"damaged-{later.name}"))
        # The run's record, before any step: the directory is this config's run from here on.
        run_stage(run_dir).commit([], config.resume_hash(), input_identity(config), config=config.model_dump(mode="json"))
        if remote is not None:
            remote.push_record(run_dir, RUN_CONFIG)
    config = plan.config
    engine, loader, step, tokens_seen = _build(config, plan)
    logger = MetricsLogger(run_dir, world.rank == 0, mc, start_step=step, max_steps=config.max_steps,
                           log_every=config.log_every, tensorboard=config.tensorboard,
                           peak=peak_flops(config.peak_tflops, config.precision))
    logger.tokens_seen = tokens_seen
    files: dict[str, Any] = {RUN_CONFIG: config.model_dump(mode="json"), "model_config.json": mc.model_dump(mode="json")}
    if config.engine == "deepspeed":
        files["ds_config.json"] = ds_config(config, world.world_size)
    if plan.vocab is not None:
        files["vocab.txt"] = plan.vocab
    last, record = plan.latest, {}
    try:
        while step < config.max_steps:
            metrics = engine.step([next(loader) for _ in range(config.grad_accum_steps)])
            step += 1
            _check_finite(step, metrics, config)
            record = logger.log(step, metrics, config.global_batch(world.world_size)) or record
            if step % config.save_every == 0 or step == config.max_steps:
                state = {"step": step, "tokens_seen": logger.tokens_seen, "loader": loader.state_dict(),
                         "engine": config.engine, "zero_stage": config.zero_stage,
                         "world_size": world.world_size, "vocab_hash": plan.dataset.vocab_hash,
                         "lowercase": bool(plan.dataset.manifest.totals.get("lowercase", True))}
                last = plan.ckpt.save(step, engine, state, files)
                if remote is not None and world.rank == 0:
                    remote.push_record(run_dir, METRICS_FILE)
    finally:
        loader.close()
        logger.close()
    if remote is not None:
        return _finish_remote(remote, world, last, record)
    return TrainResult(run_dir, last, run_dir / METRICS_FILE, record)


def _finish_remote(remote: RemoteRun, world: World, last: Optional[Path], record: dict) -> TrainResult:
    """The metrics uploaded whole, then the node-local mirror removed (every rank is done with it)."""
    if world.rank == 0:
        remote.push_record(remote.local, METRICS_FILE)
    _barrier()
    if world.local_rank == 0:
        remote.close()
    ckpt = f"{remote.uri}/checkpoints/{last.name}" if last is not None else None
    return TrainResult(remote.uri, ckpt, f"{remote.uri}/{METRICS_FILE}", record)


if __name__ == "__main__":
    # `python -m bert_core.train` is `bertflow train`: the launcher module decides what runs here (the
    # ranks it starts under torchrun/deepspeed come back to this line and train in this process).
    from bert_core.launch import main as _launch_main

    raise SystemExit(_launch_main())
