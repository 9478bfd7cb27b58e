"""README's ``make fuzz``, run as written (with BERTFLOW_FUZZ_EXAMPLES=2, the knob README names, so it takes
seconds): the long mode is what runs (BERTFLOW_FUZZ=long: random seeds, Hypothesis's example database
under .hypothesis/), every generator-based test file of the suite is in it, and it passes."""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from hang import HANG_S  # noqa: E402  (the suite's one hang guard)

REPO = Path(__file__).resolve().parents[1]


def test_make_fuzz_runs_every_fuzz_file_in_long_mode():
    assert "`make fuzz`" in (REPO / "README.md").read_text()
    listed = re.search(r"^FUZZ_TESTS := (.*)$", (REPO / "Makefile").read_text(), re.M).group(1).split()
    assert sorted(listed) == sorted(str(p.relative_to(REPO)) for p in REPO.glob("tests/**/test_fuzz_*.py"))
    if not (REPO / ".venv" / ".installed").is_file():
        pytest.skip("make fuzz runs in the Makefile's virtualenv: run `make install` first")
    env = {**os.environ, "BERTFLOW_FUZZ_EXAMPLES": "2"}
    env.pop("BERTFLOW_FUZZ", None)
    proc = subprocess.run(["make", "fuzz"], cwd=REPO, env=env, capture_output=True, text=True, timeout=HANG_S)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "BERTFLOW_FUZZ=long" in proc.stdout and re.search(r"^\d+ passed", proc.stdout, re.M), proc.stdout[-2000:]
