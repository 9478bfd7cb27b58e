"""The promotion gate (flows.gate.decide): a table of cases, boundary values included, and a missing or
non-finite metric as a stated reason to keep."""
from __future__ import annotations

import pytest

from contracts.common import UserError, build_config
from flows.gate import GateConfig, GateDecision, decide, gate_table

CFG = GateConfig(min_new_loss_improvement=0.01, max_old_loss_increase=0.02, max_downstream_drop=0.5,
                 downstream=["downstream/STS-B", "downstream/SST-2"])
PROMOTED = {"heldout_loss_new": 2.50, "heldout_loss_old": 2.00, "downstream/STS-B": 80.0, "downstream/SST-2": 85.0}


def cand(**changes):
    names = {"new": "heldout_loss_new", "old": "heldout_loss_old", "sts": "downstream/STS-B", "sst": "downstream/SST-2"}
    out = dict(PROMOTED)
    for k, v in changes.items():
        if v is ...:
            out.pop(names[k])
        else:
            out[names[k]] = v
    return out


CASES = [
    # (id, candidate, decision, words the reason must hold)
    ("clear-win", cand(new=2.30, old=1.99, sts=81.0, sst=85.5), "promote", ["heldout_loss_new dropped by 0.2"]),
    ("new-exactly-X", cand(new=2.49), "promote", ["dropped by 0.01"]),
    ("new-just-under-X", cand(new=2.4901), "keep", ["heldout_loss_new dropped by 0.0099", "at least 0.01"]),
    ("new-no-change", cand(new=2.50), "keep", ["heldout_loss_new did not drop"]),
    ("new-worse", cand(new=2.60), "keep", ["heldout_loss_new did not drop (+0.1)"]),
    ("old-exactly-Y", cand(new=2.40, old=2.02), "promote", ["heldout_loss_old rose by 0.02"]),
    ("old-just-over-Y", cand(new=2.40, old=2.0201), "keep", ["heldout_loss_old rose by 0.0201, more than 0.02"]),
    ("downstream-exactly-Z", cand(new=2.40, sts=79.5), "promote", ["downstream/STS-B fell by 0.5"]),
    ("downstream-over-Z", cand(new=2.40, sst=84.4), "keep", ["downstream/SST-2 fell by 0.6, more than 0.5"]),
    ("two-failures-both-stated", cand(new=2.55, old=2.5), "keep", ["heldout_loss_new did not drop",
                                                                    "heldout_loss_old rose by 0.5"]),
    ("new-missing", cand(new=...), "keep", ["heldout_loss_new missing for the candidate"]),
    ("old-missing", cand(new=2.40, old=...), "keep", ["heldout_loss_old missing for the candidate"]),
    ("downstream-missing", cand(new=2.40, sts=...), "keep", ["downstream/STS-B missing for the candidate"]),
    ("nan-loss", cand(new=float("nan")), "keep", ["heldout_loss_new not finite (nan) for the candidate"]),
    ("null-loss", cand(new=None), "keep", ["heldout_loss_new missing"]),
    ("not-a-number", cand(new="2.4"), "keep", ["not a number ('2.4')"]),
]


@pytest.mark.parametrize("name, candidate, decision, words", CASES, ids=[c[0] for c in CASES])
def test_gate_rule_cases(name, candidate, decision, words):
    d = decide(candidate, PROMOTED, CFG)
    assert d.decision == decision, d.reason
    assert d.promote == (decision == "promote")
    for w in words:
        assert w in d.reason, (w, d.reason)
    assert [c.check for c in d.checks] == ["new_loss", "old_loss", "downstream", "downstream"]
    assert all(c.ok for c in d.checks) == (decision == "promote")
    assert d == decide(candidate, PROMOTED, CFG)  # pure: same inputs, same answer


def test_first_model_is_promoted_even_without_metrics():
    d = decide({}, None, CFG)
    assert d.promote and "first model" in d.reason and d.checks == []


def test_metric_missing_on_the_promoted_side_keeps():
    promoted = dict(PROMOTED)
    del promoted["downstream/SST-2"]
    d = decide(cand(new=2.4), promoted, CFG)
    assert d.decision == "keep" and "downstream/SST-2 missing for the promoted model" in d.reason


def test_no_downstream_configured_checks_only_losses():
    d = decide({"heldout_loss_new": 2.4, "heldout_loss_old": 2.0}, PROMOTED, GateConfig())
    assert d.promote and [c.check for c in d.checks] == ["new_loss", "old_loss"]


def test_metric_names_come_from_config():
    cfg = GateConfig(new_loss_metric="loss/2026-12", old_loss_metric="loss/earlier")
    d = decide({"loss/2026-12": 3.0, "loss/earlier": 3.0}, {"loss/2026-12": 3.2, "loss/earlier": 3.0}, cfg)
    assert d.promote and d.checks[0].change == pytest.approx(-0.2)


def test_config_defaults_and_validation():
    cfg = GateConfig()
    assert (cfg.min_new_loss_improvement, cfg.max_old_loss_increase, cfg.max_downstream_drop) == (0.01, 0.02, 0.5)
    with pytest.raises(UserError, match="min_new_loss_improvement: Input should be greater than or equal to 0"):
        build_config(GateConfig, {"min_new_loss_improvement": -1}, "gate")
    with pytest.raises(UserError, match="max_drop: unknown key"):
        build_config(GateConfig, {"max_drop": 1}, "gate")
    assert GateConfig().config_hash() == GateConfig().config_hash() != CFG.config_hash()


def test_gate_table_and_round_trip():
    d = decide(cand(new=2.55), PROMOTED, CFG)
    table = gate_table(d)
    assert "| new_loss | heldout_loss_new | 2.5500 | 2.5000 | +0.0500 | drop >= 0.01 | no: " in table
    assert table.endswith(f"**keep**: {d.reason}")
    assert GateDecision.model_validate(d.model_dump(mode="json")) == d
