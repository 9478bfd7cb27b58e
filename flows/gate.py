"""The promotion gate: does a candidate model replace the promoted one? A pure function of the two models'
metrics and a rule from config, with the reason in words and one row per check (the gate table).

    decision = decide(candidate_metrics, promoted_metrics, GateConfig())   # promoted_metrics None: first model
    decision.promote, decision.reason, decision.checks

The rule (Gururangan et al. 2020; Jin et al. 2022: what a release decision of continual pretraining
needs): promote when the held-out MLM loss on the new data improves by at least X, the held-out loss on
earlier data worsens by at most Y, and no configured downstream score drops by more than Z. Losses are
lower-is-better, downstream scores higher-is-better, all compared as differences in the metric's own
units (nats for losses; the score's units for downstream, e.g. accuracy points when reported in percent),
both models measured on the same held-out documents at the same seeds. A metric missing (or not finite)
on either side is a reason to keep, and the reason says which. With no promoted model yet, the candidate is
promoted (there is nothing to compare against). Boundary values pass: an improvement of exactly X, a
worsening of exactly Y, a drop of exactly Z (compared with a tolerance of 1e-9, so 2.50 - 2.49 counts
as 0.01).

Imports nothing of the project but contracts.common, and no framework.
"""
from __future__ import annotations

import math
from typing import Any, Literal, Mapping, Optional

from pydantic import Field

from contracts.common import StrictModel

TOLERANCE = 1e-9


class GateConfig(StrictModel):
    """The promotion rule: thresholds and the metric names it compares."""

    min_new_loss_improvement: float = Field(
        0.01, ge=0.0, description="X: promote only if held-out MLM loss on the new data drops by at least this (nats)")
    max_old_loss_increase: float = Field(
        0.02, ge=0.0, description="Y: keep if held-out MLM loss on earlier data rises by more than this (nats)")
    max_downstream_drop: float = Field(
        0.5, ge=0.0, description="Z: keep if any downstream score drops by more than this (the score's units)")
    new_loss_metric: str = Field(
        "heldout_loss_new", min_length=1, description="metric name: held-out MLM loss on the new snapshot")
    old_loss_metric: str = Field(
        "heldout_loss_old", min_length=1, description="metric name: held-out MLM loss on the earlier snapshots")
    downstream: list[str] = Field(
        default_factory=list, description="metric names of downstream scores (higher is better) that may not "
        "drop by more than Z, e.g. downstream/STS-B, downstream/SST-2; empty: no downstream check")


class GateCheck(StrictModel):
    """One row of the gate table."""
    empty_strings = True  # a record, not a config: "" means "none given"

    check: Literal["new_loss", "old_loss", "downstream"]
    metric: str
    candidate: Optional[float] = None
    promoted: Optional[float] = None
    change: Optional[float] = None  # candidate - promoted (negative: the loss dropped / the score fell)
    limit: str  # the rule in words, e.g. "drop >= 0.01"
    ok: bool
    note: str = ""


class GateDecision(StrictModel):
    """The gate's answer: promote or keep, why, and the table it was decided on."""
    empty_strings = True  # a record, not a config: "" means "none given"

    decision: Literal["promote", "keep"]
    reason: str = Field(..., min_length=1)
    checks: list[GateCheck] = Field(default_factory=list)

    @property
    def promote(self) -> bool:
        return self.decision == "promote"


def _value(metrics: Mapping[str, Any], name: str) -> tuple[Optional[float], str]:
    """(the metric as a finite float, "") or (None, why it cannot be compared)."""
    if name not in metrics or metrics[name] is None:
        return None, "missing"
    v = metrics[name]
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None, f"not a number ({v!r})"
    if not math.isfinite(v):
        return None, f"not finite ({v})"
    return float(v), ""


def _fmt(x: float) -> str:
    return f"{x:.4g}"


def _compare(kind: str, name: str, cand: Mapping[str, Any], prom: Mapping[str, Any], limit: float) -> GateCheck:
    c, c_why = _value(cand, name)
    p, p_why = _value(prom, name)
    rule = {"new_loss": f"drop >= {_fmt(limit)}", "old_loss": f"rise <= {_fmt(limit)}",
            "downstream": f"drop <= {_fmt(limit)}"}[kind]
    if c is None or p is None:
        whose = " and ".join(w for w, why in (("candidate", c_why), ("promoted model", p_why)) if why)
        why = c_why or p_why
        return GateCheck(check=kind, metric=name, candidate=c, promoted=p, limit=rule, ok=False,
                         note=f"{name} {why} for the {whose}")
    change = round(c - p, 12)  # 2.9 - 3.0 is -0.1, not -0.10000000000000009, in the table
    if kind == "new_loss":
        ok = -change >= limit - TOLERANCE
        note = f"{name} dropped by {_fmt(-change)}" if change < 0 else f"{name} did not drop (+{_fmt(change)})"
        if not ok:
            note += f", needs a drop of at least {_fmt(limit)}"
    elif kind == "old_loss":
        ok = change <= limit + TOLERANCE
        note = f"{name} rose by {_fmt(change)}" if change > 0 else f"{name} did not rise ({_fmt(change)})"
        if not ok:
            note += f", more than {_fmt(limit)}"
    else:
        ok = -change <= limit + TOLERANCE
        note = f"{name} fell by {_fmt(-change)}" if change < 0 else f"{name} did not fall (+{_fmt(change)})"
        if not ok:
            note += f", more than {_fmt(limit)}"
    return GateCheck(check=kind, metric=name, candidate=c, promoted=p, change=change, limit=rule, ok=ok, note=note)


def decide(candidate: Mapping[str, Any], promoted: Optional[Mapping[str, Any]], cfg: GateConfig) -> GateDecision:
    """Promote or keep ``candidate`` against the ``promoted`` model's metrics (None: no promoted model yet).
    Pure: no I/O, no clock; the same inputs give the same decision, reason and table."""
    if promoted is None:
        return GateDecision(decision="promote", reason="first model: no promoted model to compare against")
    checks = [
        _compare("new_loss", cfg.new_loss_metric, candidate, promoted, cfg.min_new_loss_improvement),
        _compare("old_loss", cfg.old_loss_metric, candidate, promoted, cfg.max_old_loss_increase),
        *(_compare("downstream", name, candidate, promoted, cfg.max_downstream_drop) for name in cfg.downstream),
    ]
    failed = [c for c in checks if not c.ok]
    if failed:
        return GateDecision(decision="keep", reason="; ".join(c.note for c in failed), checks=checks)
    return GateDecision(decision="promote", reason="; ".join(c.note for c in checks), checks=checks)


def gate_table(decision: GateDecision) -> str:
    """The gate table as Markdown (for a Prefect artifact or a report)."""
    def num(x: Optional[float]) -> str:
        return "—" if x is None else f"{x:.4f}"

    rows = ["| check | metric | candidate | promoted | change | rule | ok |", "|---|---|---|---|---|---|---|"]
    for c in decision.checks:
        change = "—" if c.change is None else f"{c.change:+.4f}"
        rows.append(f"| {c.check} | {c.metric} | {num(c.candidate)} | {num(c.promoted)} | {change} | {c.limit} | "
                    f"{'yes' if c.ok else 'no: ' + c.note} |")
    rows.append("")
    rows.append(f"**{decision.decision}**: {decision.reason}")
    return "\n".join(rows)
