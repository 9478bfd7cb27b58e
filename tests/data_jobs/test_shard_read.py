"""data_jobs.shard_read: sentences and per-document counts from Arrow buffers, null documents and
sentences as empty, any row order, and none of the modules a fresh worker cannot afford."""
from __future__ import annotations

import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from contracts.common import UserError
from data_jobs.shard_read import read_documents, read_flat
from hang import HANG_S  # noqa: E402  (the suite's one hang guard)

DOCS = [["x"], ["a", None, "b"], None, [], ["c"], None, ["d", "e", None]]


@pytest.fixture
def shard(tmp_path):
    # A sliced table (its list offsets start past 0) written in row groups of 3: several chunks.
    table = pa.table({"sentences": pa.array([["skipped"]] + DOCS, pa.list_(pa.string()))}).slice(1)
    path = tmp_path / "shard.parquet"
    pq.write_table(table, path, row_group_size=3)
    return str(path)


def test_flat_sentences_and_counts_with_null_documents_and_sentences(shard):
    sentences, per_doc = read_flat(shard)
    assert sentences == ["x", "a", "", "b", "c", "d", "e", ""]
    assert per_doc == [1, 3, 0, 0, 1, 0, 3]
    assert read_documents(shard) == [["x"], ["a", "", "b"], [], [], ["c"], [], ["d", "e", ""]]


def test_rows_in_the_order_given(shard):
    assert read_documents(shard, [6, 1, 2, 4]) == [["d", "e", ""], ["a", "", "b"], [], ["c"]]
    assert read_flat(shard, []) == ([], [])


def test_empty_and_corrupt_shards(tmp_path):
    empty = tmp_path / "empty.parquet"
    pq.write_table(pa.table({"sentences": pa.array([], pa.list_(pa.string()))}), empty)
    assert read_flat(str(empty)) == ([], [])
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"PAR1 not really")
    with pytest.raises(UserError, match="bad.parquet: cannot read document shard"):
        read_flat(str(bad))


def test_reading_imports_no_pandas_dataset_or_compute(shard):
    script = ("import sys; from data_jobs.shard_read import read_flat; read_flat(sys.argv[1]); read_flat(sys.argv[1], [1]); "
              "print(sorted(m for m in ('pandas', 'pyarrow.dataset', 'pyarrow.compute') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", script, shard], capture_output=True, text=True, timeout=HANG_S)
    assert done.stdout.strip() == "[]", done.stderr
