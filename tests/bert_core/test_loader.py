"""Loader: manifest checks, rank balance over uneven shards, one bin per batch, exact resume cursor,
vectorised collation equal to a naive per-row reading of the Parquet rows."""
from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bert_core.config import preset
from bert_core.loader import BatchLoader, InstanceDataset
from contracts.common import UserError
from train_helpers import write_dataset


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    # three very uneven shards: 150 + 7 + 43 rows
    return write_dataset(tmp_path_factory.mktemp("loader") / "d", n=200, max_seq=32, file_sizes=[150, 7, 43])


@pytest.fixture(scope="module")
def ds(data):
    return InstanceDataset(data)


def _naive_rows(data):
    rows = []
    for f in sorted(data.glob("*.parquet")):
        rows += pq.read_table(f).to_pylist()
    return rows


@pytest.mark.parametrize("world", [1, 2, 3, 5])
def test_every_rank_gets_the_same_batches_count_and_disjoint_rows(ds, world):
    loaders = [BatchLoader(ds, 4, r, world, seed=3) for r in range(world)]
    n = loaders[0].batches_per_epoch()
    assert n > 0 and all(l.batches_per_epoch() == n for l in loaders)
    seen = []
    for _ in range(n):
        rows = [l.next_rows() for l in loaders]
        assert all(len(r) == 4 for r in rows)
        step_rows = np.concatenate(rows)
        assert len(np.unique(ds.bins[step_rows])) == 1  # one length bin per step, across ranks
        seen.append(step_rows)
    seen = np.concatenate(seen)
    assert len(seen) == len(np.unique(seen))  # no row twice in an epoch
    # at most one partial global batch per bin is left out
    assert len(ds) - len(seen) < 4 * world * len(np.unique(ds.bins))
    assert all(l.epoch == 0 and l.index == n for l in loaders)
    loaders[0].next_rows()
    assert loaders[0].epoch == 1  # wraps into the next epoch


def test_epochs_are_shuffled_deterministically(ds):
    a, b = BatchLoader(ds, 4, seed=1), BatchLoader(ds, 4, seed=1)
    assert np.array_equal(a.plan(0), b.plan(0))
    assert not np.array_equal(a.plan(0), a.plan(1))
    assert not np.array_equal(a.plan(0), BatchLoader(ds, 4, seed=2).plan(0))


def test_cursor_resumes_with_exactly_the_next_batch(ds):
    ref = BatchLoader(ds, 8, rank=1, world_size=2, seed=5)
    per_epoch = ref.batches_per_epoch()
    stream = [next(ref) for _ in range(per_epoch + 5)]  # crosses an epoch boundary
    cut = per_epoch - 2
    first = BatchLoader(ds, 8, rank=1, world_size=2, seed=5)
    for _ in range(cut):
        next(first)
    state = json.loads(json.dumps(first.state_dict()))  # survives JSON, as in trainer_state.json
    resumed = BatchLoader(ds, 8, rank=1, world_size=2, seed=5)
    resumed.load_state_dict(state)
    for expected in stream[cut:]:
        got = next(resumed)
        assert all(torch.equal(got[k], expected[k]) for k in expected)


def test_cursor_refuses_another_global_batch(ds):
    state = BatchLoader(ds, 4, 0, 2, seed=5).state_dict()
    with pytest.raises(UserError, match="global_batch_size=8, this run has 16"):
        BatchLoader(ds, 4, 0, 4, seed=5).load_state_dict(state)
    with pytest.raises(UserError, match="micro_batch_size=4, this run has 2"):
        BatchLoader(ds, 2, 0, 2, seed=5, grad_accum_steps=2).load_state_dict(state)


def _step_groups(loaders, steps):
    """Per step, the B-row micro batches of all ranks, ordered by their index in the global batch."""
    out = []
    for _ in range(steps):
        per = [[l.next_rows() for _ in range(l.accum)] for l in loaders]  # per[rank][a]
        world = len(loaders)
        out.append([per[k % world][k // world].tolist() for k in range(world * loaders[0].accum)])
    return out


@pytest.mark.parametrize("layout", [(1, 4), (2, 2), (4, 1)])
def test_global_batches_do_not_depend_on_world_and_accumulation(ds, layout):
    """Elastic resume rests on this: world x accum = 4 micro batches of 2 rows, same groups always."""
    world, accum = layout
    ref = _step_groups([BatchLoader(ds, 2, 0, 1, seed=7, grad_accum_steps=4)], 30)
    got = _step_groups([BatchLoader(ds, 2, r, world, seed=7, grad_accum_steps=accum) for r in range(world)], 30)
    assert got == ref
    for step in got:
        assert len(np.unique(ds.bins[np.concatenate(step)])) == 1  # one bin per global batch


def test_cursor_moves_between_world_sizes(ds):
    """A cursor saved by 2 ranks (accum 1) resumes on 1 rank (accum 2) with exactly the next rows."""
    two = [BatchLoader(ds, 4, r, 2, seed=5) for r in range(2)]
    for _ in range(7):
        for l in two:
            l.next_rows()
    state = json.loads(json.dumps(two[0].state_dict()))
    expected = np.concatenate([l.next_rows() for l in two])
    one = BatchLoader(ds, 4, 0, 1, seed=5, grad_accum_steps=2)
    one.load_state_dict(state)
    assert np.array_equal(np.concatenate([one.next_rows(), one.next_rows()]), expected)


def test_prefetch_and_a_bounded_block_cache_do_not_change_batches(data, monkeypatch):
    """Batches depend on the plan alone: not on prefetching, nor on how few decoded blocks are kept."""
    import bert_core.loader as loader_mod

    plain = BatchLoader(InstanceDataset(data), 4, 1, 2, seed=3, grad_accum_steps=2)
    monkeypatch.setattr(loader_mod, "BLOCK_CACHE_BYTES", 1)  # keep one decoded block at a time
    small = InstanceDataset(data)
    fetched = BatchLoader(small, 4, 1, 2, seed=3, grad_accum_steps=2, prefetch=3)
    n = 2 * plain.batches_per_epoch() + 3  # crosses an epoch boundary
    for i in range(n):
        if i == 9:  # moving the cursor under the prefetch thread restarts it at the new cursor
            fetched.load_state_dict(plain.state_dict())
        a, b = next(plain), next(fetched)
        assert all(torch.equal(a[k], b[k]) for k in a)
        assert len(small._cache) <= 2  # bounded (one block, plus one being collated by the other thread)
    assert fetched.state_dict() == plain.state_dict()
    fetched.close()


def test_block_windows_keep_the_rows_of_a_batch_within_few_blocks(tmp_path, monkeypatch):
    """With windows of about SHUFFLE_ROWS rows, a global batch draws on at most two windows' blocks, and
    every block of a bin is still read in an epoch (a permutation of its rows)."""
    import bert_core.loader as loader_mod

    d = write_dataset(tmp_path / "d", n=240, max_seq=32, file_sizes=[40] * 6, bin_size=32)
    monkeypatch.setattr(loader_mod, "SHUFFLE_ROWS", 40)  # one file (one row group) a window
    ds = InstanceDataset(d)
    loader = BatchLoader(ds, 8, seed=4)
    plan = loader.plan(0)
    blocks = np.searchsorted(ds.block_first, plan, side="right") - 1
    assert max(len(np.unique(b)) for b in blocks) <= 2
    assert sorted(np.concatenate(plan).tolist()) == list(range(240))  # 240 rows, one bin, G=8: all used


def test_a_dataset_of_many_files_keeps_few_open(tmp_path, monkeypatch):
    """Thousands of part files must not mean thousands of open descriptors: at most OPEN_FILES, and the
    batches are those of an unbounded reader."""
    import bert_core.loader as loader_mod

    d = write_dataset(tmp_path / "d", n=120, max_seq=32, file_sizes=[4] * 30)
    plain = BatchLoader(InstanceDataset(d), 4, seed=2)
    monkeypatch.setattr(loader_mod, "OPEN_FILES", 3)
    few = InstanceDataset(d)
    bounded = BatchLoader(few, 4, seed=2)
    for _ in range(plain.batches_per_epoch()):
        a, b = next(plain), next(bounded)
        assert all(torch.equal(a[k], b[k]) for k in a)
        assert len(few._pq) <= 3


def test_old_cursors_are_refused_with_one_line(ds):
    state = BatchLoader(ds, 4, seed=1).state_dict()
    state.pop("plan")
    with pytest.raises(UserError, match="older loader whose data order differs"):
        BatchLoader(ds, 4, seed=1).load_state_dict(state)


def test_a_dataset_on_object_storage_gives_the_same_batches(data, s3_env, tmp_path, monkeypatch):
    """The instances on s3://: the loader fetches each file once into a verified cache keyed by the manifest
    identity and gives exactly the local batches; a damaged cached copy is fetched again."""
    from contracts.storage import location

    monkeypatch.setenv("BERTFLOW_LOADER_CACHE", str(tmp_path / "cache"))
    remote = location(s3_env + "/inst")
    for f in sorted(data.iterdir()):
        remote.upload(f.name, f)
    local = BatchLoader(InstanceDataset(data), 4, 0, 1, seed=7)
    ds3 = InstanceDataset(s3_env + "/inst")
    on_s3 = BatchLoader(ds3, 4, 0, 1, seed=7)
    for _ in range(local.batches_per_epoch()):
        a, b = next(local), next(on_s3)
        assert all(torch.equal(a[k], b[k]) for k in a)
    cached = sorted((tmp_path / "cache").glob("*/*.parquet"))
    assert [p.name for p in cached] == sorted(p.name for p in data.glob("*.parquet"))
    ds3.source.close()
    cached[0].write_bytes(cached[0].read_bytes()[:100])  # a truncated copy (a disk error, a killed copy)
    again = BatchLoader(InstanceDataset(s3_env + "/inst"), 4, 0, 1, seed=7)
    first = BatchLoader(InstanceDataset(data), 4, 0, 1, seed=7)
    a, b = next(first), next(again)
    assert all(torch.equal(a[k], b[k]) for k in a) and cached[0].stat().st_size > 100


def test_collation_matches_a_naive_reading(data, ds):
    naive = _naive_rows(data)
    rows = np.array([3, 160, 199, 42])
    batch = ds.collate(rows, seq_len=32)
    S = 32
    for i, r in enumerate(rows):
        inst = naive[r]
        n = len(inst["input_ids"])
        assert batch["input_ids"][i, :n].tolist() == inst["input_ids"]
        assert batch["input_ids"][i, n:].eq(0).all() and batch["attention_mask"][i].sum() == n
        types = [0] * inst["segment_a_len"] + [1] * (n - inst["segment_a_len"]) + [0] * (S - n)
        assert batch["token_type_ids"][i].tolist() == types
        assert batch["nsp_labels"][i] == inst["nsp_label"]
    flat = [i * S + p for i, r in enumerate(rows) for p in naive[r]["masked_positions"]]
    labels = [t for r in rows for t in naive[r]["masked_ids"]]
    assert batch["mlm_positions"].tolist() == flat and batch["mlm_labels"].tolist() == labels
    assert all(v.dtype == torch.int64 for v in batch.values())


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 199), min_size=1, max_size=16))
def test_masked_labels_are_the_original_tokens(ds, rows):
    """Property: un-masking input_ids at mlm_positions with mlm_labels gives back ids whose masked
    slots were [MASK] (id 4) in the fixture."""
    batch = ds.collate(np.array(rows), seq_len=32)
    flat = batch["input_ids"].reshape(-1)
    assert flat[batch["mlm_positions"]].eq(4).all()
    assert batch["mlm_positions"].max() < flat.numel() and len(batch["mlm_labels"]) == len(batch["mlm_positions"])


def test_batches_are_padded_to_the_bin_bound(ds):
    loader = BatchLoader(ds, 4, seed=0)
    for _ in range(10):
        rows = loader.next_rows()
        S = loader.pad_length(rows)
        assert S % ds.bin_size == 0 and ds.lengths[rows].max() <= S <= 32


def test_manifest_must_match_the_model(ds):
    mc = preset("tiny", vocab_size=100, max_position_embeddings=64)
    ds.check_model(mc, vocab_hash=ds.vocab_hash, max_seq_length=32, max_predictions_per_seq=5)
    cases = [
        (dict(config=preset("tiny", vocab_size=101)), "vocab_size 100 != model vocab_size 101"),
        (dict(config=preset("tiny", vocab_size=100, max_position_embeddings=16)), "max_position_embeddings 16"),
        (dict(config=mc, vocab_hash="0" * 16), "vocab_hash"),
        (dict(config=mc, max_seq_length=128), "max_seq_length 32 != configured 128"),
        (dict(config=mc, max_predictions_per_seq=20), "max_predictions_per_seq 5 != configured 20"),
    ]
    for kwargs, msg in cases:
        with pytest.raises(UserError, match=msg):
            ds.check_model(**kwargs)


def test_bad_datasets_are_refused(tmp_path):
    with pytest.raises(UserError, match="not found"):
        InstanceDataset(tmp_path / "nope")
    d = write_dataset(tmp_path / "d", n=30)
    (d / "instances-00001.parquet").write_bytes(b"garbage")
    with pytest.raises(UserError, match="instances-00001.parquet: size"):
        InstanceDataset(d)
    small = write_dataset(tmp_path / "small", n=12, file_sizes=[12])
    with pytest.raises(UserError, match="too few instances"):
        BatchLoader(InstanceDataset(small), micro_batch_size=16)
    (small / "manifest.json").write_text("{not json")
    with pytest.raises(UserError, match="corrupt manifest"):
        InstanceDataset(small)


def test_row_groups_in_the_manifest_open_an_s3_dataset_without_fetching_a_file(s3_env, tmp_path, monkeypatch):
    """The instances job records each file's bin and row groups: a reader plans its blocks from the
    manifest alone (nothing fetched at open) and reads the batches of a manifest without them."""
    from contracts.schema import Manifest
    from contracts.storage import location

    d = write_dataset(tmp_path / "d", n=60, max_seq=32, file_sizes=[30, 10, 20], bin_size=32)
    m = Manifest.read(d)
    for e in m.files:
        md = pq.read_metadata(d / e.name)
        e.meta.update(bin=32, row_groups=[md.row_group(g).num_rows for g in range(md.num_row_groups)])
    remote = location(s3_env + "/inst")
    for f in sorted(d.iterdir()):
        remote.upload(f.name, f)
    m.write(s3_env + "/inst")  # the manifest last, as the instances job writes it
    monkeypatch.setenv("BERTFLOW_LOADER_CACHE", str(tmp_path / "cache"))
    ds3 = InstanceDataset(s3_env + "/inst")
    assert len(ds3) == 60 and not list((tmp_path / "cache").glob("*/*.parquet"))  # no file fetched yet
    old, new = BatchLoader(InstanceDataset(d), 4, seed=3), BatchLoader(ds3, 4, seed=3)
    for _ in range(old.batches_per_epoch()):
        a, b = next(old), next(new)
        assert all(torch.equal(a[k], b[k]) for k in a)
    ds3.source.close()
