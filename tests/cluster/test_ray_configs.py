"""The Ray cluster configs in cluster/ray/ pass Ray's own launcher validation (schema + defaults)."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

RAY_DIR = Path(__file__).resolve().parents[2] / "cluster" / "ray"


@pytest.mark.parametrize("name", ["local.yaml", "aws.yaml"])
def test_cluster_yaml_passes_ray_validation(name):
    from ray.autoscaler._private.util import prepare_config, validate_config

    raw = yaml.safe_load((RAY_DIR / name).read_text())
    prepared = prepare_config(copy.deepcopy(raw))  # what `ray up` does before validating
    validate_config(prepared)
    assert prepared["cluster_name"].startswith("bertflow")
    assert prepared["head_node_type"] in prepared["available_node_types"]


def test_validation_catches_a_typo():
    """The check is real: a misspelt top-level key is rejected by Ray's schema."""
    import jsonschema
    from ray.autoscaler._private.util import prepare_config, validate_config

    raw = yaml.safe_load((RAY_DIR / "local.yaml").read_text())
    raw["max_wrokers"] = 3
    with pytest.raises(jsonschema.ValidationError):
        validate_config(prepare_config(raw))


def test_local_provider_lists_its_workers():
    raw = yaml.safe_load((RAY_DIR / "local.yaml").read_text())
    assert raw["max_workers"] == len(raw["provider"]["worker_ips"])


def test_runtime_env_is_valid():
    from ray.runtime_env import RuntimeEnv

    env = yaml.safe_load((RAY_DIR / "runtime_env.yaml").read_text())
    RuntimeEnv(**env)  # raises on unknown fields or bad types
    assert env["env_vars"]["TOKENIZERS_PARALLELISM"] == "false"
