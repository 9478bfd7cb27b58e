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
