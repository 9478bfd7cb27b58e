"""Training configuration (pydantic, strict) and the ONE place batch sizes are derived and checked.

A run is fully described by one ``TrainConfig``; ``--resume`` refuses a config whose hash (the one
rule of ``contracts.common.StrictModel.config_hash``: no launch/reporting fields, inputs by content)
or whose inputs differ from those stored in the run directory. Importing this module pulls in neither torch nor
DeepSpeed.
"""
from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import ConfigDict, Field, ValidationError, model_validator

from bert_core.config import PRESETS, ModelConfig, preset
from contracts.common import StrictModel, UserError, format_validation_error


class TrainConfig(StrictModel):
    """One pretraining run (phase 1 or phase 2) of BERT on a static-instances dataset."""

    model_config = ConfigDict(**StrictModel.model_config, protected_namespaces=())
    input_fields = frozenset({"data_dir", "init_from"})  # identity: the dataset's, the checkpoints'
    # where and how widely it runs, how it logs and how many checkpoints it keeps: never the weights
    run_fields = frozenset({"output_dir", "launcher", "num_workers", "hostfile", "ray_address", "log_every",
                            "tensorboard", "save_every", "keep_last", "peak_tflops"})

    # --- what to train, on what -------------------------------------------------------------
    model: Union[str, ModelConfig] = Field(
        "tiny", description="preset name (tiny|mini|small|base|large) or a full ModelConfig mapping"
    )
    model_overrides: dict[str, Any] = Field(
        default_factory=dict, description="ModelConfig fields replacing the preset's (e.g. vocab_size)"
    )
    dropout: Optional[float] = Field(
        None, ge=0.0, lt=1.0, description="override hidden and attention dropout (0 = deterministic runs)"
    )
    data_dir: str = Field(..., description="instances dataset directory (Parquet + manifest.json)")
    output_dir: str = Field(..., description="run directory: checkpoints, metrics.jsonl, tensorboard/")
    init_from: Optional[str] = Field(
        None, description="phase 2: start from these weights (a run dir, a checkpoint dir or a Hugging Face BERT dir)"
    )
    max_seq_length: Optional[int] = Field(
        None, ge=8, description="expected max_seq_length of the data (checked against the manifest); None = any"
    )
    max_predictions_per_seq: Optional[int] = Field(
        None, ge=1, description="expected max_predictions_per_seq of the data (checked); None = any"
    )

    # --- engine ------------------------------------------------------------------------------
    engine: Literal["torch", "deepspeed"] = Field("torch", description="plain torch (1 process) or DeepSpeed")
    zero_stage: int = Field(0, ge=0, le=3, description="DeepSpeed ZeRO stage (0 = plain data parallel)")
    precision: Literal["fp32", "bf16", "fp16"] = Field(
        "fp32", description="fp16 needs a GPU; bf16 runs on CPUs with AVX-512-BF16 and on GPUs"
    )

    fast_attention: bool = Field(
        False, description="SDPA without a mask for full-length batches (flash), boolean mask otherwise"
    )
    compile_blocks: bool = Field(
        False, description="torch.compile each encoder block (fuses bias+GELU, dropout+residual+LayerNorm)"
    )

    # --- optimisation ------------------------------------------------------------------------
    optimizer: Literal["adamw", "lamb"] = Field("adamw", description="AdamW, or LAMB with per-layer trust ratio")
    lr: float = Field(1e-4, gt=0.0, description="peak learning rate")
    betas: tuple[float, float] = Field((0.9, 0.999), description="Adam/LAMB beta1, beta2")
    eps: float = Field(1e-6, gt=0.0, description="Adam/LAMB epsilon")
    weight_decay: float = Field(0.01, ge=0.0, description="decoupled weight decay (not on biases/LayerNorm)")
    warmup_proportion: float = Field(0.1, ge=0.0, le=1.0, description="fraction of max_steps of linear warmup")
    schedule: Literal["linear", "poly"] = Field("linear", description="decay after warmup: linear or polynomial")
    poly_power: float = Field(0.5, gt=0.0, description="power of the polynomial decay (NVIDIA recipe: 0.5)")
    micro_batch_size: int = Field(8, ge=1, description="sequences per rank per forward/backward")
    grad_accum_steps: int = Field(1, ge=1, description="micro batches accumulated per optimizer step")
    global_batch_size: Optional[int] = Field(
        None, ge=1, description="if set, must equal micro_batch_size x grad_accum_steps x world size"
    )
    max_steps: int = Field(100, ge=1, description="optimizer steps of this run (the schedule spans them)")
    clip_grad_norm: float = Field(1.0, ge=0.0, description="global gradient-norm clip (0 = off)")
    seed: int = Field(42, description="seed of init, dropout and data order")

    # --- checkpoints and logging ---------------------------------------------------------------
    save_every: int = Field(100, ge=1, description="checkpoint every N optimizer steps (and at the end)")
    keep_last: int = Field(3, ge=1, description="keep the last K checkpoints")
    log_every: int = Field(10, ge=1, description="metrics every N steps: stdout, metrics.jsonl, TensorBoard")
    tensorboard: bool = Field(True, description="write TensorBoard event files under output_dir/tensorboard")
    peak_tflops: Optional[float] = Field(
        None, gt=0.0, description="device peak TFLOP/s for MFU; None = known GPUs' data sheet, else no MFU"
    )

    # --- launcher ----------------------------------------------------------------------------
    launcher: Literal["local", "torchrun", "deepspeed", "ray"] = Field(
        "local", description="local: this process; torchrun/deepspeed: started by those; ray: Ray Train workers"
    )
    num_workers: int = Field(
        1, ge=1, description="ranks started by launcher ray, torchrun or deepspeed (one node; ranks already "
        "started by torchrun/deepspeed take WORLD_SIZE from the env)",
    )
    hostfile: Optional[str] = Field(None, description="DeepSpeed hostfile for multi-node launches")
    ray_address: Optional[str] = Field(None, description="existing Ray cluster for launcher=ray; None = local")

    @model_validator(mode="after")
    def _check(self) -> "TrainConfig":
        if isinstance(self.model, str) and self.model not in PRESETS:
            raise ValueError(f"unknown model preset {self.model!r}; choose one of {', '.join(PRESETS)}")
        if not isinstance(self.model, str) and self.model_overrides:
            raise ValueError("model_overrides only apply to a preset name, not to a full model mapping")
        if self.optimizer == "lamb" and self.engine == "deepspeed" and self.zero_stage == 3:
            # ZeRO-1/2 hand LAMB one flat fp32 partition per rank; the engine tells LAMB which slices
            # belong to which parameter and LAMB all-reduces their squared norms (per-layer trust
            # ratio, bert_core.optim.attach_zero_partitions). ZeRO-3's partitioned optimizer is not
            # wired up that way: its trust ratio would be per partition, silently wrong.
            raise ValueError(
                "optimizer lamb needs per-layer trust ratios, which ZeRO-3's flattened partitions do not "
                "give it; use zero_stage 0, 1 or 2, engine torch, or optimizer adamw"
            )
        if self.engine == "torch" and self.zero_stage:
            raise ValueError("zero_stage needs engine deepspeed")
        # Launch combinations that cannot work are refused when the config is loaded, not after the
        # data stages ran (bert_core.launch starts what the config says).
        if self.engine == "torch" and self.launcher != "local" and self.num_workers > 1:
            raise ValueError(f"launcher {self.launcher} with num_workers > 1 needs engine deepspeed "
                             "(engine torch runs one process)")
        if self.hostfile and self.launcher != "deepspeed":
            raise ValueError("hostfile needs launcher deepspeed")
        return self

    def build_model_config(self, data_vocab_size: Optional[int] = None) -> ModelConfig:
        """The architecture. A preset without an explicit vocab_size takes the dataset's vocab size."""
        if isinstance(self.model, ModelConfig):
            mc = self.model
        else:
            over = dict(self.model_overrides)
            if data_vocab_size is not None and "vocab_size" not in over:
                over["vocab_size"] = data_vocab_size
            try:
                mc = preset(self.model, **over)
            except ValidationError as err:  # a ValueError too: first, so the line names the field
                raise UserError(format_validation_error(err, "model_overrides")) from None
            except (TypeError, ValueError) as err:
                raise UserError(f"model_overrides: {str(err).splitlines()[0]}") from None
        if self.dropout is not None:
            mc = mc.model_copy(update={"hidden_dropout_prob": self.dropout, "attention_probs_dropout_prob": self.dropout})
        return mc

    def global_batch(self, world_size: int) -> int:
        """global = micro x accumulation x world, checked once against global_batch_size."""
        derived = self.micro_batch_size * self.grad_accum_steps * world_size
        if self.global_batch_size is not None and self.global_batch_size != derived:
            hint = ""
            per = self.micro_batch_size * world_size
            if self.global_batch_size % per == 0:
                hint = f"; grad_accum_steps {self.global_batch_size // per} would match"
            raise UserError(
                f"global_batch_size: {self.global_batch_size} != micro_batch_size {self.micro_batch_size} x "
                f"grad_accum_steps {self.grad_accum_steps} x world size {world_size} = {derived}{hint}"
            )
        return derived

    def warmup_steps(self) -> int:
        return int(round(self.warmup_proportion * self.max_steps))

    def resume_hash(self) -> str:
        """The config hash (launch/reporting fields may change on resume); kept as the name runs record."""
        return self.config_hash()


def ds_config(config: TrainConfig, world_size: int) -> dict[str, Any]:
    """The DeepSpeed JSON, generated from the config (never hand-edited); saved beside each checkpoint.

    The optimizer and scheduler are passed to ``deepspeed.initialize`` as client objects (a torch
    AdamW or our LAMB): DeepSpeed's fused kernels are CUDA-only and its fused Adam is a 45 s JIT build.
    """
    cfg: dict[str, Any] = {
        "train_batch_size": config.global_batch(world_size),
        "train_micro_batch_size_per_gpu": config.micro_batch_size,
        "gradient_accumulation_steps": config.grad_accum_steps,
        "gradient_clipping": config.clip_grad_norm,
        "steps_per_print": 10**9,  # we log ourselves
        "wall_clock_breakdown": False,
        "zero_allow_untested_optimizer": True,
        "zero_optimization": {"stage": config.zero_stage},
        "bf16": {"enabled": config.precision == "bf16"},
        "fp16": {"enabled": config.precision == "fp16"},
    }
    if config.zero_stage >= 2:
        cfg["zero_optimization"].update(
            {"overlap_comm": False, "contiguous_gradients": True, "reduce_bucket_size": 5e7}
        )
    if config.zero_stage == 3:
        cfg["zero_optimization"].update(
            {"stage3_gather_16bit_weights_on_model_save": False, "stage3_param_persistence_threshold": 1e4}
        )
    if config.precision == "fp16":
        cfg["fp16"].update({"loss_scale": 0, "initial_scale_power": 16, "hysteresis": 2, "min_loss_scale": 1})
    return cfg


def elastic_config(config: TrainConfig, saved: dict[str, Any], world_size: int, where: Any) -> TrainConfig:
    """The config of a run resumed on another world size: the saved global batch is kept and the
    accumulation absorbs the change (global = micro x accumulation x world, as ``global_batch``).

    ZeRO-0 state is whole on every rank; ZeRO-1/2 optimizer state (fp32 or bf16) is repartitioned at
    load (``bert_core.zero_reshard``). ZeRO-3 also shards the weights, which DeepSpeed cannot move."""
    saved_world = int(saved.get("world_size", world_size))
    if config.engine == "deepspeed" and config.zero_stage == 3:
        raise UserError(
            f"--resume: {where} was written by {saved_world} ranks, this launch has {world_size}; resuming on "
            "another world size needs zero_stage 0, 1 or 2 (ZeRO-3 partitions the weights per rank and "
            "cannot be repartitioned on load)"
        )
    cursor = saved.get("loader", {})
    global_batch = int(cursor.get("global_batch_size") or
                       config.micro_batch_size * config.grad_accum_steps * saved_world)
    per = config.micro_batch_size * world_size
    if global_batch % per:
        raise UserError(
            f"--resume: the global batch {global_batch} of {where} is not a multiple of micro_batch_size "
            f"{config.micro_batch_size} x world size {world_size}; launch a world size that divides it"
        )
    resumed = config.model_copy(update={"grad_accum_steps": global_batch // per})
    resumed.global_batch(world_size)  # global_batch_size, if set, still agrees
    return resumed
