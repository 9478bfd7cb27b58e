"""metrics.jsonl has one reader (bert_core.train_log.read_metrics) with one behaviour, used by resume,
Ray Train and the flows' loss curve alike."""
from __future__ import annotations

from bert_core.train_log import read_metrics
from flows import artifacts


def test_read_metrics_skips_every_line_that_is_not_a_json_object(tmp_path):
    path = tmp_path / "metrics.jsonl"
    assert read_metrics(path) == []  # no file yet: no records
    path.write_text('{"step": 1, "loss": 2.5}\n{"step": 2, "lo\n7\n{"step": 3, "loss": 2.0}\n{"step": 4, "lo',
                    encoding="utf-8")
    # a damaged middle line and a non-object cost themselves only; the torn last line is dropped
    assert read_metrics(path) == [{"step": 1, "loss": 2.5}, {"step": 3, "loss": 2.0}]


def test_the_flows_read_metrics_with_the_same_function():
    assert artifacts.read_metrics is read_metrics
