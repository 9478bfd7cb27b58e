"""The one place that connects to Ray (local cluster by default, an existing one when given an address)."""
from __future__ import annotations

import json
import os
from typing import Optional

# Environment every worker needs: tokenizers must not fork-deadlock; one Rayon thread per task so
# num_workers tasks use num_workers cores (Ray sets OMP_NUM_THREADS but not RAYON_NUM_THREADS).
WORKER_ENV = {"TOKENIZERS_PARALLELISM": "false", "RAYON_NUM_THREADS": "1", "RAY_USAGE_STATS_ENABLED": "0"}

# Set by `ray job submit` for the driver: the job's runtime env (JSON), which ray.init merges with ours.
_JOB_CONFIG_VAR = "RAY_JOB_CONFIG_JSON_ENV_VAR"


def driver_runtime_env() -> dict:
    """The runtime env for ``ray.init``: WORKER_ENV less the variables a submitted job's runtime env
    already sets. Ray refuses to merge two envs naming the same variable (``Failed to merge the Job's
    runtime env ... because of a conflict``), even with equal values; the job's value wins."""
    env_vars = dict(WORKER_ENV)
    raw = os.environ.get(_JOB_CONFIG_VAR)
    if raw:
        try:
            job_env = (json.loads(raw).get("runtime_env") or {}).get("env_vars") or {}
        except (ValueError, AttributeError):
            job_env = {}
        for key in job_env:
            env_vars.pop(key, None)
    return {"env_vars": env_vars} if env_vars else {}


def ensure_ray(address: Optional[str] = None, num_cpus: Optional[int] = None) -> None:
    """Connect to Ray once: reuse an initialized session, else join ``address`` (or $RAY_ADDRESS, as
    set for a driver started by ``ray job submit``), else start a local cluster."""
    import ray

    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    kwargs = dict(include_dashboard=False, log_to_driver=False, runtime_env=driver_runtime_env())
    # Under `ray job submit` the driver runs on the cluster with RAY_ADDRESS set: join that cluster.
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, **kwargs)
    else:
        ray.init(address="local", num_cpus=num_cpus or os.cpu_count(), **kwargs)
