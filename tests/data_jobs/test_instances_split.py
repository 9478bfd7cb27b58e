"""Held-out shards: split 'train' and split 'heldout' partition the documents, and the config says so."""
from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from contracts.common import UserError
from contracts.schema import Manifest
from data_jobs.config import InstancesConfig, ShardConfig, VocabConfig

pytestmark = [pytest.mark.ray, pytest.mark.shared_data]


def test_split_needs_heldout_shards():
    with pytest.raises(ValueError, match="heldout_shards"):
        InstancesConfig(shards_dir="a", vocab_dir="b", output_dir="c", split="heldout")


def test_train_and_heldout_partition_the_documents(tmp_path, shared_data, bert_uncased_vocab, ray_local):
    from data_jobs import instances_job, shard_job, vocab_job

    docs = tmp_path / "docs"
    shard_job.run(ShardConfig(inputs=[str(shared_data / "corpus/wikipedia_mlperf/wiki_00")],
                              output_dir=str(docs), num_shards=3, num_workers=2))
    vocab_job.run(VocabConfig(vocab_file=str(bert_uncased_vocab), output_dir=str(tmp_path / "vocab")))
    shard_rows = [f.rows for f in sorted(Manifest.read(docs).files, key=lambda f: f.name)]
    base = dict(shards_dir=str(docs), vocab_dir=str(tmp_path / "vocab"), max_seq_length=64,
                dupe_factor=1, heldout_shards=1, num_workers=2)
    train = instances_job.run(InstancesConfig(output_dir=str(tmp_path / "train"), split="train", **base))
    held = instances_job.run(InstancesConfig(output_dir=str(tmp_path / "held"), split="heldout", **base))
    assert train.totals["documents"] == sum(shard_rows[:2])
    assert held.totals["documents"] == shard_rows[2]
    assert train.totals["instances"] > 0 and held.totals["instances"] > 0
    assert train.config_hash != held.config_hash
    # The held-out text is not in the training instances: compare token sequences of whole instances.
    def token_rows(d):
        return {tuple(r) for f in Manifest.read(d).files for r in pq.read_table(d / f.name)["input_ids"].to_pylist()}
    assert not token_rows(tmp_path / "train") & token_rows(tmp_path / "held")
    with pytest.raises(UserError, match="leaves no training shard"):
        instances_job.run(InstancesConfig(output_dir=str(tmp_path / "none"), **{**base, "heldout_shards": 3}))
