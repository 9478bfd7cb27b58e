"""Differences between two rows of a comparison, with Welch's 95% confidence interval over seeds.

A row's task score is the mean and sample standard deviation (ddof 1) of its seeds' dev metric at the
learning rate chosen on dev. The difference of two rows is ``a - b``; its interval is Welch's: the
standard error ``sqrt(sa²/na + sb²/nb)`` and the Welch–Satterthwaite degrees of freedom, so two rows
with different seed counts or spreads are compared without assuming equal variances. "Transfer shown"
means the interval lies wholly above 0; with two seeds (df near 1 or 2) only a large, steady gain does.
"""
from __future__ import annotations

import math
from typing import Mapping, Optional

from scipy import stats

LEVEL = 0.95


def welch(a: Mapping, b: Mapping, level: float = LEVEL) -> Optional[dict]:
    """``{"diff", "low", "high", "df", "n_a", "n_b"}`` for ``a - b``; ``a``/``b`` hold ``mean``, ``std``
    (sample) and ``n`` (seeds). None when either side has fewer than 2 seeds or a non-finite mean. Two
    rows with no spread at all (every seed the same value on both sides) have no interval: ``low`` and
    ``high`` are None (a zero-width interval would claim a certainty two seeds cannot give)."""
    na, nb = int(a.get("n") or 0), int(b.get("n") or 0)
    ma, mb, sa, sb = a.get("mean"), b.get("mean"), a.get("std"), b.get("std")
    if na < 2 or nb < 2 or not all(v is not None and math.isfinite(v) for v in (ma, mb, sa, sb)):
        return None
    diff = ma - mb
    va, vb = sa * sa / na, sb * sb / nb
    se = math.sqrt(va + vb)
    if se == 0.0:
        return {"diff": diff, "low": None, "high": None, "df": None, "n_a": na, "n_b": nb}
    df = (va + vb) ** 2 / ((va * va / (na - 1) if va else 0.0) + (vb * vb / (nb - 1) if vb else 0.0))
    half = float(stats.t.ppf(0.5 + level / 2, df)) * se
    return {"diff": diff, "low": diff - half, "high": diff + half, "df": df, "n_a": na, "n_b": nb}


def verdict(ci: Optional[Mapping]) -> str:
    """What the interval says: transfer shown (wholly above 0), worse (wholly below), or not shown."""
    if ci is None:
        return "n/a (fewer than 2 seeds)"
    if ci["low"] is None:
        return "n/a (no spread over seeds)"
    if ci["low"] > 0:
        return "transfer shown"
    if ci["high"] < 0:
        return "worse than random init"
    return "not shown (interval holds 0)"
