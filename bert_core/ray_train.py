"""Ray Train (V2): ``num_workers`` TorchTrainer workers each call the same ``train.run``. Started by
``bert_core.launch`` (launcher ray), which reads the result back from ``output_dir``.

Ray Train sets up the torch process group (gloo on CPU, nccl on GPU); DeepSpeed joins it (the engine
imports DeepSpeed inside the worker process, never in the driver). Checkpoints, metrics and
TensorBoard files go to ``output_dir`` exactly as with torchrun, so ``--resume`` and ``bertflow
export`` work the same whichever launcher wrote the run; ``output_dir`` must therefore be on storage
every worker node sees: an ``s3://`` prefix (bert_core.remote_run; Ray Train's storage path is then the
sibling prefix ``.ray-NAME``) or a shared file system.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

from bert_core.train_config import TrainConfig
from contracts.common import UserError
from contracts.storage import is_uri


def _worker(loop_config: dict[str, Any]) -> None:
    """Runs in each Ray Train worker process."""
    import ray.train

    from bert_core.train import run

    ctx = ray.train.get_context()
    # train.run reads the rank layout from the environment, as under torchrun.
    os.environ.update(RANK=str(ctx.get_world_rank()), WORLD_SIZE=str(ctx.get_world_size()),
                      LOCAL_RANK=str(ctx.get_local_rank()))
    config = TrainConfig.model_validate(loop_config["config"])
    result = run(config, resume=loop_config["resume"])
    # Ray Train V2's report is collective: every worker must call it, or the group waits forever.
    ray.train.report({"last_checkpoint": str(result.last_checkpoint), **(result.final_metrics or {})})


def fit(config: TrainConfig, resume: bool = False, cpus_per_worker: Optional[float] = None) -> Path | str:
    """Train on a Ray cluster (``config.ray_address``, else a local one); returns the run directory."""
    import torch
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    from data_jobs.ray_util import ensure_ray

    ensure_ray(config.ray_address)
    use_gpu = torch.cuda.is_available()
    env = {"TORCH_EXTENSIONS_DIR": os.environ.get("TORCH_EXTENSIONS_DIR", str(Path.home() / ".cache" / "torch_extensions")),
           "TOKENIZERS_PARALLELISM": "false"}
    if is_uri(config.output_dir):  # an s3:// run (bert_core.remote_run); Ray's own files beside it there
        out: Path | str = config.output_dir.rstrip("/")
        parent, name = out.rsplit("/", 1)
        storage = f"{parent}/.ray-{name}"
    else:
        out = Path(config.output_dir).resolve()
        storage = str(out.parent / f".ray-{out.name}")
    trainer = TorchTrainer(
        _worker,
        train_loop_config={"config": config.model_copy(update={"output_dir": str(out)}).model_dump(mode="json"), "resume": resume},
        torch_config=TorchConfig(backend="nccl" if use_gpu else "gloo"),
        scaling_config=ScalingConfig(num_workers=config.num_workers, use_gpu=use_gpu,
                                     resources_per_worker={"CPU": cpus_per_worker or 1}),
        run_config=RunConfig(name="bertflow-train", storage_path=storage,
                             worker_runtime_env={"env_vars": env}),
    )
    try:
        trainer.fit()
    except Exception as err:  # a worker's UserError arrives wrapped: surface its one line
        cause = _user_error(err)
        if cause is not None:
            raise cause from None
        raise
    return out


def _user_error(err: BaseException) -> Optional[UserError]:
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, UserError):
            return err
        for attr in ("cause", "__cause__"):
            nxt = getattr(err, attr, None)
            if isinstance(nxt, BaseException):
                err = nxt
                break
        else:
            text = str(err)
            if "UserError: " in text:
                return UserError(text.split("UserError: ", 1)[1].splitlines()[0])
            return None
    return None
