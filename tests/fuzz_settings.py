"""Hypothesis settings of the generator-based hostile tests (issue 24), short or long.

The suite runs a short, derandomized pass (the same examples every run, no example database, a few
seconds per property). ``make fuzz`` sets BERTFLOW_FUZZ=long: many more examples, random seeds, and
Hypothesis's example database under .hypothesis/ (a corpus of interesting cases kept between runs, so
a long run resumes from what earlier runs found). BERTFLOW_FUZZ_EXAMPLES overrides the long count.
A failure found either way is added as an explicit ``@example`` to the property that found it.
"""
from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

LONG = os.environ.get("BERTFLOW_FUZZ") == "long"
LONG_EXAMPLES = int(os.environ.get("BERTFLOW_FUZZ_EXAMPLES", "2000"))


def fuzz(short_examples: int) -> settings:
    """Settings for one property: ``short_examples`` in the suite, LONG_EXAMPLES under ``make fuzz``."""
    common = dict(deadline=None, suppress_health_check=list(HealthCheck))
    if LONG:
        return settings(max_examples=LONG_EXAMPLES, **common)
    return settings(max_examples=short_examples, derandomize=True, database=None, **common)
