"""prefect.yaml, the Python deployments and the pipeline config/plan, checked without a server:
prefect.yaml goes through Prefect's own loader, schedule builder and entrypoint loader."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from flows import deploy
from flows.config import PipelineConfig, demo_config, make_plan

REPO = Path(__file__).resolve().parents[2]
PREFECT_YAML = REPO / "prefect.yaml"


def _prefect_model():
    from prefect.cli.deploy._models import PrefectYamlModel

    return PrefectYamlModel.model_validate(yaml.safe_load(PREFECT_YAML.read_text()))


def test_prefect_yaml_is_accepted_by_prefects_loader():
    from prefect.cli.deploy._schedules import _schedule_config_to_deployment_schedule
    from prefect.client.schemas.schedules import CronSchedule

    model = _prefect_model()
    names = {(d.entrypoint, d.name) for d in model.deployments}
    assert len(names) == len(model.deployments) == 6
    entrypoints = {d.entrypoint.split(":")[1] for d in model.deployments}
    assert entrypoints == {"pretraining_pipeline", "prepare_data", "pretrain", "evaluate", "continual_pretraining"}
    assert all(d.work_pool.name == deploy.DEFAULT_POOL for d in model.deployments)
    scheduled = [d for d in model.deployments if d.schedules]
    # Shipped switched off by the schedule's own flag (what `prefect deployment schedule ls` shows),
    # the deployment itself not paused.
    assert len(scheduled) == 2 and not any(d.paused for d in scheduled)
    raw = yaml.safe_load(PREFECT_YAML.read_text())["deployments"]
    crons = {deploy.EXAMPLE_CRON, deploy.CONTINUAL_CRON}
    for sched_raw in (d["schedules"][0] for d in raw if d.get("schedules")):
        built = _schedule_config_to_deployment_schedule(sched_raw)
        assert isinstance(built["schedule"], CronSchedule) and built["schedule"].cron in crons
        assert built["active"] is False and built["schedule"].timezone == "UTC"
    # Two firings of continual pretraining never run at once.
    assert [d.concurrency_limit for d in model.deployments if "continual" in d.entrypoint] == [1]


def test_prefect_yaml_entrypoints_load_and_parameters_validate():
    from prefect.flows import load_flow_from_entrypoint

    from flows.continual import ContinualConfig, demo_continual_config

    for d in _prefect_model().deployments:
        fl = load_flow_from_entrypoint(str(REPO / d.entrypoint))
        # The YAML's default parameters are the demo presets, so the two cannot drift apart.
        if "continual" in d.entrypoint:
            assert ContinualConfig.model_validate(d.parameters["config"]) == demo_continual_config(), d.entrypoint
        else:
            assert PipelineConfig.model_validate(d.parameters["config"]) == demo_config("runs/prefect"), d.entrypoint
        assert "config" in fl.parameters.properties
    # ... and recipes/continual.yaml, the config docs/continual.md runs, is the continual deployment's default.
    assert ContinualConfig.from_yaml(REPO / "recipes" / "continual.yaml") == demo_continual_config()


def test_python_deployments_match_prefect_yaml():
    yaml_names = {(d.entrypoint.split(":")[1], d.name) for d in _prefect_model().deployments}
    py_names = {(s.flow, s.name) for s in deploy.DEPLOYMENTS}
    assert yaml_names == py_names
    # Schedules and their on/off switches agree too.
    raw = {(d["entrypoint"].split(":")[1], d["name"]): d.get("schedules") or [] for d in
           yaml.safe_load(PREFECT_YAML.read_text())["deployments"]}
    yaml_sched = {k: [(x["cron"], x.get("timezone"), x.get("active", True)) for x in v] for k, v in raw.items()}
    py_sched = {(s.flow, s.name): [(s.cron, "UTC", s.schedule_active)] if s.cron else [] for s in deploy.DEPLOYMENTS}
    assert yaml_sched == py_sched
    limits = {(d.entrypoint.split(":")[1], d.name): d.concurrency_limit for d in _prefect_model().deployments}
    assert limits == {(s.flow, s.name): s.concurrency_limit for s in deploy.DEPLOYMENTS}
    for spec in deploy.DEPLOYMENTS:
        assert callable(spec.load()) and f"flows/{spec.module}.py:{spec.flow}" in {
            d.entrypoint for d in _prefect_model().deployments}


def test_plan_paths_derive_from_config(tmp_path, monkeypatch):
    a = make_plan(demo_config(str(tmp_path / "a")))
    b = make_plan(demo_config(str(tmp_path / "b")))
    # Names hash root-relative configs: the same run under another root gets the same names.
    assert Path(a.shard.output_dir).name == Path(b.shard.output_dir).name
    assert Path(a.train["phase1"].output_dir).name == Path(b.train["phase1"].output_dir).name
    assert a.vocab.shards_dir == a.shard.output_dir
    assert a.instances["phase1"].vocab_dir == a.vocab.output_dir
    assert a.train["phase1"].data_dir == a.instances["phase1"].output_dir
    assert a.heldout.seed != a.instances["phase1"].seed
    # Nor on where the command was started, nor whether the root is an object-store prefix.
    def names(plan):
        dirs = [plan.shard.output_dir, plan.vocab.output_dir, plan.heldout.output_dir, plan.export_dir,
                *(c.output_dir for c in [*plan.instances.values(), *plan.train.values(), *plan.evals.values()])]
        return [str(d).rpartition("/")[2] for d in dirs]

    monkeypatch.chdir(tmp_path)
    assert names(make_plan(demo_config(str(tmp_path / "a")))) == names(a)
    assert names(make_plan(demo_config("s3://bucket/prefix"))) == names(a)
    assert make_plan(demo_config("s3://bucket/prefix/")).train["phase1"].data_dir.startswith("s3://bucket/prefix/instances/")
    # A change upstream renames everything downstream of it.
    changed = demo_config(str(tmp_path / "a")).model_dump()
    changed["shard"]["num_shards"] = 3
    c = make_plan(PipelineConfig.model_validate(changed))
    assert c.shard.output_dir != a.shard.output_dir
    assert c.vocab.output_dir != a.vocab.output_dir
    assert c.train["phase1"].output_dir != a.train["phase1"].output_dir
    # Worker count is not part of any output's identity.
    more = demo_config(str(tmp_path / "a")).model_dump()
    more["shard"]["num_workers"] = 1
    assert make_plan(PipelineConfig.model_validate(more)).shard.output_dir == a.shard.output_dir


def test_two_phases_chain_weights(tmp_path):
    data = demo_config(str(tmp_path)).model_dump(mode="json")
    p2 = {**data["phases"][0], "name": "phase2"}
    p2["instances"] = {**p2["instances"], "max_seq_length": 128}
    data["phases"].append(p2)
    plan = make_plan(PipelineConfig.model_validate(data))
    assert plan.train["phase2"].init_from == plan.train["phase1"].output_dir
    assert plan.train["phase1"].init_from is None


def test_bad_yaml_is_one_line_user_error(tmp_path, capsys):
    from flows.cli import main

    bad = tmp_path / "bad.yaml"
    bad.write_text("shard: {inputs: [x]}\nphases: []\nbogus: 1\n")
    assert main(["pipeline", "--config", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("bertflow: error: ") and "bogus" in err[0]


def test_print_config_round_trips(tmp_path, capsys):
    from flows.cli import main

    assert main(["pipeline", "--print-config", "--output-root", str(tmp_path)]) == 0
    path = tmp_path / "c.yaml"
    path.write_text(capsys.readouterr().out)
    assert PipelineConfig.from_yaml(path) == demo_config(str(tmp_path))


@pytest.mark.parametrize("argv", [["deploy", "--help"], ["serve", "--help"], ["pipeline", "--help"]])
def test_help(argv, capsys):
    from flows.cli import main

    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 0
    assert "usage" in capsys.readouterr().out


def test_deploy_without_api_url_is_one_line_error(capsys):
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.cli import main

    with temporary_settings(restore_defaults={PREFECT_API_URL}):
        assert main(["deploy"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "PREFECT_API_URL" in err[0]


@pytest.mark.parametrize("stage", ["train", "eval"])
def test_stage_without_its_inputs_is_one_line_error(stage, tmp_path, capsys):
    from flows.cli import main

    assert main(["pipeline", "--stage", stage, "--output-root", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"--stage {stage}" in err[0]


def test_missing_input_is_one_line_error_before_any_flow(tmp_path, capsys):
    from flows.cli import main

    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"output_root: {tmp_path}\nshard: {{inputs: [{tmp_path}/absent.txt]}}\n"
                   "phases: [{name: p1, instances: {}, train: {}}]\n")
    assert main(["pipeline", "--config", str(cfg), "--stage", "data"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("bertflow: error: ") and "absent.txt" in err[0]


def test_preflight_names_a_file_root_and_missing_task_data_before_any_flow(tmp_path):
    """Found by hand (issue 24): a file given as output_root, and a GLUE directory that does not exist, used
    to fail inside a flow run (the second only after data and training had run): one line up front."""
    from contracts.common import UserError
    from flows.pipeline import preflight

    (tmp_path / "afile").write_text("mine\n")
    with pytest.raises(UserError, match=rf"^output_root: {tmp_path / 'afile'} is a file, not a directory$"):
        preflight(demo_config(str(tmp_path / "afile")), "all")
    data = demo_config(str(tmp_path / "out")).model_dump(mode="json")
    data["evaluation"]["glue"] = {"glue_dir": str(tmp_path / "nowhere"), "tasks": ["SST-2"]}
    cfg = PipelineConfig.model_validate(data)
    for stage in ("all", "eval"):
        with pytest.raises(UserError, match=rf"^evaluation\.glue\.glue_dir: {tmp_path / 'nowhere'} not found$"):
            preflight(cfg, stage)
    assert (tmp_path / "afile").read_text() == "mine\n" and not (tmp_path / "out").exists()
