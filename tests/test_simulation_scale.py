"""The Simulation Engine at many users: gpfl's dispatcher and node contexts are Flower's own.

The dispatcher runs against Flower's own in-memory LinkState, beside Flower's. The instructions
are stand-ins carrying the metadata both read (destination, run, delivered); Flower's check of
the stored instructions (expiry, federation) is recorded rather than run, since the stand-ins have
no run. The lazy node contexts are compared with those Flower's engine builds up front.
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
from flwr.supercore.run import Run
from flwr.superlink.federation import NoOpFederationManager

from deploy import simulation_scale
from deploy.launcher import project_root
from deploy.simulation_scale import LazyNodeStores, add_messages_to_queue, take_undelivered


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
    monkeypatch.setattr(vce_api, "add_messages_to_queue", simulation_scale.FLOWER_ADD_MESSAGES)
    simulation_scale.install()
    monkeypatch.setattr(vce_api, "_register_node_info_stores",
                        vce_api._register_node_info_stores)
    simulation_scale.install()
    assert vce_api.add_messages_to_queue is add_messages_to_queue
    assert vce_api._register_node_info_stores is simulation_scale.lazy_node_info_stores


def test_a_lazy_node_context_is_the_one_flower_builds_up_front() -> None:
    # Prepare: 50 virtual nodes of a run of this app, with a run-config override.
    run = Run.create_empty(run_id=7)
    run.override_config = {"num-rounds": 3}
    nodes = {1000 + i: i for i in range(50)}
    flower = vce_api._register_node_info_stores(nodes, run, app_dir=str(project_root()))

    # Execute
    lazy = LazyNodeStores(nodes, run, app_dir=str(project_root()))
    built = {node: lazy[node] for node in (1003, 1049, 1000)}

    # Assert: only the nodes asked for exist; each holds what Flower's holds; contexts are not
    # shared between nodes; an unknown node is still a KeyError.
    assert sorted(lazy) == [1000, 1003, 1049]
    for node, store in built.items():
        mine, theirs = store.run_infos[7], flower[node].run_infos[7]
        assert store.node_config == flower[node].node_config
        assert mine.initial_run_config == theirs.initial_run_config
        assert mine.initial_run_config["num-rounds"] == 3
        assert mine.context.node_id == node and mine.context.run_id == 7
        assert mine.context.node_config == theirs.context.node_config
        assert mine.context.run_config == theirs.context.run_config
        assert len(mine.context.state) == 0
    assert built[1003].run_infos[7].context is not built[1049].run_infos[7].context
    built[1003].run_infos[7].context.run_config["num-rounds"] = 99
    assert lazy[1049].run_infos[7].context.run_config["num-rounds"] == 3
    with pytest.raises(KeyError):
        lazy[5]
