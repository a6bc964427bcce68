"""The ClientApp that Flower loads (``[tool.flwr.app.components] clientapp``).

Kept lean on purpose: under Flower's default per-message processes every import here is paid
per message. The task module imports torch only for tasks that need it.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from flwr.client import Client, ClientApp
from flwr.common import Context

from client.numpy_client import GpflClient
from client.policy import DevicePolicy
from tasks import Task, load_task


def device_task(run_config: Mapping[str, Any], policy: DevicePolicy) -> Task:
    """Build the run's task on this device's own data and hardware (``data-path``, ``device``)."""
    own = {"device": policy["device"], "data-path": policy["data-path"]}
    return load_task({**run_config, **own})


def client_fn(context: Context) -> Client:
    """Build the client of this node for one message."""
    policy = DevicePolicy.load(context.node_config)
    run_config = dict(context.run_config)
    # Built only once the policy has accepted the run (the task's name, among the rest).
    task = functools.partial(device_task, run_config, policy)
    return GpflClient(task, run_config, policy).to_client()


app = ClientApp(client_fn=client_fn)
