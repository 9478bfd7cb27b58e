"""Continual pretraining (issue 25): each new data snapshot continues the promoted model, and a gate
decides whether the candidate replaces it.

    bertflow continual --config continual.yaml        # one firing: every new snapshot, oldest first
    bertflow continual --config continual.yaml --dry-run   # which snapshots are new, and nothing else

A firing, for each snapshot folder under ``source`` (sorted by name: date folders such as 2026-12-01)
that has no firing record yet:

1. shard the snapshot on its own, against the documents of the snapshots the promoted model was trained
   on (a document they hold is not kept again: counted as ``seen_earlier``; the lineage names them);
2. reject junk before any training: too few new documents, mostly duplicates, or text the vocab cannot
   read (the share of [UNK] tokens), each with the reason and the counts;
3. instances of the new snapshot (training and held-out documents apart), mixed with ``replay`` of each
   earlier snapshot's training instances (``bertflow data mix``: deterministic, a pure function of the
   snapshots, the config and the seed);
4. train a candidate from the promoted model's weights (fresh optimizer, its own warmup and lr), or from
   scratch when nothing is promoted yet; a killed firing resumes it like any run;
5. score the candidate and the promoted model on the same held-out documents of the new snapshot and of
   every earlier one (held-out MLM loss, per snapshot);
6. the gate (flows.gate) decides; the candidate is registered (flows.registry) with its parent, snapshots,
   config hashes, metrics and decision, promoted by compare-and-swap when the gate says so, and the
   promoted model exported to ``<output_root>/promoted`` (a stable path);
7. the firing record ``continual/firings/<snapshot>.json`` is written last: it is what makes the snapshot
   done. The gate table and the registry are Prefect artifacts; an optional notify command hears every
   decision.

Two firings never run at once: the second gets one line (the writer lock of ``continual/``). A firing
that fails leaves the promoted model untouched; the next firing redoes the snapshot, skipping every
stage already done. A firing with no new snapshot finishes in seconds and says so.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, Optional, Sequence

from prefect import flow
from pydantic import Field, model_validator

from contracts.common import ArgParser, StrictModel, UserError, build_config, json_record, load_yaml, stable_hash
from contracts.storage import is_uri, location
from data_jobs.config import InstancesConfig, ShardConfig, VocabConfig
from evaluation.config import IntrinsicConfig
from flows.config import (GlueSpec, IntrinsicSpec, InstancesSpec, Orchestration, TrainSpec, VocabSpec, Where, _named, join,
                          name_of)
from flows.gate import GateConfig, GateDecision, decide, gate_table
from flows.registry import ModelEntry, Registry, registry_markdown
from flows.snapshot_checks import junk_reason, unreadable_reason
from flows.snapshots import Pending, inside, pending_new_files, snapshots_in  # noqa: F401
from flows.specs import complete, spec_of
from flows import signals

signals.install()  # SIGTERM in a flow starts run_main's deadline; the temporary server outlives a group's signal

SnapshotShardSpec = spec_of(ShardConfig, {"output_dir", "inputs", "earlier"}, "SnapshotShardSpec",
                            "Raw text of one snapshot -> document shards (ShardConfig minus the wiring; snapshot "
                            "and earlier are set by the firing).")
FIRINGS = "firings"


class Quality(StrictModel):
    """Checks on a new snapshot before any training: a snapshot failing one is rejected, with the reason."""

    min_documents: int = Field(2, ge=2, description="reject a snapshot with fewer new documents than this "
                               "(after duplicates and documents of earlier snapshots are dropped)")
    max_duplicate_fraction: float = Field(0.5, ge=0.0, le=1.0, description="reject a snapshot whose documents are "
                                          "mostly duplicates or earlier snapshots' documents (share of those read)")
    max_unknown_rate: float = Field(0.25, ge=0.0, le=1.0, description="reject a snapshot whose text the vocab "
                                    "cannot read: share of [UNK] among its instances' tokens")
    min_word_order: float = Field(0.08, ge=0.0, le=1.0, description="reject a snapshot whose word order carries no "
                                  "information (shuffled words): 1 - distinct adjacent word pairs / those of the same "
                                  "words shuffled, on up to 200,000 words of its documents (judged from 10,000 words)")


class ContinualConfig(StrictModel):
    """Continual pretraining: snapshots under ``source`` continue the promoted model, gated."""

    source: str = Field(..., min_length=1, description="a directory or object-store prefix whose sub-folders are "
                        "the snapshots, in name order (e.g. dated folders 2026-12-01, 2026-12-08); with layout "
                        "new_files, one flat folder that files land in")
    layout: Literal["folders", "new_files"] = Field(
        "folders", description="folders: each sub-folder of source is a snapshot; new_files: the files of source "
        "that no firing has taken are one new snapshot (flows/snapshots.py)")
    output_root: str = Field("runs/continual", min_length=1, description="every output lands under here")
    registry: Optional[str] = Field(None, description="the model registry (default: <output_root>/registry)")
    shard: SnapshotShardSpec = Field(default_factory=SnapshotShardSpec, description="sharding of each snapshot")
    vocab: VocabSpec = Field(default_factory=VocabSpec, description="vocab trained on the first promoted "
                             "snapshot (or adopted); every continued model keeps it")
    instances: InstancesSpec = Field(default_factory=InstancesSpec, description="MLM/NSP instances per snapshot")
    heldout_shards: int = Field(1, ge=1, description="document shards of each snapshot held out of training and "
                                "scored by the gate")
    heldout_seed: int = Field(987654321, description="seed of the held-out instances (fresh masks and pairs)")
    replay: float = Field(0.25, ge=0.0, le=10.0, description="weight of each earlier snapshot's training instances "
                          "mixed into a continued run (0.25: a quarter of them; 0: the new snapshot only)")
    seed: int = Field(0, description="seed of the replay sample")
    train: TrainSpec = Field(..., description="a continued run (from the promoted model's weights; fresh optimizer)")
    first_train: Optional[TrainSpec] = Field(None, description="the first model, from scratch (default: train)")
    intrinsic: IntrinsicSpec = Field(default_factory=lambda: IntrinsicSpec(use_ray=False, show_progress=False),
                                     description="held-out scoring (batch size, max_batches)")
    downstream: Optional[GlueSpec] = Field(None, description="GLUE tasks (e.g. STS-B, SST-2) fine-tuned from the "
                                           "candidate and the promoted model at the same seeds; each score, in "
                                           "percent, is a gate metric downstream/<task>; None: no downstream check")
    gate: GateConfig = Field(default_factory=GateConfig, description="the promotion rule")
    quality: Quality = Field(default_factory=Quality, description="junk-snapshot checks before training")
    notify: list[str] = Field(default_factory=list, description="a command run after every decision, with the "
                              "firing record as JSON on stdin (e.g. [curl, -d, '@-', https://hooks...]); empty: none")
    orchestration: Orchestration = Field(default_factory=Orchestration, description="retries, Ray Jobs")

    @model_validator(mode="after")
    def _heldout_leaves_training(self) -> "ContinualConfig":
        if self.heldout_shards >= self.shard.num_shards:
            raise ValueError(f"heldout_shards {self.heldout_shards} leaves no training shard of shard.num_shards "
                             f"{self.shard.num_shards}")
        return self

    @classmethod
    def from_yaml(cls, path: str | Path, overrides: dict[str, Any] | None = None) -> "ContinualConfig":
        data = load_yaml(path)
        data.update({k: v for k, v in (overrides or {}).items() if v is not None})
        return build_config(cls, data, str(path))


# ---------------------------------------------------------------------------------------------- where things lie


def root_of(cfg: ContinualConfig) -> Where:
    return cfg.output_root.rstrip("/") if is_uri(cfg.output_root) else Path(cfg.output_root).expanduser().resolve()


def _source(cfg: ContinualConfig) -> str:
    return cfg.source.rstrip("/") if is_uri(cfg.source) else str(Path(cfg.source).expanduser().resolve())


class Firings:
    """The firing records under ``<output_root>/continual/firings``: one per snapshot decided."""

    def __init__(self, root: Where):
        self.dir = join(root, "continual")
        self.loc = location(str(self.dir))

    def read(self, snapshot: str) -> Optional[dict]:
        try:
            data = self.loc.read(f"{FIRINGS}/{snapshot}.json")
        except FileNotFoundError:
            return None
        try:
            rec = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            rec = None
        if not isinstance(rec, dict) or rec.pop("checksum", None) != stable_hash(rec):
            raise UserError(f"{join(self.dir, FIRINGS, snapshot + '.json')}: firing record edited or corrupt; move "
                            "it away to redo that snapshot")
        return rec

    def all(self) -> list[dict]:
        """Every firing record, by snapshot name."""
        names = sorted(m.name[len(FIRINGS) + 1:-5] for m in self.loc.list(f"{FIRINGS}/") if m.name.endswith(".json"))
        return [r for r in (self.read(n) for n in names) if r is not None]

    def write(self, snapshot: str, rec: dict) -> None:
        self.loc.write(f"{FIRINGS}/{snapshot}.json", json_record({**rec, "checksum": stable_hash(rec)}))

    def lock(self):
        from contracts.stage import store_for

        return store_for(str(self.dir)).lock()


@dataclass
class SnapshotPlan:
    """Every stage config of one snapshot's firing."""

    snapshot: str
    shard: ShardConfig
    vocab: Optional[VocabConfig]  # None: the parent's vocab (vocab_dir), kept by every continued model
    vocab_dir: str
    train_instances: InstancesConfig
    heldout: InstancesConfig
    parent: Optional[ModelEntry]
    earlier: list[dict] = field(default_factory=list)  # the firing records of the parent's snapshots

    def mix(self, cfg: ContinualConfig, root: Where):
        """The replay mixture (new snapshot + each earlier snapshot at ``replay``), or None."""
        if self.parent is None or not self.earlier or cfg.replay == 0:
            return None
        from data_jobs.config import MixConfig

        sources = [str(self.train_instances.output_dir)] + [r["train_instances"] for r in self.earlier]
        weights = [1.0] + [cfg.replay] * len(self.earlier)
        rel = [_relative(s, root) for s in sources]
        name = f"{self.snapshot}-{stable_hash([rel, weights, cfg.seed])[:16]}"
        return MixConfig(sources=sources, weights=weights, seed=cfg.seed, output_dir=str(join(root, "mix", name)))


def _relative(where: str, root: Where) -> str:
    r = str(root).rstrip("/") + "/"
    return where[len(r):] if where.startswith(r) else where


def plan_snapshot(cfg: ContinualConfig, root: Where, snapshot: str, parent: Optional[ModelEntry],
                  firings: Firings, inputs: Optional[list[str]] = None) -> SnapshotPlan:
    """Every stage config of ``snapshot``'s firing; ``inputs``: what its shard stage reads (default: the
    snapshot's folder under the source)."""
    earlier = []
    for snap in (parent.snapshots if parent else []):
        rec = firings.read(snap)
        if rec is None:
            raise UserError(f"promoted model {parent.id} names snapshot {snap}, which has no firing record under "
                            f"{join(firings.dir, FIRINGS)}; restore it (or promote another model)")
        earlier.append(rec)
    docs_dir, shard = _named(root, "documents", ShardConfig, cfg.shard.model_copy(update={"snapshot": snapshot}),
                             f"{snapshot}-", inputs=inputs or [f"{_source(cfg)}/{snapshot}"],
                             earlier=[r["documents"] for r in earlier])
    vocab: Optional[VocabConfig] = None
    if parent is not None:
        if "vocab_dir" not in parent.info:
            raise UserError(f"promoted model {parent.id} records no vocab_dir (registered outside a continual "
                            "firing?); promote a model a firing registered")
        vocab_dir: Where = str(parent.info["vocab_dir"])
    else:
        vocab_dir, vocab = _named(root, "vocab", VocabConfig, cfg.vocab, f"{snapshot}-", shards_dir=docs_dir)
    h = cfg.heldout_shards
    spec = cfg.instances.model_copy(update={"heldout_shards": h, "split": "train"})
    _, train_inst = _named(root, "instances", InstancesConfig, spec, f"{snapshot}-", shards_dir=docs_dir,
                           vocab_dir=vocab_dir)
    held = cfg.instances.model_copy(update={"heldout_shards": h, "split": "heldout", "seed": cfg.heldout_seed})
    _, heldout = _named(root, "instances", InstancesConfig, held, f"{snapshot}-heldout-", shards_dir=docs_dir,
                        vocab_dir=vocab_dir)
    return SnapshotPlan(snapshot, shard, vocab, str(vocab_dir), train_inst, heldout, parent, earlier)


# ---------------------------------------------------------------------------------------------- a firing

Runner = Callable[[Any], Any]  # runs one stage (flows.stages) and returns its result


def _direct(stage: Any) -> Any:
    """Run a stage without Prefect: its own status, skip when done."""
    state = stage.status()
    if state.done:
        return stage.result()
    return stage.run(state, lambda line: print(line, file=sys.stderr))


def downstream_scores(cfg: ContinualConfig, root: Where, model: str, run: Runner) -> dict[str, float]:
    """The configured GLUE tasks fine-tuned from ``model``: {"downstream/<task>": mean score in percent}."""
    from evaluation.config import GlueConfig
    from flows.stages import EvalStage

    if cfg.downstream is None:
        return {}
    out = join(root, "eval", f"downstream-{stable_hash([_relative(model, root), cfg.downstream.model_dump(mode='json')])[:16]}")
    ecfg = complete(GlueConfig, cfg.downstream, "downstream config", model_path=model, output_dir=str(out))
    results = run(EvalStage("glue", ecfg))
    return {f"downstream/{task}": 100.0 * float(v["mean"]) for task, v in results["tasks"].items()}


def gate_of(cfg: ContinualConfig) -> GateConfig:
    """The gate as configured; with downstream tasks and no gate.downstream given, every task is checked."""
    if cfg.downstream is None or cfg.gate.downstream:
        return cfg.gate
    return cfg.gate.model_copy(update={"downstream": [f"downstream/{t}" for t in cfg.downstream.tasks]})


def heldout_loss(cfg: ContinualConfig, root: Where, model: str, instances_dir: str, run: Runner) -> float:
    from flows.stages import EvalStage

    out = join(root, "eval", f"heldout-{stable_hash([_relative(model, root), _relative(instances_dir, root)])[:16]}")
    ecfg = complete(IntrinsicConfig, cfg.intrinsic, "intrinsic config", model_path=model,
                    instances_dir=instances_dir, output_dir=str(out))
    results = run(EvalStage("intrinsic", ecfg))
    return float(results["curve"][-1]["mlm_loss"])


def fire_snapshot(cfg: ContinualConfig, snapshot: str, run: Runner = _direct,
                  log: Callable[[str], None] = print, pending: Optional[Pending] = None) -> dict:
    """Decide one snapshot (see the module doc); returns its firing record (written last). ``pending``: what
    the snapshot holds (its inputs, and in the new_files layout its files, recorded with it)."""
    from contracts.schema import Manifest
    from flows.stages import DataStage, ExportStage, TrainStage

    root = root_of(cfg)
    firings = Firings(root)
    reg = Registry(cfg.registry or str(join(root, "registry")))
    parent = reg.promoted()
    p = plan_snapshot(cfg, root, snapshot, parent, firings, pending.inputs if pending else None)
    orch = cfg.orchestration
    timings: dict[str, float] = {}  # seconds per kind of stage (shard, vocab, instances, mix, train, export, eval)
    started, inner = time.perf_counter(), run

    def run(stage):
        t0 = time.perf_counter()
        try:
            return inner(stage)
        finally:
            kind = stage.name.split(":")[0]
            timings[kind] = round(timings.get(kind, 0.0) + time.perf_counter() - t0, 3)

    def timed(rec: dict) -> dict:
        return {**rec, "seconds": {**timings, "firing": round(time.perf_counter() - started, 3)}}

    def data(job: str, c):
        return run(DataStage(job, c, orch.ray_job_address, orch.job_python))

    docs = data("shard", p.shard)
    record: dict[str, Any] = {"snapshot": snapshot, "parent": parent.id if parent else None,
                              "documents": str(p.shard.output_dir), "documents_read": docs.totals.get("documents_read"),
                              "documents_kept": docs.totals.get("documents_kept"), "dropped": docs.totals.get("dropped", {}),
                              **({"files": pending.files} if pending is not None and pending.files is not None else {})}
    record.update(vocab_dir=p.vocab_dir, train_instances=str(p.train_instances.output_dir),
                  heldout_instances=str(p.heldout.output_dir))
    junk = junk_reason(cfg, docs, str(p.shard.output_dir))
    if not junk:
        vocab = data("vocab", p.vocab) if p.vocab is not None else Manifest.read(p.vocab_dir, kind="vocab")
        data("instances", p.heldout)
        junk = unreadable_reason(cfg, str(p.heldout.output_dir), vocab)
    if junk:
        log(f"continual: snapshot {snapshot} rejected before training: {junk}")
        return _finish(cfg, firings, reg, timed({**record, "decision": "reject", "reason": junk, "model": None}))
    data("instances", p.train_instances)
    mix = p.mix(cfg, root)
    data_dir = str(p.train_instances.output_dir)
    if mix is not None:
        data("mix", mix)
        data_dir = str(mix.output_dir)
    spec = cfg.train if parent is not None else (cfg.first_train or cfg.train)
    init_from = parent.export if parent is not None else None
    run_dir, tcfg = _named(root, "runs", _train_config(), spec, f"{snapshot}-", data_dir=data_dir, init_from=init_from)
    trained = run(TrainStage(snapshot, tcfg))
    export = str(run(ExportStage(trained["run_dir"], str(join(root, "export", name_of(run_dir))))))
    # Both models on the same held-out documents: the new snapshot's and every earlier one's.
    helds = {snapshot: str(p.heldout.output_dir), **{r["snapshot"]: r["heldout_instances"] for r in p.earlier}}
    losses = {"candidate": {s: heldout_loss(cfg, root, export, d, run) for s, d in helds.items()}}
    if parent is not None:
        losses["promoted"] = {s: heldout_loss(cfg, root, parent.export, d, run) for s, d in helds.items()}
    metrics = {who: _metrics(snapshot, ls) for who, ls in losses.items()}
    metrics["candidate"].update(downstream_scores(cfg, root, export, run))
    if parent is not None:
        metrics["promoted"].update(downstream_scores(cfg, root, parent.export, run))
    decision = decide(metrics["candidate"], metrics.get("promoted"), gate_of(cfg))
    snapshots = [*(parent.snapshots if parent else []), snapshot]
    model_id = f"{snapshot}-{stable_hash([_relative(export, root), snapshots])[:8]}"
    try:
        entry = reg.get(model_id)  # registered by an earlier attempt of this firing
    except UserError:
        entry = reg.register(
            model_id=model_id, export=export, parent=parent.id if parent else None, snapshots=snapshots,
            config_hashes={"shard": p.shard.config_hash(), "instances": p.train_instances.config_hash(),
                           "train": tcfg.config_hash()},
            metrics=metrics["candidate"], gate=decision,
            info={"run_dir": trained["run_dir"], "vocab_dir": p.vocab_dir, "data_dir": data_dir,
                  "promoted_metrics": metrics.get("promoted", {})})
    if decision.promote and reg.promoted_id() != entry.id:
        reg.promote(entry.id, expect=parent.id if parent else None, reason=f"gate: {decision.reason}")
    record.update(decision=decision.decision, reason=decision.reason, model=entry.id, export=export,
                  run_dir=trained["run_dir"], data_dir=data_dir, losses=losses, metrics=metrics,
                  gate=decision.model_dump(mode="json"))
    return _finish(cfg, firings, reg, timed(record))


def _train_config():
    from bert_core.train_config import TrainConfig

    return TrainConfig


def _metrics(snapshot: str, losses: dict[str, float]) -> dict[str, float]:
    """The gate's metrics: held-out loss on the new snapshot, mean over the earlier ones, and each."""
    old = [v for s, v in losses.items() if s != snapshot]
    out = {"heldout_loss_new": losses[snapshot], **{f"heldout_loss/{s}": v for s, v in losses.items()}}
    if old:
        out["heldout_loss_old"] = sum(old) / len(old)
    return out


def firing_table(rec: dict) -> str:
    """One firing as Markdown: held-out loss per snapshot before (promoted) and after (candidate)."""
    lines = [f"### snapshot {rec['snapshot']}: {rec['decision']}", "",
             f"{rec.get('documents_kept')} new documents of {rec.get('documents_read')} read; dropped "
             + (", ".join(f"{k} {v}" for k, v in sorted((rec.get("dropped") or {}).items())) or "none"), ""]
    losses = rec.get("losses")
    if losses:
        cand, prom = losses["candidate"], losses.get("promoted", {})
        lines += ["| held-out snapshot | promoted (before) | candidate (after) | change |", "|---|---|---|---|"]
        for s, v in cand.items():
            before = prom.get(s)
            lines.append(f"| {s}{' (new)' if s == rec['snapshot'] else ''} | "
                         f"{'—' if before is None else f'{before:.4f}'} | {v:.4f} | "
                         f"{'—' if before is None else f'{v - before:+.4f}'} |")
        decision = GateDecision.model_validate(rec["gate"])
        lines += ["", gate_table(decision) if decision.checks else f"**{decision.decision}**: {decision.reason}"]
    else:
        lines.append(f"**{rec['decision']}**: {rec['reason']}")
    return "\n".join(lines) + "\n"


def _finish(cfg: ContinualConfig, firings: Firings, reg: Registry, record: dict) -> dict:
    """Write the report and the firing record (last), publish the artifacts, call the notify hook."""
    from flows import artifacts as art

    md = firing_table(record)
    loc = location(str(firings.dir))
    loc.write(f"reports/{record['snapshot']}.md", md.encode("utf-8"))
    firings.write(record["snapshot"], record)
    if _in_flow():
        art.publish_markdown("bertflow-gate", md, f"continual pretraining: snapshot {record['snapshot']}, "
                             f"{record['decision']}")
        art.publish_markdown("bertflow-registry", registry_markdown(reg), "bertflow model registry")
    _notify(cfg, record)
    return record


def _notify(cfg: ContinualConfig, record: dict) -> None:
    """The configured notify command, with the record as JSON on stdin; its failure is a warning line
    (a hook cannot undo a decision)."""
    if not cfg.notify:
        return
    try:
        subprocess.run(cfg.notify, input=json.dumps(record).encode(), timeout=60, check=True,
                       stdout=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as err:
        print(f"bertflow: warning: notify command {cfg.notify[0]!r} failed: {err}", file=sys.stderr)


def _failed(cfg: ContinualConfig, snapshot: str, err: BaseException) -> None:
    """A firing that failed: no record (the next firing redoes the snapshot, skipping what is done), the
    promoted model untouched; said in an artifact and to the notify command."""
    why = (str(err).splitlines() or [""])[0] or type(err).__name__
    record = {"snapshot": snapshot, "decision": "failed", "reason": f"{type(err).__name__}: {why}"}
    if _in_flow():
        from flows import artifacts as art

        art.publish_markdown("bertflow-gate", f"### snapshot {snapshot}: failed\n\n{record['reason']}\n\nThe promoted "
                             "model is unchanged; the next firing resumes this snapshot.\n",
                             f"continual pretraining: snapshot {snapshot}, failed")
    _notify(cfg, record)


def _in_flow() -> bool:
    """Inside a Prefect flow run (artifacts have a run to belong to)?"""
    if "prefect" not in sys.modules:
        return False
    from prefect.context import FlowRunContext

    return FlowRunContext.get() is not None


def fire(cfg: ContinualConfig, run: Runner = _direct, log: Callable[[str], None] = print,
         dry_run: bool = False) -> dict:
    """One firing: every new snapshot in name order. Returns {"new": [...], "decided": [records]}."""
    root = root_of(cfg)
    source = _source(cfg)
    if inside(str(root), source):
        raise UserError(f"output_root: {root} lies inside source {source}; its folders would be read as "
                        "snapshots: use a directory outside it")
    firings = Firings(root)
    if cfg.layout == "new_files":
        pending, ignored = pending_new_files(source, firings.all())
        what, seen = "not files at its top", f"new files under {source}: {sum(len(p.files) for p in pending)}"
    else:
        names, ignored = snapshots_in(source)
        pending = [Pending(n, [f"{source}/{n}"]) for n in names if firings.read(n) is None]
        what, seen = "not snapshot folders", f"{len(names)} snapshots under {source}"
    if ignored:
        log(f"continual: ignored under {source} ({what}): {', '.join(ignored[:10])}"
            + (f" (+{len(ignored) - 10})" if len(ignored) > 10 else ""))
    new = [p.name for p in pending]
    if dry_run or not new:
        log(f"continual: {seen}; new: {', '.join(new) or 'none'}" + ("" if new else " (nothing to do)"))
        if not dry_run:
            _sync_promoted(cfg, run)
        return {"new": new, "decided": []}
    decided = []
    with firings.lock():  # one firing at a time; a second gets one line
        for pend in pending:
            snap = pend.name
            if firings.read(snap) is not None:  # decided by a firing that held the lock before us
                continue
            try:
                rec = fire_snapshot(cfg, snap, run, log, pend)
            except Exception as err:
                _failed(cfg, snap, err)
                raise
            log(f"continual: snapshot {snap}: {rec['decision']} ({rec['reason']})")
            decided.append(rec)
        _sync_promoted(cfg, run)
    return {"new": new, "decided": decided}


def _sync_promoted(cfg: ContinualConfig, run: Runner) -> None:
    """``<output_root>/promoted`` holds the promoted model's export, also after a manual promote or
    rollback (the export stage's own status: a look at one record when it already does)."""
    from flows.stages import ExportStage

    root = root_of(cfg)
    entry = Registry(cfg.registry or str(join(root, "registry"))).promoted()
    if entry is not None and "run_dir" in entry.info:
        run(ExportStage(str(entry.info["run_dir"]), str(join(root, "promoted"))))


@flow(name="continual-pretraining", log_prints=True)
def continual_pretraining(config: ContinualConfig):
    """One firing of continual pretraining: every new snapshot continues the promoted model, gated. Each
    stage is a task (skipped when done, retried on transient faults)."""
    from prefect import get_run_logger

    from flows.pipeline import _retrying

    logger = get_run_logger()
    orch = config.orchestration

    def run(stage):
        retries = orch.train_retries if stage.name.startswith("train:") else (0 if stage.name.startswith("eval:") else None)
        return _retrying(orch, retries)(stage)

    from prefect.states import Completed

    result = fire(config, run, logger.info)
    if not result["new"]:
        from flows import artifacts as art

        art.publish_markdown("bertflow-gate", "no new snapshot: nothing to do\n", "continual pretraining: no new snapshot")
    decisions = [r["decision"] for r in result["decided"]]
    # The run's state names the outcome in the UI: Promoted, Kept, Rejected (the last snapshot's), No new data.
    name = {"promote": "Promoted", "keep": "Kept", "reject": "Rejected"}[decisions[-1]] if decisions else "No new data"
    summary = "; ".join(f"{r['snapshot']}: {r['decision']} ({r['reason']})" for r in result["decided"]) or "no new snapshot"
    return Completed(name=name, message=summary[:1000], data=result)


def _flow():
    return continual_pretraining


def demo_continual_config(output_root: str = "runs/continual", source: str = "runs/snapshots") -> ContinualConfig:
    """The deployments' default parameters: snapshots dropped as dated folders of text (any format the shard
    job reads) into ``source``, a tiny model, the default gate. A starting point to edit, not a recipe."""
    steps = {"model": "tiny", "micro_batch_size": 16, "log_every": 10, "tensorboard": False, "max_seq_length": 64}
    return ContinualConfig.model_validate({
        "source": source, "output_root": output_root,
        "shard": {"num_shards": 4},
        "vocab": {"vocab_size": 2000},
        "instances": {"max_seq_length": 64, "max_predictions_per_seq": 10, "dupe_factor": 2},
        "train": {**steps, "max_steps": 200, "save_every": 100, "lr": 5e-4},
        "first_train": {**steps, "max_steps": 600, "save_every": 300, "lr": 1e-3},
        "intrinsic": {"batch_size": 32, "max_batches": 8, "use_ray": False, "show_progress": False},
    })


def build_parser() -> argparse.ArgumentParser:
    p = ArgParser(prog="bertflow continual", description="One firing of continual pretraining: every new snapshot "
                  "under source continues the promoted model; a gate decides whether the candidate is promoted.")
    p.add_argument("--config", required=True, help="ContinualConfig YAML (see docs/continual.md)")
    p.add_argument("--output-root", help="override output_root")
    p.add_argument("--source", help="override source")
    p.add_argument("--dry-run", action="store_true", help="say which snapshots are new, then stop")
    p.add_argument("--no-prefect", action="store_true", help="run the stages in this process without a Prefect flow")
    return p


def _main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    cfg = ContinualConfig.from_yaml(args.config, {"output_root": args.output_root, "source": args.source})
    if args.dry_run or args.no_prefect:
        result = fire(cfg, dry_run=args.dry_run)
    else:
        result = continual_pretraining(cfg)
    for rec in result["decided"]:
        print(f"{rec['snapshot']}: {rec['decision']} — {rec['reason']}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    from contracts.common import run_main

    return run_main(_main, argv)


if __name__ == "__main__":
    sys.exit(main())
