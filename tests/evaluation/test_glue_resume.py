"""The GLUE grid is resumable: each (task, lr, seed) cell's result lands in its own file, named by the
cell's config and its inputs' content, as it finishes; a rerun after a cell was lost runs only that cell,
and a changed input (a model rewritten in place, an edited task file) never reuses a stale cell."""
from __future__ import annotations

import json

import pytest

import shutil

from evaluation.cells import CELLS_DIR, cell_key
from evaluation.config import GlueConfig

pytestmark = [pytest.mark.shared_data, pytest.mark.slow]

TINY = dict(tasks=["SST-2", "RTE"], learning_rates=[5e-5, 2e-5], seeds=[1, 2], max_train_examples=8,
            max_eval_examples=8, max_seq_length=32, batch_size=4, max_steps=1, use_ray=False,
            show_progress=False, write_test_predictions=False)


def _cells(out) -> dict:
    return {p.stem: p for p in (out / CELLS_DIR).glob("*.json")}


def _keys(cfg: GlueConfig, task: str, lr: float, seed: int) -> str:
    from evaluation.glue_eval import _check_inputs

    return cell_key(cfg.model_dump(mode="json"), task, lr, seed, _check_inputs(cfg)[1][task])


def _counting(monkeypatch) -> list:
    """Record every (task, lr, seed) that really runs, through the real job function."""
    from evaluation import glue_eval

    ran, real_job = [], glue_eval.glue_job

    def counting_job(cfg_data, task, lr, seed, *rest):
        ran.append((task, lr, seed))
        return real_job(cfg_data, task, lr, seed, *rest)

    monkeypatch.setattr(glue_eval, "glue_job", counting_job)
    return ran


def test_rerun_runs_only_the_missing_cell(tiny_hf, shared_data, tmp_path, monkeypatch):
    from evaluation import glue_eval

    cfg = GlueConfig(model_path=str(tiny_hf), glue_dir=str(shared_data / "glue"), output_dir=str(tmp_path), **TINY)
    first = glue_eval.run_glue(cfg)
    cells = _cells(tmp_path)
    assert len(cells) == 8 and len(first["cells"]["ran"]) == 8 and first["cells"]["reused"] == 0
    assert set(cells) == {_keys(cfg, t, lr, s) for t in TINY["tasks"] for lr in TINY["learning_rates"]
                          for s in TINY["seeds"]}
    lost = _keys(cfg, "RTE", 2e-5, 2)
    kept = {k: p.read_bytes() for k, p in cells.items() if k != lost}
    cells[lost].unlink()

    ran = _counting(monkeypatch)
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


def test_a_grown_grid_reuses_its_cells(tiny_hf, shared_data, tmp_path, monkeypatch):
    """Adding a seed, an lr or a task runs only the new cells."""
    from evaluation import glue_eval

    base = dict(TINY, tasks=["RTE"], learning_rates=[5e-5], seeds=[1])
    cfg = GlueConfig(model_path=str(tiny_hf), glue_dir=str(shared_data / "glue"), output_dir=str(tmp_path), **base)
    first = glue_eval.run_glue(cfg)
    assert len(first["cells"]["ran"]) == 1
    ran = _counting(monkeypatch)
    grown = cfg.model_copy(update={"seeds": [1, 2], "learning_rates": [5e-5, 2e-5], "tasks": ["RTE", "SST-2"]})
    second = glue_eval.run_glue(grown)
    assert ("RTE", 5e-5, 1) not in ran and len(ran) == 7 and second["cells"]["reused"] == 1
    by_seed = {(r["task"], r["lr"], r["seed"]): r["metrics"] for r in second["runs"]}
    assert by_seed[("RTE", 5e-5, 1)] == first["runs"][0]["metrics"]


def test_cells_follow_content_not_paths(tiny_hf, shared_data, tmp_path, monkeypatch):
    """The same model and data by other paths reuse every cell; a model rewritten in place, or one task's
    edited file, runs exactly the cells that read it again; a random init keys on shape and vocab only."""
    import torch

    from bert_core.config import preset
    from bert_core.hf import save_hf
    from bert_core.model import BertForPreTraining
    from evaluation import glue_eval

    glue = tmp_path / "glue"
    for task in ("SST-2", "RTE"):
        shutil.copytree(shared_data / "glue" / task, glue / task)
    model = tmp_path / "model"
    shutil.copytree(tiny_hf, model)
    out = tmp_path / "out"
    base = dict(TINY, tasks=["SST-2", "RTE"], learning_rates=[5e-5], seeds=[1])
    cfg = GlueConfig(model_path=str(model), glue_dir=str(glue), output_dir=str(out), **base)
    assert len(glue_eval.run_glue(cfg)["cells"]["ran"]) == 2
    ran = _counting(monkeypatch)

    # the same content by other paths: a relative model path, a copy of the data
    monkeypatch.chdir(tmp_path)
    shutil.copytree(glue, tmp_path / "glue-copy")
    moved = cfg.model_copy(update={"model_path": "model", "glue_dir": str(tmp_path / "glue-copy")})
    assert glue_eval.run_glue(moved)["cells"]["reused"] == 2 and ran == []

    # the model rewritten in place (other weights, same shape, same path): both cells run again
    torch.manual_seed(123)
    config = preset("tiny", vocab_size=30522)
    save_hf(BertForPreTraining(config), config, tiny_hf / "vocab.txt", tmp_path / "other")
    shutil.rmtree(model)
    shutil.copytree(tmp_path / "other", model)
    assert len(glue_eval.run_glue(cfg)["cells"]["ran"]) == 2 and sorted(ran) == [("RTE", 5e-5, 1), ("SST-2", 5e-5, 1)]

    # one task's dev file edited: only that task's cell runs again
    ran.clear()
    dev = glue / "RTE" / "dev.tsv"
    dev.write_text(dev.read_text(encoding="utf-8").replace("\tentailment\n", "\tnot_entailment\n", 1), encoding="utf-8")
    assert glue_eval.run_glue(cfg)["cells"]["reused"] == 1 and ran == [("RTE", 5e-5, 1)]

    # random init: the weights are ignored, so two models of one shape and vocab share their cells
    ran.clear()
    rnd = cfg.model_copy(update={"random_init": True, "output_dir": str(tmp_path / "rnd")})
    assert len(glue_eval.run_glue(rnd)["cells"]["ran"]) == 2
    assert glue_eval.run_glue(rnd.model_copy(update={"model_path": str(tiny_hf)}))["cells"]["reused"] == 2
    assert len(ran) == 2


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
    one = GlueConfig(**paths, **base, epochs=1)
    three = GlueConfig(**paths, **base, epochs=3)
    assert _keys(cfg, "SST-2", 5e-5, 1) == _keys(one, "SST-2", 5e-5, 1) != _keys(three, "SST-2", 5e-5, 1)
    assert _keys(cfg, "RTE", 5e-5, 1) == _keys(three, "RTE", 5e-5, 1)
    again = glue_eval.run_glue(GlueConfig(**paths, **dict(base, tasks=["SST-2"]), epochs=1))
    assert again["cells"] == {"ran": [], "reused": 1}
    with pytest.raises(ValueError, match="unknown GLUE task 'SST'"):
        GlueConfig(**paths, task_epochs={"SST": 1})
    with pytest.raises(ValueError, match="epochs must be positive"):
        GlueConfig(**paths, task_epochs={"RTE": 0})


def test_task_seeds_add_seeds_to_one_task_and_share_the_common_cells(tiny_hf, shared_data, tmp_path):
    """{seeds: [1, 2], task_seeds: {STS-B: [1, 2, 3]}}: STS-B runs three seeds, RTE two; the cells of seeds 1
    and 2 are the very cells of the grid without task_seeds (reused); the summary counts each task's seeds."""
    from evaluation import glue_eval

    base = dict(TINY, tasks=["STS-B", "RTE"], learning_rates=[5e-5], seeds=[1, 2])
    paths = dict(model_path=str(tiny_hf), glue_dir=str(shared_data / "glue"), output_dir=str(tmp_path))
    plain = glue_eval.run_glue(GlueConfig(**paths, **base))
    assert plain["cells"] == {"ran": plain["cells"]["ran"], "reused": 0} and len(plain["cells"]["ran"]) == 4
    cfg = GlueConfig(**paths, **base, task_seeds={"stsb": [1, 2, 3]})
    assert cfg.task_seeds == {"STS-B": [1, 2, 3]} and cfg.seeds_of("RTE") == [1, 2]
    assert GlueConfig(**paths, **base).config_hash() != cfg.config_hash()
    res = glue_eval.run_glue(cfg)
    assert res["cells"]["reused"] == 4 and [k.split("-")[0] for k in res["cells"]["ran"]] == ["STS"]
    assert res["tasks"]["STS-B"]["seeds"] == [1, 2, 3] and res["tasks"]["RTE"]["seeds"] == [1, 2]
    assert _keys(cfg, "STS-B", 5e-5, 1) == _keys(GlueConfig(**paths, **base), "STS-B", 5e-5, 1)
    with pytest.raises(ValueError, match="unknown GLUE task 'STS'"):
        GlueConfig(**paths, task_seeds={"STS": [1]})
    with pytest.raises(ValueError, match="without repeats"):
        GlueConfig(**paths, task_seeds={"RTE": [1, 1]})
