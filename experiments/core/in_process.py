"""Flower's view of devices for a strategy driven in one process: node ids, nothing to call.

The experiments and benchmarks that play ``ClusteredStrategy`` rounds themselves (no SuperLink,
no engine) hand it these stand-ins for Flower's client proxies and client manager: the strategy
reads a proxy's node id and asks the manager which devices are connected, and nothing more.
They live here, beside the rest of the experiments' machinery, so that an audit, a reproduction
and a benchmark share them without importing one another.
"""

from __future__ import annotations

from flwr.server.client_proxy import ClientProxy

__all__ = ["Manager", "NodeProxy"]


def _never(self, ins, timeout, group_id):
    """Not implemented: ``aggregate_fit`` reads the node id alone (a probe finds no answer)."""
    raise NotImplementedError


class NodeProxy(ClientProxy):
    """A client proxy that only carries a node id (the tests' fake client, too)."""

    get_properties = get_parameters = fit = evaluate = reconnect = _never


class Manager:
    """The connected devices of an in-process federation (what the strategy asks Flower's)."""

    def __init__(self, cids: list[str]) -> None:
        self.clients = {cid: NodeProxy(cid) for cid in cids}

    def all(self) -> dict[str, NodeProxy]:
        """Return every connected device by node id."""
        return dict(self.clients)

    def num_available(self) -> int:
        """Return how many devices are connected."""
        return len(self.clients)

    def wait_for(self, num_clients: int, timeout: int) -> bool:
        """Return at once: every device is connected from the start."""
        return len(self.clients) >= num_clients
