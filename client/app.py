"""The ClientApp that Flower loads (``[tool.flwr.app.components] clientapp``).

Kept lean on purpose: under Flower's default per-message processes every import here is paid
per message. The task module imports torch only for tasks that need it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flwr.client import Client, ClientApp
from flwr.common import Context

from client.numpy_client import GpflClient
from client.policy import DevicePolicy
from client.secure import round_terms, secure_clusters_mod
from tasks import Task, load_task


def device_task(run_config: Mapping[str, Any], policy: DevicePolicy) -> Task:
    """Build the run's task on this device's own data and hardware (``data-path``, ``device``)."""
    return load_task(policy.task_config(run_config))


def client_fn(context: Context) -> Client:
    """Build the client of this node for one message.

    The task is built by the client itself, once the round is charged: building it may read
    the device's data, and an error there must reach the server as the fixed failure text.
    """
    policy = DevicePolicy.load(context.node_config)
    run_config = dict(context.run_config)
    return GpflClient(lambda: device_task(run_config, policy), run_config, policy,
                      run_id=context.run_id,
                      secure=round_terms(context)).to_client()


#: Training messages of SecAgg+ (secure clusters) pass Flower's secaggplus_mod, wrapped in the
#: device's cohort rules; every other message reaches the client as before.
app = ClientApp(client_fn=client_fn, mods=[secure_clusters_mod])
