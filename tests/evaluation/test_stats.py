"""evaluation.stats: Welch's interval for the difference of two rows' seed means, checked against scipy's
own Welch t-test on the raw per-seed values, and the verdict the comparison report prints."""
from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as sps

from evaluation.stats import verdict, welch


def _summary(values) -> dict:
    v = np.asarray(values, dtype=float)
    return {"mean": float(v.mean()), "std": float(v.std(ddof=1)), "n": len(v)}


@pytest.mark.parametrize("a, b", [
    ([0.485, 0.500], [0.204, 0.213]),                     # two seeds each (the recipes' grid)
    ([0.81, 0.83, 0.80, 0.84, 0.82], [0.79, 0.80, 0.81]),  # unequal seed counts and spreads
    ([0.5, 0.7, 0.6, 0.9], [0.55, 0.56, 0.54, 0.57]),     # one side far noisier
])
def test_interval_is_scipys_welch_interval_on_the_raw_seeds(a, b):
    got = welch(_summary(a), _summary(b))
    ref = sps.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    assert got["diff"] == pytest.approx(np.mean(a) - np.mean(b))
    assert (got["low"], got["high"]) == (pytest.approx(ref.low), pytest.approx(ref.high))
    assert (got["n_a"], got["n_b"]) == (len(a), len(b))


def test_two_seeds_need_a_large_steady_gain():
    # STS-B on the GPU recipe: +28 points over random init, two seeds a side: shown
    assert verdict(welch(_summary([0.485, 0.500]), _summary([0.204, 0.213]))) == "transfer shown"
    # SST-2 there: +1.9 points with two seeds a side, the interval holds 0
    assert verdict(welch(_summary([0.831, 0.837]), _summary([0.811, 0.819]))).startswith("not shown")
    assert verdict(welch(_summary([0.40, 0.41]), _summary([0.60, 0.61]))) == "worse than random init"


def test_fewer_than_two_seeds_or_a_missing_score_gives_no_interval():
    assert welch({"mean": 0.8, "std": 0.0, "n": 1}, _summary([0.7, 0.71])) is None
    assert welch({"mean": float("nan"), "std": 0.1, "n": 3}, _summary([0.7, 0.71])) is None
    assert verdict(None).startswith("n/a")


def test_no_spread_on_both_sides_has_no_interval():
    # CoLA's majority class: MCC 0 for every seed of both rows; or two rows each steady at its own value
    for a, b in ((0.0, 0.0), (0.55, 0.50)):
        got = welch({"mean": a, "std": 0.0, "n": 2}, {"mean": b, "std": 0.0, "n": 2})
        assert got["diff"] == pytest.approx(a - b) and got["low"] is None and got["high"] is None
        assert verdict(got) == "n/a (no spread over seeds)"
    one_sided = welch({"mean": 0.3, "std": 0.0, "n": 2}, _summary([0.1, 0.2]))  # only b varies
    ref = sps.ttest_ind([0.3, 0.3], [0.1, 0.2], equal_var=False).confidence_interval(0.95)
    assert (one_sided["low"], one_sided["high"]) == (pytest.approx(ref.low), pytest.approx(ref.high))
