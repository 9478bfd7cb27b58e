"""Run the hostile battery's flow cases: each a real Prefect flow run (``flows.pipeline.FLOWS[stage]``)
of a PipelineConfig read from YAML, all under one Prefect test harness, one after another.

    python hostile_flow_driver.py CASES.json RESULTS.json

CASES.json maps a case name to ``[stage, config.yaml]`` or ``[stage, config.yaml, model_path]``.
RESULTS.json maps it to ``{"rc", "state", "message", "stdout", "stderr"}``: rc 0 for a Completed run,
2 for a Failed one (-1 for anything else), and the run's state message (what the Prefect UI shows for
the run: ``Flow run encountered an exception: UserError: <the one line>`` for a refused input).
"""
from __future__ import annotations

import contextlib
import io
import json
import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: tests/ for hang
from hang import HANG_S  # noqa: E402  (the suite's one hang guard)


def run_case(stage: str, config: str, model_path: str | None = None) -> dict:
    from flows.pipeline import FLOWS, load_pipeline_config

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        cfg = load_pipeline_config(config)
        kwargs = {"model_path": model_path} if model_path else {}
        state = FLOWS[stage](cfg, return_state=True, **kwargs)
    rc = 0 if state.is_completed() else 2 if state.is_failed() else -1
    return {"rc": rc, "state": state.type.value, "message": state.message or "",
            "stdout": out.getvalue(), "stderr": err.getvalue()}


def main() -> int:
    cases = json.loads(Path(sys.argv[1]).read_text())
    from prefect.testing.utilities import prefect_test_harness

    results = {}
    with prefect_test_harness(server_startup_timeout=HANG_S):
        for name, argv in cases.items():
            results[name] = run_case(*argv)
    Path(sys.argv[2]).write_text(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
