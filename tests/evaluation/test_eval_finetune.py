"""The fine-tuning loop on a toy model: batch trimming, schedule, determinism per seed, learning."""
from __future__ import annotations

import torch

from evaluation.config import FinetuneOptions
from evaluation.finetune import fit, linear_schedule, predict, total_steps, trim_batch


class Toy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(10, 8)
        self.out = torch.nn.Linear(8, 2)

    def forward(self, input_ids, attention_mask):
        assert input_ids.shape == attention_mask.shape
        return self.out(self.emb(input_ids[:, 0]))  # like [CLS]: the label depends on the first token


def _data(n=64):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 10, (n, 6), generator=g)
    mask = torch.ones(n, 6, dtype=torch.long)
    mask[n // 2 :, 3:] = 0
    labels = (ids[:, 0] > 5).long()  # learnable from the first token
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def test_trim_batch_cuts_only_sequence_tensors():
    b = {"input_ids": torch.ones(2, 8), "attention_mask": torch.tensor([[1] * 3 + [0] * 5, [1] * 5 + [0] * 3]),
         "labels": torch.zeros(2), "token_labels": torch.zeros(2, 8, 3)}
    out = trim_batch(b)
    assert out["input_ids"].shape == (2, 5) and out["token_labels"].shape == (2, 5, 3) and out["labels"].shape == (2,)


def test_schedule_warms_up_then_decays_to_zero():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = linear_schedule(opt, warmup_steps=2, total_steps=6)
    lrs = []
    for _ in range(6):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs == [0.5, 1.0, 1.0, 0.75, 0.5, 0.25]
    assert total_steps(65, 32, 3, None) == 9 and total_steps(65, 32, 0.5, None) == 2 and total_steps(65, 32, 3, 4) == 4


def test_fit_is_deterministic_per_seed_and_learns():
    opts = FinetuneOptions(batch_size=8, epochs=8, warmup_proportion=0.1)
    loss = lambda m, b: torch.nn.functional.cross_entropy(m(b["input_ids"], b["attention_mask"]), b["labels"])
    weights = []
    for seed in (1, 1, 2):
        torch.manual_seed(0)
        model = Toy()
        stats = fit(model, _data(), loss, opts, 5e-2, seed, torch.device("cpu"))
        weights.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    assert stats["steps"] == 64
    assert torch.equal(weights[0], weights[1]) and not torch.equal(weights[0], weights[2])
    logits = torch.cat(predict(model, _data(), lambda m, b: m(b["input_ids"], b["attention_mask"]), 16,
                               torch.device("cpu")))
    assert (logits.argmax(-1) == _data()["labels"]).float().mean() > 0.9


class Recorder(Toy):
    """Toy that records the dtype its linear layer computes in."""

    def __init__(self):
        super().__init__()
        self.dtypes: list[torch.dtype] = []

    def forward(self, input_ids, attention_mask):
        out = super().forward(input_ids, attention_mask)
        self.dtypes.append(out.dtype)
        return out


def test_bf16_autocasts_the_forward_passes_and_keeps_fp32_weights():
    opts = FinetuneOptions(batch_size=8, epochs=8, warmup_proportion=0.1, precision="bf16")
    loss = lambda m, b: torch.nn.functional.cross_entropy(m(b["input_ids"], b["attention_mask"]).float(), b["labels"])
    torch.manual_seed(0)
    model = Recorder()
    fit(model, _data(), loss, opts, 5e-2, 1, torch.device("cpu"))
    assert set(model.dtypes) == {torch.bfloat16}  # every training forward ran under autocast
    assert all(p.dtype == torch.float32 for p in model.parameters())
    model.dtypes.clear()
    logits = torch.cat(predict(model, _data(), lambda m, b: m(b["input_ids"], b["attention_mask"]), 16,
                               torch.device("cpu"), "bf16"))
    assert set(model.dtypes) == {torch.bfloat16} and logits.dtype == torch.float32
    assert (logits.argmax(-1) == _data()["labels"]).float().mean() > 0.9  # it still learns
    model.dtypes.clear()
    predict(model, _data(), lambda m, b: m(b["input_ids"], b["attention_mask"]), 16, torch.device("cpu"))
    assert set(model.dtypes) == {torch.float32}  # the default is fp32


def test_precision_left_at_fp32_keeps_older_configs_hashes_and_cells():
    from contracts.common import stable_hash
    from evaluation.cells import cell_key
    from evaluation.config import GlueConfig, SquadConfig

    base = dict(model_path="m", glue_dir="g", output_dir="o")
    cfg = GlueConfig(**base)
    data = cfg.model_dump(mode="json")
    older = {k: v for k, v in data.items() if k != "precision"}  # a config written before the option
    assert cell_key(data, "SST-2", 5e-5, 1, {}) == cell_key(older, "SST-2", 5e-5, 1, {})
    bf16 = GlueConfig(**base, precision="bf16")
    assert cell_key(bf16.model_dump(mode="json"), "SST-2", 5e-5, 1, {}) != cell_key(data, "SST-2", 5e-5, 1, {})
    assert bf16.config_hash() != cfg.config_hash()
    squad = SquadConfig(model_path="m", dev_file="d", output_dir="o")
    dump = squad.model_dump(mode="json", exclude=set(squad.run_fields | squad.input_fields) | {"precision"})
    assert squad.config_hash() == stable_hash(dump)  # the hash SQuAD had before the option
