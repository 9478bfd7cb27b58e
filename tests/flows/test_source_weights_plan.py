"""The pipeline's one ``source_weights`` field reaches every phase's instances (a phase's own wins) and the
held-out instances of the mixture; left out, every directory keeps its name."""
from __future__ import annotations

import pytest

from contracts.common import UserError
from flows.config import PipelineConfig, make_plan


def _config(tmp_path, **extra) -> dict:
    def phase(name):
        return {"name": name, "instances": {"max_seq_length": 64}, "train": {"model": "tiny", "max_steps": 2}}

    return {"output_root": str(tmp_path), "shard": {"inputs": ["builtin:python-docs"]},
            "phases": [phase("p1"), phase("p2")],
            "evaluation": {"intrinsic": {"batch_size": 8}}, **extra}


def test_pipeline_weights_reach_every_phase_and_the_held_out_side(tmp_path):
    plain = make_plan(PipelineConfig.model_validate(_config(tmp_path)))
    cfg = _config(tmp_path, source_weights={"wiki/": 2, "books": 0.5})
    cfg["phases"][1]["instances"]["source_weights"] = {"books": 1}
    plan = make_plan(PipelineConfig.model_validate(cfg))
    assert plan.instances["p1"].source_weights == {"books": 0.5, "wiki": 2.0}
    assert plan.instances["p2"].source_weights == {"books": 1.0}  # the phase's own
    assert plan.heldout.source_weights == {"books": 1.0}  # the last phase's mixture, held-out documents
    assert plain.instances["p1"].source_weights == {} and plain.heldout.source_weights == {}
    for name in ("p1", "p2"):  # another mixture, other directories; the documents and vocab are the same
        assert plan.instances[name].output_dir != plain.instances[name].output_dir
    assert plan.shard.output_dir == plain.shard.output_dir and plan.vocab.output_dir == plain.vocab.output_dir
    # an empty mixture is no mixture: the directories of a config without the field
    same = make_plan(PipelineConfig.model_validate(_config(tmp_path, source_weights={})))
    assert same.instances == plain.instances and same.heldout == plain.heldout
    assert PipelineConfig.model_validate(_config(tmp_path)).config_hash() == \
        PipelineConfig.model_validate(_config(tmp_path, source_weights={})).config_hash()


def test_a_bad_weight_is_refused_with_the_config(tmp_path):
    with pytest.raises(ValueError, match="between 0 and 100"):
        PipelineConfig.model_validate(_config(tmp_path, source_weights={"wiki": 1000}))
    bad = _config(tmp_path)
    bad["phases"][0]["instances"]["source_weights"] = {"wiki": -1}
    with pytest.raises((ValueError, UserError), match="between 0 and 100"):
        make_plan(PipelineConfig.model_validate(bad))
