"""gpfl's legacy ``Server``: Flower's round loop, instructions sent from a pool sized per engine.

The ServerApp (:mod:`server.app`) builds one; a secure-clusters run builds its subclass
(:class:`server.secure_round.SecureServer`), whose training round is SecAgg+.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from flwr.common import Parameters, Scalar
from flwr.server import History, Server
from flwr.server.compat.grid_client_proxy import GridClientProxy
from flwr.server.server import FitResultsAndFailures
from flwr.superlink.grid import InMemoryGrid

from server.polling import PollingGrid

__all__ = ["SIMULATION_WORKERS_PER_CPU", "GpflServer"]


#: Instructions in flight per CPU on the Simulation Engine (see :class:`GpflServer`).
SIMULATION_WORKERS_PER_CPU = 8


def _cpus() -> int:
    """CPUs this process may run on (the container's share, where the OS says it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


class GpflServer(Server):
    """Flower's legacy ``Server``, sending a round's instructions from a pool sized per engine.

    Under the Deployment Engine every sampled device gets a thread: the threads only wait on
    the network, and fewer would send the instructions in waves, each waiting out the polls of
    the SuperNodes and of the grid (the pool's size is set with ``set_max_workers``).

    On the Simulation Engine (an in-memory grid) the ClientApps run in this machine's Ray
    actors (Flower's default: one per 2 CPUs), and Flower's dispatcher checks every virtual node
    against every instruction in flight every 0.1 s (``vce_api.add_messages_to_queue`` →
    ``InMemoryLinkState.get_message_ins``). With 1,000 virtual nodes and 100 instructions in
    flight that scan was the ServerApp process's largest CPU cost (56 % of it, sampled with
    py-spy), taken from the actors on the same cores. A reply reaches the strategy within
    Flower's two 0.1 s polls, so :data:`SIMULATION_WORKERS_PER_CPU` instructions per CPU keep
    the actors busy while the scan stays small (docs/BENCHMARKS.md).

    Under the Deployment Engine each client proxy's grid is wrapped in a
    :class:`~server.polling.PollingGrid` before the round: replies are pulled every 0.1 s instead
    of Flower's 3 s, so a round waits for one poll (the SuperNode's: 0.5 s under ``gpfl
    supernode``, :mod:`client.fleet_poll`), not two.
    """

    _polling: PollingGrid | None = None
    #: Called once Flower's round loop returns (the run's last line: :meth:`RunRecorder.on_end`).
    on_end: Callable[[], None] | None = None

    def fit(self, num_rounds: int, timeout: float | None) -> tuple[History, float]:
        """Run Flower's rounds, then say how the run ended."""
        result = super().fit(num_rounds, timeout)
        if self.on_end is not None:
            self.on_end()
        return result

    def fit_round(
        self, server_round: int, timeout: float | None
    ) -> tuple[Parameters | None, dict[str, Scalar], FitResultsAndFailures] | None:
        """Size the pool for the engine, then run Flower's round."""
        cap = SIMULATION_WORKERS_PER_CPU * _cpus()
        if self._simulated() and (self.max_workers is None or self.max_workers > cap):
            self.set_max_workers(cap)
        self._poll_replies_often()
        return super().fit_round(server_round, timeout)

    def _poll_replies_often(self) -> None:
        """Give every client proxy on a SuperLink's grid the one shared :class:`PollingGrid`."""
        for proxy in self.client_manager().all().values():
            if not isinstance(proxy, GridClientProxy):
                continue
            grid = proxy.grid
            # A grid that answers within ``send_and_receive`` (``answers_at_once``: the
            # experiments' direct engine) has nothing to poll.
            if isinstance(grid, (InMemoryGrid, PollingGrid)) or getattr(
                    grid, "answers_at_once", False):
                continue
            if self._polling is None or self._polling.grid is not grid:
                self._polling = PollingGrid(grid)
            proxy.grid = self._polling  # duck-typed: Flower's proxy only calls send_and_receive

    def _simulated(self) -> bool:
        """Whether the clients are reached through the Simulation Engine's in-memory grid."""
        proxy = next(iter(self.client_manager().all().values()), None)
        return isinstance(getattr(proxy, "grid", None), InMemoryGrid)
