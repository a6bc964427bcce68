"""The ClientApp that Flower loads (``[tool.flwr.app.components] clientapp``).

Kept lean on purpose: under the Deployment Engine, Flower 1.39 starts a new
process for every message, so every import here is paid per message. The task
module imports torch only for tasks that need it.
"""

from __future__ import annotations

from flwr.client import Client, ClientApp
from flwr.common import Context

from client.numpy_client import GpflClient
from client.settings import ClientSettings
from tasks import load_task


def client_fn(context: Context) -> Client:
    """Build the client of this node for one message."""
    settings = ClientSettings.from_configs(context.run_config, context.node_config)
    task = load_task(context.run_config)
    return GpflClient(task, settings).to_client()


app = ClientApp(client_fn=client_fn)
