"""One typed config for a whole pipeline run, and the plan derived from it.

``PipelineConfig`` composes the stage configs without their wiring (input/output paths): the plan
fills those in, naming every output directory after the config that produces it and where its inputs
lie (``<output_root>/documents/<hash>``, ``vocab/<hash>``, ``instances/<phase>-<hash>``, ...). Names
use paths relative to ``output_root`` (so a moved output tree keeps its names) and chain: another
corpus path gives another documents directory, hence other vocab inputs, and so on. A rerun of the
same config lands on the same directories; each stage's own ``status`` then decides, from its config
hash and its inputs' content, whether it is done (a corpus edited in place is redone, and with it
everything downstream).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from bert_core.train_config import TrainConfig
from contracts.common import StrictModel, UserError, build_config, load_yaml, stable_hash
from contracts.storage import is_uri
from data_jobs.config import InstancesConfig, ShardConfig, VocabConfig, source_weights
from evaluation.config import GlueConfig, IntrinsicConfig, NerConfig, SquadConfig
from flows.specs import complete, spec_of

ShardSpec = spec_of(ShardConfig, {"output_dir"}, "ShardSpec", "Raw text -> document shards (ShardConfig minus output_dir).")
VocabSpec = spec_of(VocabConfig, {"output_dir", "shards_dir"}, "VocabSpec", "WordPiece vocab (VocabConfig minus paths).")
InstancesSpec = spec_of(
    InstancesConfig, {"output_dir", "shards_dir", "vocab_dir"}, "InstancesSpec", "MLM/NSP instances (minus paths)."
)
TrainSpec = spec_of(
    TrainConfig, {"output_dir", "data_dir", "init_from"}, "TrainSpec", "One pretraining phase (TrainConfig minus paths)."
)
_EVAL_WIRING = {"model_path", "output_dir"}
IntrinsicSpec = spec_of(IntrinsicConfig, _EVAL_WIRING | {"instances_dir"}, "IntrinsicSpec", "MLM/NSP accuracy of every checkpoint (IntrinsicConfig minus paths).")
GlueSpec = spec_of(GlueConfig, _EVAL_WIRING, "GlueSpec", "GLUE fine-tuning (GlueConfig minus paths).")
SquadSpec = spec_of(SquadConfig, _EVAL_WIRING, "SquadSpec", "SQuAD v1.1 (SquadConfig minus paths).")
NerSpec = spec_of(NerConfig, _EVAL_WIRING, "NerSpec", "CoNLL-2003 NER (NerConfig minus paths).")


class PhaseSpec(StrictModel):
    """One pretraining phase: its instances (e.g. seq 128, then seq 512) and its training run."""

    name: str = Field(..., pattern=r"^[a-z0-9][a-z0-9_-]*$", description="phase name used in directory names")
    instances: InstancesSpec = Field(..., description="static MLM/NSP instances this phase trains on")
    train: TrainSpec = Field(..., description="the training run; phase 2 starts from phase 1's weights")


class EvaluationSpec(StrictModel):
    """Which evaluations run on the exported model; a task left empty is not run."""

    intrinsic: Optional[IntrinsicSpec] = Field(
        None, description="MLM/NSP accuracy and perplexity on held-out instances, for every checkpoint"
    )
    heldout_shards: int = Field(
        1, ge=0, description="document shards held out of every phase's training instances and used for the "
        "intrinsic evaluation (0: re-make the training documents with heldout_seed instead)",
    )
    heldout_seed: int = Field(
        987654321, description="seed of the held-out instances made for intrinsic (fresh masks and pairs)"
    )
    glue: Optional[GlueSpec] = Field(None, description="GLUE tasks")
    squad: Optional[SquadSpec] = Field(None, description="SQuAD v1.1")
    ner: Optional[NerSpec] = Field(None, description="CoNLL-2003 NER")


class Orchestration(StrictModel):
    """How the flow runs its stages (not part of any output's hash)."""

    ray_job_address: Optional[str] = Field(
        None, description="Ray dashboard address (http://host:8265): submit data stages as Ray Jobs there"
    )
    job_python: str = Field("python", description="python executable of the Ray cluster's job drivers")
    retries: int = Field(2, ge=0, description="retries of tasks that can fail transiently (data jobs, export)")
    retry_delay_s: list[float] = Field(
        default_factory=lambda: [10.0, 60.0], description="backoff between retries, in seconds (last repeats)"
    )
    train_retries: int = Field(1, ge=0, description="retries of a training phase (each resumes its last checkpoint)")


class PipelineConfig(StrictModel):
    """A whole run: data -> vocab -> instances per phase -> pretraining phases -> export -> evaluation."""

    output_root: str = Field("runs/pipeline", description="every output lands under here, named by config hash")
    shard: ShardSpec = Field(..., description="raw text -> document shards")
    vocab: VocabSpec = Field(default_factory=VocabSpec, description="WordPiece vocab (trained or adopted)")
    phases: list[PhaseSpec] = Field(..., min_length=1, max_length=4, description="pretraining phases, in order")
    source_weights: dict[str, float] = Field(
        default_factory=dict, description="sources by weight in every phase's instances (a phase's own "
        "instances.source_weights wins), e.g. {wikipedia_mlperf: 2, gutenberg: 1}: keys name an input file or "
        "folder relative to the corpus root; see data_jobs/source_weights.py"
    )
    evaluation: EvaluationSpec = Field(default_factory=EvaluationSpec, description="evaluations of the final model")
    orchestration: Orchestration = Field(default_factory=Orchestration, description="retries, Ray Jobs")

    later_defaults = {"source_weights": {}}
    _source_weights = field_validator("source_weights")(classmethod(lambda cls, v: source_weights(v)))

    @model_validator(mode="after")
    def _unique_phases(self) -> "PipelineConfig":
        names = [p.name for p in self.phases]
        if len(set(names)) != len(names):
            raise ValueError(f"phase names must be unique, got {names}")
        # A spec carries its stage's fields, not its validators: check each phase's training config
        # now (launcher/engine/worker combinations...), not after the data stages ran.
        for phase in self.phases:
            data = {**phase.train.model_dump(mode="python"), "data_dir": ".", "output_dir": "."}
            try:
                TrainConfig.model_validate(data)
            except ValidationError as err:
                raise ValueError(f"phases[{phase.name}].train: " + "; ".join(e["msg"] for e in err.errors())) from None
        return self

    @classmethod
    def from_yaml(cls, path: str | Path, overrides: dict[str, Any] | None = None) -> "PipelineConfig":
        data = load_yaml(path)
        data.update({k: v for k, v in (overrides or {}).items() if v is not None})
        return build_config(cls, data, str(path))


class Plan(BaseModel):
    """Every concrete stage config of a pipeline run, with derived absolute paths."""

    root: Path | str  # a local directory, or an object-store prefix (a URI string)
    shard: ShardConfig
    vocab: VocabConfig
    instances: dict[str, InstancesConfig]
    train: dict[str, TrainConfig]
    export_dir: Path | str
    heldout: Optional[InstancesConfig] = None
    evals: dict[str, Any] = Field(default_factory=dict)
    report_dir: Path | str

    def eval_of(self, kind: str, model_path: str) -> Any:
        """Evaluation ``kind`` of another model than the pipeline's export (``--stage eval --model-path``):
        its results beside the pipeline's, named by that model's absolute path or URI."""
        model = model_path if is_uri(model_path) else str(Path(model_path).expanduser().resolve())
        ecfg = self.evals[kind]
        out = str(ecfg.output_dir).rstrip("/")
        return ecfg.model_copy(update={"model_path": model, "output_dir": f"{out}-model-{stable_hash(model)[:8]}"})


Where = Path | str  # a local path, or an object-store URI (contracts.storage.is_uri)


def join(root: Where, *parts: str) -> Where:
    """``root/parts``: a Path under a local root, a URI string under an object-store prefix."""
    return f"{str(root).rstrip('/')}/{'/'.join(parts)}" if isinstance(root, str) else root.joinpath(*parts)


def name_of(where: Where) -> str:
    return str(where).rstrip("/").rpartition("/")[2]


def _rel(v: Where, root: Where) -> str:
    if isinstance(root, str):
        return str(v)[len(root.rstrip("/")) + 1:]
    return str(Path(v).relative_to(root))


def _named(root: Where, kind: str, model: type, spec: BaseModel, prefix: str = "", **wiring: Any) -> tuple[Where, Any]:
    """(absolute output dir, concrete config) for a stage: the dir is named by the hash of the config
    whose paths are relative to ``root``, so the name does not depend on where the root lives."""
    rel_wiring = {k: (_rel(v, root) if isinstance(v, (Path, str)) else v) for k, v in wiring.items()}
    probe = complete(model, spec, f"{kind} config", output_dir=".", **rel_wiring)
    # A directory name, not a status: the config hash (no input paths, by the one rule) plus where the
    # inputs are within the tree, so two corpora or two upstream configs never share a directory.
    # Whether a stage is done is each stage's own status (inputs by content).
    # The wired inputs by their root-relative names as given (a config makes relative paths absolute
    # against the working directory: the name must not depend on where the command was started).
    digest = stable_hash([probe.config_hash(), model.without_later_defaults(
        {k: rel_wiring.get(k, getattr(probe, k)) for k in sorted(model.input_fields)})])
    out = join(root, kind, f"{prefix}{digest}")
    abs_wiring = {k: (str(v) if isinstance(v, (Path, str)) else v) for k, v in wiring.items()}
    return out, complete(model, spec, f"{kind} config", output_dir=str(out), **abs_wiring)


def _weighted(spec: BaseModel, cfg: PipelineConfig) -> BaseModel:
    """A phase's instances spec with the pipeline's ``source_weights`` unless it names its own; validated
    as the field's own validator would (keys without trailing slashes, sorted)."""
    if not cfg.source_weights or spec.source_weights:
        return spec
    return type(spec).model_validate({**spec.model_dump(), "source_weights": cfg.source_weights})


def make_plan(cfg: PipelineConfig) -> Plan:
    root: Where = cfg.output_root.rstrip("/") if is_uri(cfg.output_root) else Path(cfg.output_root).expanduser().resolve()
    docs_dir, shard = _named(root, "documents", ShardConfig, cfg.shard)
    vocab_dir, vocab = _named(root, "vocab", VocabConfig, cfg.vocab, shards_dir=docs_dir)
    instances, train = {}, {}
    prev_run: Optional[Where] = None
    ev = cfg.evaluation
    # Held-out documents: the last shards (a hash-random sample of documents) stay out of training.
    hold = ev.heldout_shards if ev.intrinsic is not None else 0
    for phase in cfg.phases:
        spec = _weighted(phase.instances, cfg)
        spec = spec.model_copy(update={"heldout_shards": hold, "split": "train"}) if hold else spec
        inst_dir, instances[phase.name] = _named(
            root, "instances", InstancesConfig, spec, f"{phase.name}-", shards_dir=docs_dir, vocab_dir=vocab_dir
        )
        run_dir, train[phase.name] = _named(
            root, "runs", TrainConfig, phase.train, f"{phase.name}-", data_dir=inst_dir, init_from=prev_run
        )
        prev_run = run_dir
    last_run = train[cfg.phases[-1].name].output_dir
    last_run = last_run if isinstance(root, str) else Path(last_run)
    export_dir = join(root, "export", name_of(last_run))
    heldout, evals = None, {}
    if ev.intrinsic is not None:
        # Held-out instances: the last phase's recipe on the held-out shards (or, with heldout_shards=0,
        # on the training documents), with another seed: fresh masks and sentence pairs.
        update = {"seed": ev.heldout_seed, **({"heldout_shards": hold, "split": "heldout"} if hold else {})}
        last = _weighted(cfg.phases[-1].instances, cfg).model_copy(update=update)  # the mixture's held-out side
        held_dir, heldout = _named(
            root, "instances", InstancesConfig, last, "heldout-", shards_dir=docs_dir, vocab_dir=vocab_dir
        )
        evals["intrinsic"] = _named(
            root, "eval", IntrinsicConfig, ev.intrinsic, "intrinsic-", model_path=last_run, instances_dir=held_dir
        )[1]
    for name, model in (("glue", GlueConfig), ("squad", SquadConfig), ("ner", NerConfig)):
        spec = getattr(ev, name)
        if spec is not None:  # on an object store too: the export is read from each node's copy
            evals[name] = _named(root, "eval", model, spec, f"{name}-", model_path=export_dir)[1]
    report_dir = join(root, "reports", name_of(last_run))
    return Plan(
        root=root, shard=shard, vocab=vocab, instances=instances, train=train, export_dir=export_dir,
        heldout=heldout, evals=evals, report_dir=report_dir,
    )


def demo_config(output_root: str = "runs/demo", inputs: Optional[list[str]] = None, max_steps: int = 300) -> PipelineConfig:
    """The ``make demo`` preset: built-in corpus, small vocab, tiny model, one short phase, MLM/NSP eval."""
    data = {
        "output_root": output_root,
        "shard": {"inputs": inputs or ["builtin:python-docs"], "num_shards": 5, "num_workers": 2},
        "vocab": {"vocab_size": 2000, "min_frequency": 2},
        "phases": [
            {
                "name": "phase1",
                "instances": {"max_seq_length": 64, "max_predictions_per_seq": 10, "dupe_factor": 2, "num_workers": 2},
                "train": {
                    "model": "tiny", "max_steps": max_steps, "micro_batch_size": 16, "lr": 1e-3,
                    "save_every": max(1, max_steps // 2), "log_every": 5, "tensorboard": False, "max_seq_length": 64,
                },
            }
        ],
        "evaluation": {"intrinsic": {"batch_size": 32, "max_batches": 4, "use_ray": False, "show_progress": False}},
    }
    try:
        return PipelineConfig.model_validate(data)
    except Exception as err:  # a preset that does not validate is a bug, but say where
        raise UserError(f"demo preset: {err}") from None
