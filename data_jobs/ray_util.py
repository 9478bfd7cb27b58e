"""The one place that connects to Ray (local cluster by default, an existing one when given an address)."""
from __future__ import annotations

import os
from typing import Optional

# Environment every worker needs: tokenizers must not fork-deadlock; one Rayon thread per task so
# num_workers tasks use num_workers cores (Ray sets OMP_NUM_THREADS but not RAYON_NUM_THREADS).
WORKER_ENV = {"TOKENIZERS_PARALLELISM": "false", "RAYON_NUM_THREADS": "1", "RAY_USAGE_STATS_ENABLED": "0"}


def ensure_ray(address: Optional[str] = None, num_cpus: Optional[int] = None) -> None:
    """Connect to Ray once: reuse an initialized session, else join ``address`` (or $RAY_ADDRESS, as
    set for a driver started by ``ray job submit``), else start a local cluster."""
    import ray

    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    kwargs = dict(include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": WORKER_ENV})
    # Under `ray job submit` the driver runs on the cluster with RAY_ADDRESS set: join that cluster.
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, **kwargs)
    else:
        ray.init(address="local", num_cpus=num_cpus or os.cpu_count(), **kwargs)
