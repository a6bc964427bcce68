"""Join a running Ray cluster with Flower's Simulation Engine instead of starting a local Ray.

Flower's Ray backend calls ``ray.init()`` with no address (``flwr.server.superlink.fleet.vce.
backend.raybackend``); Ray then joins the cluster named by ``RAY_ADDRESS``, and applies the job
configuration in ``RAY_JOB_CONFIG_JSON_ENV_VAR`` (how Ray's own job submission passes a job's
runtime environment) to every worker of the job, on every node. Both reach the simulation
process through the SuperLink's environment, which it inherits.

On a local Ray the virtual nodes' Ray workers are children of the simulation process and inherit
``GPFL_POLICY`` (the device policy every virtual node applies). On a cluster they are started by
each node's own Ray daemon, which knows nothing of the launch: the policy is handed to them in
the job's runtime environment instead.
"""

from __future__ import annotations

import json
from pathlib import Path

from client.policy import POLICY_ENV

__all__ = ["ray_cluster_env"]

#: Ray's variable for a job's configuration (``ray._private.runtime_env.constants``).
RAY_JOB_CONFIG_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"


def ray_cluster_env(address: str, policy_file: Path) -> dict[str, str]:
    """Return the environment that makes the Simulation Engine run on the cluster at ``address``.

    Parameters
    ----------
    address : str
        The cluster's head, ``HOST:PORT`` (its GCS port, as ``ray start --address`` takes it).
    policy_file : Path
        The device policy file every virtual node applies; the cluster's nodes must see it at
        this path (a shared file system, or the same path on each node).

    Raises
    ------
    ValueError
        If ``address`` is not ``HOST:PORT``.
    """
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"ray-address={address!r}: expected HOST:PORT of the cluster's head "
                         "(e.g. 10.0.0.5:6379, as `ray start --head --port` was given)")
    job = {"runtime_env": {"env_vars": {POLICY_ENV: str(policy_file)}}}
    return {"RAY_ADDRESS": address, RAY_JOB_CONFIG_ENV: json.dumps(job)}
