"""The GLUE grid is resumable: each (task, lr, seed) cell's result lands in its own file, named by the
cell's config hash, as it finishes; a rerun after a cell was lost runs only that cell."""
from __future__ import annotations

import json

import pytest

from evaluation.cells import CELLS_DIR, cell_key, legacy_cell_key
from evaluation.config import GlueConfig

pytestmark = [pytest.mark.shared_data, pytest.mark.slow]

TINY = dict(tasks=["SST-2", "RTE"], learning_rates=[5e-5, 2e-5], seeds=[1, 2], max_train_examples=8,
            max_eval_examples=8, max_seq_length=32, batch_size=4, max_steps=1, use_ray=False,
            show_progress=False, write_test_predictions=False)


def _cells(out) -> dict:
    return {p.stem: p for p in (out / CELLS_DIR).glob("*.json")}


def test_rerun_runs_only_the_missing_cell(tiny_hf, shared_data, tmp_path, monkeypatch):
    from evaluation import glue_eval

    cfg = GlueConfig(model_path=str(tiny_hf), glue_dir=str(shared_data / "glue"), output_dir=str(tmp_path), **TINY)
    first = glue_eval.run_glue(cfg)
    cells = _cells(tmp_path)
    assert len(cells) == 8 and len(first["cells"]["ran"]) == 8 and first["cells"]["reused"] == 0
    cfg_data = cfg.model_dump(mode="json")
    assert set(cells) == {cell_key(cfg_data, t, lr, s) for t in TINY["tasks"] for lr in TINY["learning_rates"]
                          for s in TINY["seeds"]}
    lost = cell_key(cfg_data, "RTE", 2e-5, 2)
    kept = {k: p.read_bytes() for k, p in cells.items() if k != lost}
    cells[lost].unlink()

    ran = []  # count what really runs, through the real job function
    real_job = glue_eval.glue_job

    def counting_job(cfg_data, task, lr, seed, *rest):
        ran.append((task, lr, seed))
        return real_job(cfg_data, task, lr, seed, *rest)

    monkeypatch.setattr(glue_eval, "glue_job", counting_job)
    second = glue_eval.run_glue(cfg)
    assert ran == [("RTE", 2e-5, 2)]
    assert second["cells"] == {"ran": [lost], "reused": 7}
    assert {k: p.read_bytes() for k, p in _cells(tmp_path).items() if k != lost} == kept  # untouched
    assert set(second["tasks"]) == {"SST-2", "RTE"} and len(second["runs"]) == 8
    # Same config, same seeds, CPU: the re-run cell reproduces the lost one's metrics exactly.
    assert second["tasks"]["RTE"]["by_lr"] == first["tasks"]["RTE"]["by_lr"]

    # A changed config (other budget) never reuses a stale cell.
    third = glue_eval.run_glue(cfg.model_copy(update={"max_train_examples": 12}))
    assert third["cells"]["reused"] == 0 and len(third["cells"]["ran"]) == 8
    json.loads((tmp_path / "results.json").read_text())  # the report of the last call is whole


def test_a_grown_grid_reuses_its_cells_and_reads_legacy_names(tiny_hf, shared_data, tmp_path, monkeypatch):
    """Adding a seed, an lr or a task runs only the new cells; a cell written under the legacy name (the
    grid's shape in its hash) is read back and copied to its current name, never run again."""
    from evaluation import glue_eval

    base = dict(TINY, tasks=["RTE"], learning_rates=[5e-5], seeds=[1])
    cfg = GlueConfig(model_path=str(tiny_hf), glue_dir=str(shared_data / "glue"), output_dir=str(tmp_path), **base)
    first = glue_eval.run_glue(cfg)
    assert len(first["cells"]["ran"]) == 1
    ran = []
    real_job = glue_eval.glue_job

    def counting_job(cfg_data, task, lr, seed, *rest):
        ran.append((task, lr, seed))
        return real_job(cfg_data, task, lr, seed, *rest)

    monkeypatch.setattr(glue_eval, "glue_job", counting_job)
    grown = cfg.model_copy(update={"seeds": [1, 2], "learning_rates": [5e-5, 2e-5], "tasks": ["RTE", "SST-2"]})
    second = glue_eval.run_glue(grown)
    assert ("RTE", 5e-5, 1) not in ran and len(ran) == 7 and second["cells"]["reused"] == 1
    by_seed = {(r["task"], r["lr"], r["seed"]): r["metrics"] for r in second["runs"]}
    assert by_seed[("RTE", 5e-5, 1)] == first["runs"][0]["metrics"]

    # a cell written by the code before this change: its file bears the legacy name of its own grid
    legacy_dir = tmp_path / "legacy"
    old_cfg = cfg.model_copy(update={"output_dir": str(legacy_dir)})
    data = old_cfg.model_dump(mode="json")
    legacy = legacy_cell_key(data, "RTE", 5e-5, 1)
    current = cell_key(data, "RTE", 5e-5, 1)
    assert legacy != current
    (legacy_dir / CELLS_DIR).mkdir(parents=True)
    cell = json.loads((tmp_path / CELLS_DIR / f"{current}.json").read_text())
    (legacy_dir / CELLS_DIR / f"{legacy}.json").write_text(json.dumps({"key": legacy, "result": cell["result"]}))
    ran.clear()
    third = glue_eval.run_glue(old_cfg)
    assert ran == [] and third["cells"] == {"ran": [], "reused": 1}
    assert set(_cells(legacy_dir)) == {legacy, current}  # copied to its current name, the old file kept
    ran.clear()
    fourth = glue_eval.run_glue(old_cfg.model_copy(update={"seeds": [1, 2]}))  # found by its current name now
    assert ran == [("RTE", 5e-5, 2)] and fourth["cells"]["reused"] == 1


def test_task_epochs_override_one_task_and_share_its_cells(tiny_hf, shared_data, tmp_path):
    """{epochs: 3, task_epochs: {SST-2: 1}}: SST-2 trains one pass, RTE three; the SST-2 cell is the very
    cell of a grid run at epochs 1 (same key, reused), the RTE cell the one of epochs 3."""
    from evaluation import glue_eval

    base = dict(TINY, tasks=["SST-2", "RTE"], learning_rates=[5e-5], seeds=[1], max_steps=None)
    paths = dict(model_path=str(tiny_hf), glue_dir=str(shared_data / "glue"), output_dir=str(tmp_path))
    cfg = GlueConfig(**paths, **base, epochs=3, task_epochs={"sst2": 1})  # task names as get_task reads them
    assert cfg.task_epochs == {"SST-2": 1.0} and cfg.epochs_of("SST-2") == 1 and cfg.epochs_of("RTE") == 3
    res = glue_eval.run_glue(cfg)
    steps = {r["task"]: r["steps"] for r in res["runs"]}
    assert steps == {"SST-2": 2, "RTE": 6}  # 8 examples in batches of 4: 2 steps an epoch
    data = cfg.model_dump(mode="json")
    one = GlueConfig(**paths, **base, epochs=1).model_dump(mode="json")
    three = GlueConfig(**paths, **base, epochs=3).model_dump(mode="json")
    assert cell_key(data, "SST-2", 5e-5, 1) == cell_key(one, "SST-2", 5e-5, 1) != cell_key(three, "SST-2", 5e-5, 1)
    assert cell_key(data, "RTE", 5e-5, 1) == cell_key(three, "RTE", 5e-5, 1)
    again = glue_eval.run_glue(GlueConfig(**paths, **dict(base, tasks=["SST-2"]), epochs=1))
    assert again["cells"] == {"ran": [], "reused": 1}
    with pytest.raises(ValueError, match="unknown GLUE task 'SST'"):
        GlueConfig(**paths, task_epochs={"SST": 1})
    with pytest.raises(ValueError, match="epochs must be positive"):
        GlueConfig(**paths, task_epochs={"RTE": 0})
