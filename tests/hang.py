"""The suite's one hang guard (a module of its own: conftest files are not importable).

A wait in a test (a subprocess, a server coming up, a flow run finishing, a file appearing) is a guard
against a hang, not a speed check: speed is measured in bench/, never asserted here. CI shares 2 cores
with other work, and a load average of 4-14 made 60-420 s waits expire on work that was merely slow (a
fresh machine's first DeepSpeed op build, a Ray head starting beside two training ranks). So every such
wait uses HANG_S: long enough that only a real hang reaches it, shorter than pytest's own per-test
timeout (pyproject.toml), so the message that fires names the wait. ``BERTFLOW_TEST_HANG_S`` overrides it.
"""
from __future__ import annotations

import os

HANG_S = float(os.environ.get("BERTFLOW_TEST_HANG_S", "1500"))
