"""The Simulation Engine at many virtual users: its costs grow with the round, not the users.

Flower 1.39's Simulation Engine has two costs that grow with every virtual user, whether it is
sampled or not; at 100,000 users and 1,000 a round they kept a round from finishing:

* **The dispatcher.** One thread hands instructions to the workers
  (``vce_api.add_messages_to_queue``): every 0.1 s, for *every* virtual node, it asks the
  in-memory LinkState for one undelivered instruction (``get_message_ins(node_id, limit=1)``),
  and each ask walks every instruction stored, checking each one's expiry: N·M checks a cycle
  with N users and M instructions in flight, 10⁸ every 0.1 s at 100,000 users.
  :func:`add_messages_to_queue` does the same in one pass over the stored instructions per
  cycle: it checks them once (Flower's own ``_check_stored_messages``: expired ones, or ones
  whose nodes left the federation, are deleted), then, under the state's lock, takes for each
  virtual node at most one undelivered instruction, the first stored (what
  ``get_message_ins(node_id, limit=1)`` returns), marks it delivered with Flower's clock and
  queues it: O(M + N_pending) a cycle, whatever N is. Any other LinkState is left to Flower's.
* **The node contexts.** Before the first instruction, the engine builds every virtual node's
  context (``vce_api._register_node_info_stores``), reading and fusing the app's
  ``pyproject.toml`` once per node: about 2 ms each, 3.5 minutes at 100,000 users (inside round
  1, whose instructions then expired), and a copy of the run config per user held for the run.
  :class:`LazyNodeStores` makes a node's context when its first instruction reaches a worker,
  from the run config fused once (Flower's ``get_fused_config_from_dir``), with what
  Flower's ``DeprecatedRunInfoStore.register_context`` puts in it; a node never sampled costs
  nothing there.

:func:`install` puts both into Flower's module, in the simulation process only
(:mod:`deploy.serverapp_runner` with ``--task simulation``). It imports only Flower.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from queue import Queue
from typing import Any

from flwr.app import Context, Message, RecordDict
from flwr.common.constant import NUM_PARTITIONS_KEY, PARTITION_ID_KEY
from flwr.compat.client.run_info_store import DeprecatedRunInfoStore, RunInfo
from flwr.server.superlink.fleet.vce import vce_api
from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState
from flwr.supercore.date import now
from flwr.supercore.run import Run

__all__ = ["CYCLE_S", "LazyNodeStores", "add_messages_to_queue", "install",
           "lazy_node_info_stores", "take_undelivered"]

#: Seconds between two cycles (Flower's).
CYCLE_S = 0.1
#: Flower's own dispatcher, for LinkStates other than the in-memory one.
FLOWER_ADD_MESSAGES: Callable[..., None] = vce_api.add_messages_to_queue


def take_undelivered(state: InMemoryLinkState, nodes: Mapping[int, Any]) -> list[Message]:
    """Return, and mark delivered, one undelivered instruction per node of ``nodes``.

    For each node, the first one stored: what Flower's ``get_message_ins(node_id, limit=1)``
    returns for it, after the same check of the stored instructions.
    """
    with state.lock:
        # Flower's check of each instruction (expiry, federation), once for all of them.
        state._check_stored_messages(set(state.message_ins_store))
        taken: dict[int, Message] = {}
        for message in state.message_ins_store.values():
            node = message.metadata.dst_node_id
            if message.metadata.delivered_at == "" and node in nodes and node not in taken:
                taken[node] = message
        delivered_at = now().isoformat()
        for message in taken.values():
            message.metadata.delivered_at = delivered_at
    return list(taken.values())


def add_messages_to_queue(state: Any, queue: Queue[Message], nodes_mapping: Mapping[int, Any],
                          f_stop: threading.Event) -> None:
    """Put instructions in the workers' queue until ``f_stop`` (Flower's signature)."""
    if not isinstance(state, InMemoryLinkState):
        FLOWER_ADD_MESSAGES(state, queue, nodes_mapping, f_stop)
        return
    while not f_stop.is_set():
        for message in take_undelivered(state, nodes_mapping):
            queue.put(message)
        f_stop.wait(CYCLE_S)


class LazyNodeStores(dict[int, DeprecatedRunInfoStore]):
    """Each virtual node's context store, made when the node's first instruction needs it.

    What Flower's ``_register_node_info_stores`` builds for every node up front: a
    ``DeprecatedRunInfoStore`` with the node's ``partition-id`` and ``num-partitions``, holding
    the run's context (the fused run config, an empty state). Workers only index it by node id.

    Parameters
    ----------
    nodes_mapping : Mapping[int, int]
        Node id to partition id, as the engine registered them.
    run : Run
        The run.
    app_dir : str or None
        The installed app, whose ``pyproject.toml`` is fused with the run's overrides.
    """

    def __init__(self, nodes_mapping: Mapping[int, int], run: Run,
                 app_dir: str | None = None) -> None:
        super().__init__()
        self._partitions = nodes_mapping
        self._num_partitions = len(set(nodes_mapping.values()))
        self._run = run
        self._app_dir = app_dir
        self._config: dict[str, Any] | None = None
        self._lock = threading.Lock()

    def _run_config(self) -> dict[str, Any]:
        if self._config is None:
            # Flower's register_context: the app's config fused with the run's overrides, or
            # (no app folder) the installed FAB's; read once here, not once a node.
            probe = DeprecatedRunInfoStore(node_id=0, node_config={})
            probe.register_context(run_id=self._run.run_id, run=self._run, app_dir=self._app_dir)
            self._config = dict(probe.run_infos[self._run.run_id].initial_run_config)
        return self._config

    def __missing__(self, node_id: int) -> DeprecatedRunInfoStore:
        partition = self._partitions[node_id]  # a node the engine does not know: KeyError
        with self._lock:
            if node_id in self:  # another worker made it meanwhile
                return dict.__getitem__(self, node_id)
            store = DeprecatedRunInfoStore(node_id=node_id, node_config={
                PARTITION_ID_KEY: partition, NUM_PARTITIONS_KEY: self._num_partitions})
            config = self._run_config()
            # What register_context stores, with the config fused above.
            store.run_infos[self._run.run_id] = RunInfo(
                initial_run_config=dict(config),
                context=Context(run_id=self._run.run_id, node_id=node_id,
                                node_config=store.node_config, state=RecordDict(),
                                run_config=dict(config)))
            self[node_id] = store
            return store


def lazy_node_info_stores(nodes_mapping: Mapping[int, int], run: Run,
                          app_dir: str | None = None) -> LazyNodeStores:
    """Flower's ``_register_node_info_stores``, each store made on first use."""
    return LazyNodeStores(nodes_mapping, run, app_dir)


def install() -> None:
    """Make the Simulation Engine of this process use this module's dispatcher and stores."""
    vce_api.add_messages_to_queue = add_messages_to_queue
    vce_api._register_node_info_stores = lazy_node_info_stores
