"""The one generic Prefect task (flows.tasks.run_stage) with a real stage (the vocab job adopting a
vocab.txt) in a real flow: it runs a missing stage, skips a done one saying why, retries a transient
fault, and never retries a user error (a user's file in the output directory, refused and kept)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from flowtest_support import flow_logs as _flow_logs  # drained first: logs travel asynchronously

pytestmark = [pytest.mark.prefect, pytest.mark.slow]


def _vocab(path: Path) -> Path:
    path.write_text("".join(t + "\n" for t in ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *map(str, range(40))]))
    return path


def _task_runs(flow_run_id):
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        return client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))


def test_one_task_runs_skips_retries_and_refuses(harness, tmp_path):
    from prefect import flow

    from contracts.schema import Manifest
    from data_jobs.config import VocabConfig
    from flows.tasks import FAULT_ENV, DataStage, run_stage

    vocab = _vocab(tmp_path / "vocab.txt")

    @flow
    def one_stage(out: str):
        return run_stage.with_options(retries=1, retry_delay_seconds=0)(
            DataStage("vocab", VocabConfig(vocab_file=str(vocab), output_dir=out)))

    out = tmp_path / "vocab_ds"
    os.environ[FAULT_ENV] = "vocab"
    try:
        first = one_stage(str(out), return_state=True)
    finally:
        os.environ.pop(FAULT_ENV)
    assert first.is_completed() and isinstance(first.result(), Manifest)
    [run] = _task_runs(first.state_details.flow_run_id)
    assert run.name == "data-job-vocab" and run.run_count == 2  # the injected fault, then the retry
    written = (out / "manifest.json").stat().st_mtime_ns

    again = one_stage(str(out), return_state=True)
    assert again.is_completed() and again.result().vocab_hash == first.result().vocab_hash
    assert (out / "manifest.json").stat().st_mtime_ns == written
    assert any(m.startswith("stage vocab: skipped (complete)") for m in _flow_logs(again.state_details.flow_run_id))

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "vocab.txt").write_bytes(b"my own vocab\n")
    refused = one_stage(str(mine), return_state=True)
    assert refused.is_failed() and "vocab.txt" in str(refused.message or "") + "".join(
        _flow_logs(refused.state_details.flow_run_id))
    [run] = _task_runs(refused.state_details.flow_run_id)
    assert run.run_count == 1  # a user error is not retried
    assert (mine / "vocab.txt").read_bytes() == b"my own vocab\n" and not (mine / "manifest.json").exists()
