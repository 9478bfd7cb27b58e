"""The GPU recipe (recipes/gpu-small.yaml) and the split run that measured it on a lent H200
(bench/gpu_recipe.py): the data stages here, everything after on a machine with neither Prefect nor Ray,
and ``finish`` when the lease ended inside the GLUE grid. Run on the recipe's own smoke overlay."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from flowtest_support import REPO

RECIPE = "recipes/gpu-small.yaml"
# The GPU machine's Python: neither Prefect nor Ray can be imported there.
WITHOUT_ORCHESTRATION = ("import runpy, sys; sys.modules['prefect'] = None; sys.modules['ray'] = None; "
                         "sys.argv = ['bench/gpu_recipe.py'] + sys.argv[1:]; "
                         "runpy.run_path('bench/gpu_recipe.py', run_name='__main__')")


def test_the_gpu_recipe_is_bert_small_under_deepspeed_on_one_gpu_and_its_smoke_runs_on_cpu():
    from bert_core.config import preset
    from flows.recipe import load_recipe

    cfg = load_recipe(str(REPO / RECIPE))
    [phase] = cfg.phases
    t = phase.train
    model = preset(t.model)
    assert (model.num_hidden_layers, model.hidden_size, model.num_attention_heads) == (4, 512, 8)
    assert (t.engine, t.zero_stage, t.precision, t.micro_batch_size, t.fast_attention) == ("deepspeed", 1, "bf16", 256,
                                                                                           True)
    # 3,000 steps of 256 draw fewer sequences than the instances hold: no masking repeats (the comment says so)
    assert t.max_steps * t.micro_batch_size < 903_787 and phase.instances.dupe_factor == 10
    assert cfg.evaluation.intrinsic.gpus_per_task == 1 and cfg.comparison.glue.gpus_per_task == 1
    assert not cfg.comparison.glue.use_ray  # one GPU: cells one after another
    smoke = load_recipe(str(REPO / RECIPE), smoke=True)
    assert smoke.phases[0].train.engine == "torch" and smoke.comparison.glue.gpus_per_task == 0
    assert smoke.evaluation.intrinsic.gpus_per_task == 0 and not smoke.comparison.minilm


def _bench(*args: str, blocked: bool = False) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-c", WITHOUT_ORCHESTRATION, *args] if blocked else [sys.executable, "bench/gpu_recipe.py",
                                                                                 *args]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc


@pytest.mark.slow
@pytest.mark.shared_data
def test_split_run_prepare_here_then_device_without_prefect_or_ray_then_finish(tmp_path):
    if not (REPO.parent / "shared" / "data" / "glue").is_dir():
        pytest.skip(f"the recipe reads ../shared/data relative to {REPO} (absent)")
    out = tmp_path / "root"
    common = ["--config", RECIPE, "--smoke", "--output-root", str(out)]
    made = _bench("prepare", *common).stdout
    carried = [line.split("carry: ", 1)[1] for line in made.splitlines() if line.startswith("carry: ")]
    assert [c.split("/")[-2] for c in carried] == ["documents", "vocab", "instances", "instances", "instances"]
    for d in (out / "instances").iterdir():  # the GPU machine gets documents and vocab, and makes these again
        shutil.rmtree(d)

    timings = tmp_path / "timings.json"
    _bench("device", *common, "--timings", str(timings), blocked=True)
    stages = json.loads(timings.read_text())["stages"]
    ran = [s["stage"] for s in stages if not s["skipped"]]
    assert ran[:4] == ["data-job-instances", "data-job-instances", "pretrain-phase-seq128", "export"]
    assert ran[-1] == "compare-models" and all(s["seconds"] > 0 for s in stages if not s["skipped"])
    [report] = list((out / "compare").glob("seq128-*/comparison.json"))
    comp = json.loads(report.read_text())
    assert [r["name"] for r in comp["rows"]] == ["pretrained (this pipeline)", "random init (same shape)"]
    assert all(r["cells_ran"] == 3 for r in comp["rows"])  # SST-2 with seed 1, STS-B with seeds 1 and 2

    again = tmp_path / "again.json"  # a rerun there: every stage skipped
    _bench("device", *common, "--timings", str(again), blocked=True)
    assert all(s["skipped"] for s in json.loads(again.read_text())["stages"])

    # finish: the lease ended inside the random-init row's grid; the pretrained row's weights did not come
    # back (its finished grid is read from results.json), the random-init row's missing cell runs here.
    [export] = list((out / "export").iterdir())
    (export / "model.safetensors").rename(tmp_path / "weights")
    [rnd_cells] = list((out / "compare").glob("random-init-same-shape-*/cells"))
    [sst2] = list(rnd_cells.glob("SST-2-*.json"))
    kept = json.loads(sst2.read_text())
    sst2.unlink()
    (rnd_cells.parent / "results.json").unlink()
    for name in ("comparison.json", "comparison.md", "comparison.png"):
        (report.parent / name).unlink()
    (tmp_path / "weights").rename(export / "model.safetensors")  # a random init still reads the shape's file
    _bench("finish", *common)
    finished = json.loads(report.read_text())
    pre, rnd = finished["rows"]
    assert pre["cells_ran"] == 0 and rnd["cells_ran"] == 1  # only the missing cell ran
    def timeless(cell: dict) -> dict:
        return {**cell, "result": {**cell["result"], "runs": [{k: v for k, v in r.items() if k != "train_seconds"}
                                                              for r in cell["result"]["runs"]]}}

    assert timeless(json.loads(sst2.read_text())) == timeless(kept)  # the same cell, deterministic on CPU
    assert pre["tasks"] == comp["rows"][0]["tasks"] and rnd["tasks"] == comp["rows"][1]["tasks"]
