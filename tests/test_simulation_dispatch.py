"""gpfl's Simulation Engine dispatcher hands out what Flower's does, in one pass a cycle.

Both run against Flower's own in-memory LinkState. The instructions are stand-ins carrying the
metadata both read (destination, run, delivered); Flower's check of the stored instructions
(expiry, federation) is recorded rather than run, since the stand-ins have no run.
"""

from __future__ import annotations

import random
import threading
from queue import Queue
from types import SimpleNamespace
from typing import Any

import pytest
from flwr.server.superlink.fleet.vce import vce_api
from flwr.server.superlink.linkstate import LinkStateFactory
from flwr.supercore.constant import FLWR_IN_MEMORY_DB_NAME
from flwr.supercore.object_store import ObjectStoreFactory
from flwr.superlink.federation import NoOpFederationManager

from server import simulation_dispatch
from server.simulation_dispatch import add_messages_to_queue, take_undelivered


def state_with(messages: list[tuple[str, int]]) -> Any:
    """A fresh in-memory LinkState holding undelivered stand-ins ``(id, destination)``."""
    state = LinkStateFactory(FLWR_IN_MEMORY_DB_NAME, NoOpFederationManager(),
                             ObjectStoreFactory()).state()
    state.checked = []
    state._check_stored_messages = lambda ids, run_id=None: state.checked.append(set(ids))
    for message_id, node in messages:
        state.message_ins_store[message_id] = SimpleNamespace(
            id=message_id, metadata=SimpleNamespace(dst_node_id=node, run_id=1, delivered_at=""))
    return state


def flower_cycle(state: Any, nodes: dict[int, Any]) -> list[str]:
    """One cycle of Flower's own dispatcher (the body of ``vce_api.add_messages_to_queue``)."""
    return [m.id for node in nodes for m in state.get_message_ins(node_id=node, limit=1)]


@pytest.mark.parametrize("seed", range(20))
def test_each_cycle_delivers_what_flowers_delivers(seed: int) -> None:
    # Prepare: 30 instructions for 12 nodes (some with several, some with none), and 3 nodes of
    # another run's mapping whose instructions must stay; the same store in two states.
    rng = random.Random(seed)
    nodes = {node: None for node in range(12)}
    messages = [(f"m{i}", rng.choice([*range(12), 100, 101, 102])) for i in range(30)]
    flower, ours = state_with(messages), state_with(messages)

    # Execute / Assert: cycle after cycle, the same instructions leave (the first stored for each
    # node with one left), marked delivered, until none is left; other nodes' stay.
    for _ in range(31):
        expected = sorted(flower_cycle(flower, nodes))
        got = sorted(m.id for m in take_undelivered(ours, nodes))
        assert got == expected
        assert ours.checked[-1] == {m for m, _ in messages}  # every stored one checked
        if not expected:
            break
    for state in (flower, ours):
        left = [m.id for m in state.message_ins_store.values() if m.metadata.delivered_at == ""]
        assert sorted(left) == sorted(m for m, node in messages if node not in nodes)


def test_the_dispatcher_thread_queues_and_stops() -> None:
    # Prepare
    state = state_with([("a", 1), ("b", 2), ("c", 1)])
    queue: Queue[Any] = Queue()
    stop = threading.Event()
    thread = threading.Thread(target=add_messages_to_queue, args=(state, queue, {1: 0, 2: 1},
                                                                  stop))

    # Execute: long enough for a few cycles.
    thread.start()
    got = [queue.get(timeout=5).id for _ in range(3)]
    stop.set()
    thread.join(timeout=5)

    # Assert: all three, node 1's in their stored order; the thread ended on the event.
    assert sorted(got) == ["a", "b", "c"] and got.index("a") < got.index("c")
    assert not thread.is_alive()


def test_install_replaces_flowers_dispatcher_in_its_module(monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    monkeypatch.setattr(vce_api, "add_messages_to_queue", simulation_dispatch.FLOWER_ADD_MESSAGES)
    simulation_dispatch.install()
    assert vce_api.add_messages_to_queue is add_messages_to_queue
