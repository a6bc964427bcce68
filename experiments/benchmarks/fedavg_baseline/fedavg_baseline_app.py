"""Flower's FedAvg with a NumPy linear-regression client (benchmark yardstick).

Same data shape as gpfl's synthetic task (10 samples, 2 parameters; ``num-parameters`` and
``samples-per-client`` in the run config size it otherwise, as ``optima-repeat`` and
``samples-per-user`` size gpfl's), no clustering, no privacy, nothing imported beyond Flower and
NumPy.
"""

from __future__ import annotations

import numpy as np
from flwr.client import Client, ClientApp, NumPyClient
from flwr.common import Context, ndarrays_to_parameters
from flwr.server import ServerAppComponents, ServerConfig
from flwr.server.strategy import FedAvg
from flwr.serverapp import ServerApp


class LinearClient(NumPyClient):
    """One gradient step of least squares on ``samples`` local samples of ``dimension`` features."""

    def __init__(self, partition_id: int, dimension: int = 2, samples: int = 10) -> None:
        rng = np.random.default_rng(partition_id)
        self.x = rng.standard_normal((samples, dimension))
        # The synthetic task's first optimum (5, 6), repeated to the model's size.
        self.y = self.x @ np.resize([5.0, 6.0], dimension) + rng.uniform(size=samples)

    def fit(self, parameters, config):
        """Take one gradient step."""
        theta = parameters[0].astype(np.float64)
        grad = 2 * self.x.T @ (self.x @ theta - self.y) / len(self.y)
        return [(theta - 0.1 * grad).astype(np.float32)], len(self.y), {}


def client_fn(context: Context) -> Client:
    """Build the client of this node."""
    return LinearClient(int(context.node_config.get("partition-id", 0)),
                        int(context.run_config["num-parameters"]),
                        int(context.run_config["samples-per-client"])).to_client()


def server_fn(context: Context) -> ServerAppComponents:
    """FedAvg over ``clients-per-round`` clients, no evaluation."""
    n = int(context.run_config["clients-per-round"])
    strategy = FedAvg(
        fraction_fit=1e-9, min_fit_clients=n, min_available_clients=n,
        fraction_evaluate=0.0, min_evaluate_clients=0,
        initial_parameters=ndarrays_to_parameters(
            [np.zeros(int(context.run_config["num-parameters"]), dtype=np.float32)]),
    )
    return ServerAppComponents(
        strategy=strategy, config=ServerConfig(num_rounds=int(context.run_config["num-rounds"]))
    )


client_app = ClientApp(client_fn=client_fn)
server_app = ServerApp(server_fn=server_fn)
