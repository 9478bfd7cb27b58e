"""Typed configs of the four evaluations (pydantic v2; the CLI loads them from YAML, Prefect renders them
as forms). Imports neither torch nor Ray.

Every evaluation shares :class:`EvalBase` (which model, which vocab, where results go, how jobs run);
the fine-tuning evaluations add :class:`FinetuneOptions` (the BERT paper's recipe: batch 32, 3 epochs,
learning rate picked on dev from {5e-5, 4e-5, 3e-5, 2e-5}, several seeds).
"""
from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field, field_validator, model_validator

from contracts.common import StrictModel, stable_hash

GLUE_TASKS = ("CoLA", "SST-2", "MRPC", "STS-B", "QQP", "MNLI", "QNLI", "RTE", "WNLI")


class EvalBase(StrictModel):
    """What is evaluated, with which vocab, where the results go and how the jobs are spread."""

    input_fields = frozenset({"model_path", "vocab_file"})  # by content identity (bert_core.identity)
    # where the results go and how the jobs are spread (threads_per_task is not one: it changes float sums)
    run_fields = frozenset({"output_dir", "use_ray", "ray_address", "cpus_per_task", "gpus_per_task", "show_progress"})

    model_path: str = Field(..., description="Hugging Face BERT directory, bertflow checkpoint dir or training run dir")
    model_format: Literal["auto", "hf", "checkpoint"] = Field(
        "auto", description="auto: a dir with config.json that is no bertflow checkpoint or run dir is Hugging Face, "
        "anything else a checkpoint"
    )
    random_init: bool = Field(
        False, description="ignore the weights and start from a fresh random init of the same shape (baseline)"
    )
    vocab_file: Optional[str] = Field(
        None, description="task tokenizer vocab; must equal the model's vocab (None = use the model's vocab)"
    )
    lowercase: bool = Field(True, description="uncased tokenizer: lowercase and strip accents")
    output_dir: str = Field(..., description="directory receiving results.json, report.md and predictions")
    use_ray: bool = Field(True, description="run each (task, lr, seed) as a Ray task; False = one after another here")
    ray_address: Optional[str] = Field(None, description="existing Ray cluster address; None = local cluster")
    cpus_per_task: float = Field(1.0, gt=0, description="num_cpus each Ray task declares")
    gpus_per_task: float = Field(0.0, ge=0, description="num_gpus each Ray task declares (0 on CPU machines)")
    threads_per_task: int = Field(1, ge=1, description="torch.set_num_threads inside each task")
    show_progress: bool = Field(True, description="tqdm progress bars")


class FinetuneOptions(StrictModel):
    """Fine-tuning hyper-parameters (defaults: BERT paper, section 4 / appendix A.3)."""

    learning_rates: list[float] = Field(
        default_factory=lambda: [5e-5, 4e-5, 3e-5, 2e-5], min_length=1, description="grid; best chosen on dev"
    )
    seeds: list[int] = Field(default_factory=lambda: [1, 2, 3], min_length=1, description="runs per lr: mean ± std")
    batch_size: int = Field(32, ge=1, description="training batch size")
    eval_batch_size: int = Field(64, ge=1, description="batch size for dev/test prediction")
    epochs: float = Field(3.0, gt=0, description="training epochs (fractions allowed)")
    max_steps: Optional[int] = Field(None, ge=1, description="stop after this many steps (overrides epochs)")
    warmup_proportion: float = Field(0.1, ge=0, lt=1, description="linear warmup over this fraction of steps")
    weight_decay: float = Field(0.01, ge=0, description="AdamW weight decay (not on biases and LayerNorm)")
    max_grad_norm: float = Field(1.0, gt=0, description="gradient clipping norm")
    max_seq_length: int = Field(128, ge=8, description="tokens per example incl. [CLS]/[SEP]")
    max_train_examples: Optional[int] = Field(None, ge=1, description="use only the first N training examples")
    max_eval_examples: Optional[int] = Field(None, ge=1, description="score only the first N dev examples")
    precision: Literal["fp32", "bf16"] = Field(
        "fp32", description="bf16: autocast the forward passes (fp32 weights, optimizer and loss); CPUs with "
        "AVX-512-BF16 and GPUs"
    )

    @field_validator("learning_rates")
    @classmethod
    def _positive(cls, v: list[float]) -> list[float]:
        if any(lr <= 0 for lr in v):
            raise ValueError("learning rates must be positive")
        return v

    def config_hash(self) -> str:
        """StrictModel's rule, minus the options added after fine-tuning configs were first hashed while they
        keep their defaults: the stage records and pipeline directory names of older configs stay valid."""
        data = self.model_dump(mode="json", exclude=set(self.run_fields | self.input_fields))
        return stable_hash(without_later_defaults(data))


def _by_task_name(per_task: dict) -> dict:
    """A per-task mapping keyed by the tasks' names as ``--tasks`` reads them (``sst2`` is SST-2); an
    unknown task is refused."""
    names = {t.replace("-", "").lower(): t for t in GLUE_TASKS}
    out = {}
    for task, value in per_task.items():
        name = names.get(str(task).replace("-", "").lower())
        if name is None:
            raise ValueError(f"unknown GLUE task {task!r}; choose from {', '.join(GLUE_TASKS)}")
        out[name] = value
    return out


class GlueConfig(EvalBase, FinetuneOptions):
    """GLUE: fine-tune on each task's train.tsv, score on dev, optionally predict test.tsv and keep the
    fine-tuned models; or (predict_only) predict and score with a model kept that way."""

    input_fields = EvalBase.input_fields | {"glue_dir"}

    glue_dir: str = Field(..., description="directory holding one folder per task (SST-2/train.tsv, ...)")
    tasks: list[str] = Field(default_factory=lambda: ["SST-2"], min_length=1, description=f"any of {GLUE_TASKS}")
    write_test_predictions: bool = Field(True, description="write GLUE submission TSVs for tasks with test.tsv")
    task_epochs: dict[str, float] = Field(
        default_factory=dict, description="epochs for the tasks named, overriding epochs (e.g. SST-2: 1 gives its "
        "67k examples one pass while the small tasks get the paper's 3)"
    )
    task_seeds: dict[str, list[int]] = Field(
        default_factory=dict, description="seeds for the tasks named, overriding seeds (e.g. STS-B: [1, ..., 8] "
        "gives the task where small models show transfer enough seeds for a confidence interval)"
    )
    save_models: Literal["none", "best", "all"] = Field(
        "none", description="keep fine-tuned models as Hugging Face directories under <output_dir>/models: best = "
        "the run the test predictions come from (chosen lr, best-dev seed), all = every (task, lr, seed)"
    )
    predict_only: bool = Field(
        False, description="model_path is a model saved by save_models: fine-tune nothing, predict test.tsv and "
        "score the dev files that exist (train.tsv is not needed)"
    )
    select_on: Literal["dev", "train_split"] = Field(
        "dev", description="what picks the lr: dev = the BERT paper's way (dev both picks and is reported); "
        "train_split = a held-out part of train.tsv picks the lr and the epoch (the end of each whole epoch), "
        "never trained on; dev is only reported, at that choice"
    )
    select_fraction: float = Field(
        0.1, gt=0, lt=0.5, description="select_on train_split: the fraction of train.tsv held out for the choice"
    )
    select_max: int = Field(
        2000, ge=1, description="select_on train_split: at most this many examples held out (SST-2's 10 % would "
        "be 6,700)"
    )

    @field_validator("task_epochs")
    @classmethod
    def _task_epochs(cls, v: dict[str, float]) -> dict[str, float]:
        for task, epochs in v.items():
            if not epochs > 0:
                raise ValueError(f"{task}: epochs must be positive, got {epochs}")
        return {name: float(epochs) for name, epochs in _by_task_name(v).items()}

    @field_validator("task_seeds")
    @classmethod
    def _task_seeds(cls, v: dict[str, list[int]]) -> dict[str, list[int]]:
        for task, seeds in v.items():
            if not seeds or len(set(seeds)) != len(seeds):
                raise ValueError(f"{task}: seeds must be a non-empty list without repeats, got {seeds}")
        return {name: list(seeds) for name, seeds in _by_task_name(v).items()}

    def seeds_of(self, task: str) -> list[int]:
        """The seeds ``task`` runs with: its task_seeds entry, else ``seeds``."""
        return self.task_seeds.get(task, list(self.seeds))

    def epochs_of(self, task: str) -> float:
        """The epochs ``task`` trains for: its task_epochs entry, else ``epochs``."""
        return self.task_epochs.get(task, self.epochs)

    @model_validator(mode="after")
    def _predict_alone(self) -> "GlueConfig":
        if self.predict_only and self.random_init:
            raise ValueError("predict_only uses the fine-tuned weights; it cannot be combined with random_init")
        if self.predict_only and self.save_models != "none":
            raise ValueError("predict_only fine-tunes nothing, so there is no model to save (save_models: none)")
        if self.select_on == "train_split" and self.save_models != "none":
            raise ValueError("select_on train_split may choose an earlier epoch than the last, whose model is not "
                             "kept: use save_models none, or select_on dev")
        return self


# Options added to the fine-tuning configs after results and resumable cells were first keyed by its fields. Left at
# these defaults they are dropped from every hash (config_hash, evaluation.cells.cell_key), so an older
# config keeps its stage record, its pipeline directory and its finished cells.
LATER_DEFAULTS = {"save_models": "none", "predict_only": False, "precision": "fp32", "task_epochs": {},
                  "task_seeds": {}, "select_on": "dev", "select_fraction": 0.1, "select_max": 2000}


def without_later_defaults(data: dict) -> dict:
    """``data`` (a config dump) without the LATER_DEFAULTS options that hold their default value."""
    return {k: v for k, v in data.items() if k not in LATER_DEFAULTS or v != LATER_DEFAULTS[k]}


class SquadConfig(EvalBase, FinetuneOptions):
    """SQuAD v1.1 span extraction. Without a train file, dev is split: train on one part, score the rest."""

    input_fields = EvalBase.input_fields | {"dev_file", "train_file"}

    dev_file: str = Field(..., description="dev-v1.1.json (official format)")
    train_file: Optional[str] = Field(None, description="train-v1.1.json; None = split dev by article")
    train_articles: int = Field(10, ge=1, description="with no train_file: the first N dev articles train")
    max_train_questions: Optional[int] = Field(None, ge=1, description="use at most N training questions")
    max_eval_questions: Optional[int] = Field(None, ge=1, description="score at most N questions")
    doc_stride: int = Field(128, ge=1, description="step between context windows, in tokens")
    max_query_length: int = Field(64, ge=1, description="question tokens kept")
    max_answer_length: int = Field(30, ge=1, description="longest predicted answer, in tokens")


class NerConfig(EvalBase, FinetuneOptions):
    """CoNLL-2003 NER (IOB2): fine-tuning and the feature-based BiLSTM variant of the BERT paper."""

    input_fields = EvalBase.input_fields | {"conll_dir"}

    conll_dir: str = Field(..., description="directory with train.txt, valid.txt (and test.txt)")
    modes: list[Literal["finetune", "feature"]] = Field(
        default_factory=lambda: ["finetune", "feature"], min_length=1, description="which variants to run"
    )
    eval_split: Literal["valid", "test"] = Field("valid", description="split scored (lr is chosen on it)")
    max_train_sentences: Optional[int] = Field(None, ge=1, description="use only the first N training sentences")
    max_eval_sentences: Optional[int] = Field(None, ge=1, description="score only the first N sentences")
    feature_layers: list[int] = Field(
        default_factory=lambda: [-4, -3, -2, -1],
        min_length=1,
        description="hidden states concatenated for the feature-based model (0 = embeddings, -1 = last layer)",
    )
    lstm_hidden: int = Field(128, ge=1, description="BiLSTM hidden size per direction (feature-based)")
    lstm_layers: int = Field(2, ge=1, description="BiLSTM layers (feature-based)")
    feature_learning_rates: list[float] = Field(
        default_factory=lambda: [1e-3], min_length=1, description="Adam lr grid of the BiLSTM (feature-based)"
    )
    feature_epochs: float = Field(5.0, gt=0, description="BiLSTM training epochs (feature-based)")


class IntrinsicConfig(EvalBase):
    """Held-out MLM/NSP accuracy and MLM perplexity for every checkpoint of a run, as a curve."""

    input_fields = EvalBase.input_fields | {"instances_dir"}

    instances_dir: str = Field(..., description="held-out instance dataset (output of `bertflow data instances`)")
    batch_size: int = Field(32, ge=1, description="instances per batch")
    max_batches: Optional[int] = Field(None, ge=1, description="score at most N batches per checkpoint")
    all_checkpoints: bool = Field(True, description="every checkpoint of the run dir; False = only model_path")
