"""The Simulation Engine's dispatcher, in time that grows with the messages, not with the users.

Flower 1.39's Simulation Engine hands instructions to its workers from one thread
(``vce_api.add_messages_to_queue``): every 0.1 s, for *every* virtual node, it asks the in-memory
LinkState for one undelivered instruction (``get_message_ins(node_id, limit=1)``), and each ask
walks every instruction stored, checking each one's expiry. With N virtual users and M
instructions in flight a cycle costs N·M checks: at 100,000 users and 1,000 a round, 10⁸ every
0.1 s, and the round never finished (the dispatcher took the CPU its clients needed).

:func:`add_messages_to_queue` does what Flower's does in one pass over the stored instructions per
cycle: it checks them once (Flower's own ``_check_stored_messages``: expired ones, or ones whose
nodes left the federation, are deleted), then, under the state's lock, takes for each virtual
node at most one undelivered instruction, the first stored (what ``get_message_ins(node_id,
limit=1)`` returns), marks it delivered with Flower's clock, and queues it. A cycle costs
O(M + N_pending), whatever N is. Any other LinkState is left to Flower's own function.

:func:`install` puts it in Flower's module, in the simulation process only
(:mod:`server.serverapp_runner` with ``--task simulation``). It imports only Flower.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from queue import Queue
from typing import Any

from flwr.app import Message
from flwr.server.superlink.fleet.vce import vce_api
from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState
from flwr.supercore.date import now

__all__ = ["CYCLE_S", "add_messages_to_queue", "install", "take_undelivered"]

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


def install() -> None:
    """Make the Simulation Engine of this process use :func:`add_messages_to_queue`."""
    vce_api.add_messages_to_queue = add_messages_to_queue
