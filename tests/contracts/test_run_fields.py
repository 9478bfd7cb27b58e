"""The one hashing rule (contracts.common.StrictModel): each config class names its own run fields and
input fields; a name that is none of its fields is refused when the class is defined, and a run field
never changes the config hash while every other field does."""
from __future__ import annotations

import importlib

import pytest
from pydantic import Field

from contracts.common import StrictModel

CONFIG_MODULES = ["data_jobs.config", "bert_core.config", "bert_core.train_config", "evaluation.config",
                  "flows.config", "flows.recipe_config", "flows.gate", "flows.registry", "flows.specs"]


def _all_configs() -> list[type[StrictModel]]:
    """Every config class of the project's modules (not the classes tests make, such as the refused
    ``Typo`` above, which lingers among the subclasses while its traceback does)."""
    for m in CONFIG_MODULES:
        importlib.import_module(m)
    seen, todo = [], list(StrictModel.__subclasses__())
    while todo:
        c = todo.pop()
        if c not in seen:
            seen.append(c)
            todo += c.__subclasses__()
    return [c for c in seen if c.__module__ in CONFIG_MODULES]


@pytest.mark.parametrize("kind", ["run_fields", "input_fields"])
def test_a_config_naming_a_field_it_does_not_have_is_refused_at_definition(kind):
    with pytest.raises(TypeError, match=rf"Typo\.{kind} names no field of it: \['outptu_dir'\]"):
        type("Typo", (StrictModel,), {"__annotations__": {"output_dir": str}, "output_dir": Field("x"),
                                      kind: frozenset({"output_dir", "outptu_dir"})})


def test_every_config_names_only_its_own_fields():
    configs = _all_configs()
    assert len(configs) > 20
    for c in configs:
        assert c.run_fields <= set(c.model_fields), c
        assert c.input_fields <= set(c.model_fields), c


def test_run_fields_leave_the_hash_and_other_fields_enter_it(tmp_path):
    from bert_core.train_config import TrainConfig
    from data_jobs.config import ShardConfig

    base = ShardConfig(inputs=[str(tmp_path / "a.txt")], output_dir=str(tmp_path / "out"))
    for field, value in [("num_workers", 7), ("ray_address", "auto"), ("engine", "local"),
                         ("output_dir", str(tmp_path / "elsewhere")), ("overwrite", True)]:
        assert field in ShardConfig.run_fields
        assert base.model_copy(update={field: value}).config_hash() == base.config_hash(), field
    assert base.model_copy(update={"num_shards": base.num_shards + 1}).config_hash() != base.config_hash()
    t = TrainConfig(data_dir=str(tmp_path / "data"), output_dir=str(tmp_path / "run"))
    assert t.model_copy(update={"launcher": "deepspeed", "num_workers": 2, "keep_last": 9}).config_hash() == \
        t.config_hash()
    assert t.model_copy(update={"seed": t.seed + 1}).config_hash() != t.config_hash()
