"""The comparison's learning curve: one task at several training-set sizes for every row, its own GLUE
grid per (row, size) inside the comparison directory, a Welch interval per size, the deciding size
declared in the config; a comparison without a curve keeps its hashes and its directory."""
from __future__ import annotations

import json

import pytest

CURVE = {"task": "SST-2", "sizes": [8, 16], "primary": 16, "seeds": [1, 2]}
GLUE = dict(tasks=["SST-2"], learning_rates=[5e-5], seeds=[1], epochs=2.0, task_epochs={"SST-2": 1.0},
            max_train_examples=8, max_eval_examples=8, max_seq_length=32, batch_size=4, use_ray=False, show_progress=False,
            write_test_predictions=False)


def test_the_spec_refuses_an_undeclared_primary_point_repeats_and_single_seeds():
    from pydantic import ValidationError

    from flows.recipe_config import LearningCurveSpec

    assert LearningCurveSpec().model_dump() == {"task": "SST-2", "sizes": [1000, 2000, 4000], "primary": 2000,
                                                "seeds": [1, 2, 3, 4, 5]}
    for bad, message in (({"primary": 3000}, "primary 3000 is not one of sizes"),
                         ({"sizes": [1000, 1000], "primary": 1000}, "distinct positive"),
                         ({"seeds": [1]}, "at least 2"), ({"seeds": [1, 1]}, "repeat a seed")):
        with pytest.raises(ValidationError, match=message):
            LearningCurveSpec(**bad)


def test_a_curve_adds_cells_not_a_new_budget_and_no_curve_keeps_the_stage_hash(tmp_path):
    from contracts.common import stable_hash
    from flows.recipe_config import ComparisonSpec, LearningCurveSpec, budget_hash
    from flows.stages import CompareStage

    spec = ComparisonSpec.model_validate({"glue": {"glue_dir": "g", "tasks": ["SST-2"]}})
    assert budget_hash(spec) == budget_hash(spec.model_copy(update={"learning_curve": LearningCurveSpec()}))
    rows = [{"name": "pre", "model_path": "/m", "random_init": False}]
    plain = CompareStage(rows, {"tasks": ["SST-2"]}, str(tmp_path))
    # the hash a comparison had before curves existed: a finished one stays done
    assert plain._config_hash() == stable_hash({"rows": [{"name": "pre", "random_init": False}],
                                                "glue": {"tasks": ["SST-2"]}, "sentence_task": "nsp"})
    assert CompareStage(rows, {"tasks": ["SST-2"]}, str(tmp_path), curve=CURVE)._config_hash() != plain._config_hash()


@pytest.mark.slow
def test_every_row_at_every_size_with_an_interval_per_size(tiny_hf, shared_data, ray_local, tmp_path):
    """On Ray the rows' grids and the curve's run at once (evaluation.compare.run_grids); in process, one
    after another: the same cells, so a rerun in process reuses every one and reports the same figures."""
    from evaluation.compare import compare_models, compare_stage, curve_dir

    rows = [{"name": "pretrained", "model_path": str(tiny_hf), "random_init": False},
            {"name": "random init", "model_path": str(tiny_hf), "random_init": True}]
    glue = {**GLUE, "glue_dir": str(shared_data / "glue")}
    out = tmp_path / "compare"
    comp = compare_models(rows, {**glue, "use_ray": True}, out, curve=CURVE)
    assert [r["cells_ran"] for r in comp["rows"]] == [1, 1]
    lc = comp["learning_curve"]
    assert set(lc["points"]) == {"pretrained", "random init"}
    for name in lc["points"]:
        assert set(lc["points"][name]) == {"8", "16"} and all(p["n"] == 2 for p in lc["points"][name].values())
    for n in (8, 16):
        results = json.loads((out / f"curve-{'pretrained'}-n{n}" / "results.json").read_text())
        # the first N training examples, the grid's epochs (not SST-2's task_epochs pass), the curve's seeds
        assert {r["n_train"] for r in results["runs"]} == {n} and {r["seed"] for r in results["runs"]} == {1, 2}
        assert {r["steps"] for r in results["runs"]} == {2 * n // 4}
        assert curve_dir(out, "random init", n).endswith(f"curve-random-init-n{n}")
    [pair] = lc["differences"]
    assert pair == "pretrained minus random init" and set(lc["differences"][pair]) == {"8", "16"}
    md = (out / "comparison.md").read_text()
    assert "Learning curve: SST-2 dev metric x100" in md and "| **16** |" in md and "| 8 |" in md
    # the comparison's directory owns the curve's grids: a rerun's foreign-file check does not refuse them
    assert {f"curve-pretrained-n{n}" for n in (8, 16)} <= compare_stage(out, rows, CURVE).owns
    again = compare_models(rows, glue, out, curve=CURVE)  # in process: every cell reused, the same figures
    assert again["learning_curve"]["points"] == lc["points"] and [r["cells_ran"] for r in again["rows"]] == [0, 0]
    assert [r["tasks"] for r in again["rows"]] == [r["tasks"] for r in comp["rows"]]
