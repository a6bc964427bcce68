"""PollingGrid: replies pulled by one poller for every waiting instruction, deadline kept."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from flwr.app import DEFAULT_TTL, ArrayRecord, Error, Metadata, RecordDict
from flwr.app.message import make_message, remove_content_from_message
from flwr.common.constant import ErrorCode
from flwr.common.serde import message_to_proto
from flwr.proto.message_pb2 import PullObjectResponse
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects, get_object_tree
from flwr.supercore.run import Run
from flwr.superlink.grid.http_grid import HttpGrid

from server import polling
from server.polling import PollingGrid


class Instruction:
    """An instruction as the grid pushes it: an id, and a TTL counted from its creation (now)."""

    def __init__(self, mid: str, ttl: float = DEFAULT_TTL) -> None:
        self.mid = mid
        self.metadata = SimpleNamespace(ttl=ttl, created_at=time.time())

    def __str__(self) -> str:
        return self.mid


class FakeGrid:
    """A grid whose reply to message ``m`` is ready once ``ready[m]`` pulls have passed it."""

    def __init__(self, ready: dict[str, int]) -> None:
        self.ready = ready
        self.pulls: list[list[str]] = []
        self.lock = threading.Lock()

    def push_messages(self, messages: Iterable[Any]) -> list[str]:
        return [str(m) for m in messages]

    def pull_messages(self, message_ids: Iterable[str]) -> list[Any]:
        ids = list(message_ids)
        with self.lock:
            self.pulls.append(ids)
            n = len(self.pulls)
        return [SimpleNamespace(metadata=SimpleNamespace(reply_to_message_id=m), id=m)
                for m in ids if self.ready.get(m, 10**9) <= n]


def test_every_instruction_in_flight_is_pulled_by_one_poller() -> None:
    # Prepare: 20 single-instruction sends at once (as Flower's round sends them, one thread a
    # device); instruction i's reply is ready at pull i % 5 + 1.
    grid = FakeGrid({f"m{i}": i % 5 + 1 for i in range(20)})
    wrapped: Any = PollingGrid(grid, interval=0.01)  # type: ignore[arg-type]

    # Execute
    with ThreadPoolExecutor(20) as pool:
        replies = list(pool.map(
            lambda i: wrapped.send_and_receive([Instruction(f"m{i}")], timeout=30), range(20)))

    # Assert: each got its own reply; the pulls asked for many instructions at once, never
    # one pull per instruction per interval.
    assert [r[0].id for r in replies] == [f"m{i}" for i in range(20)]
    assert len(grid.pulls) < 20 and max(len(p) for p in grid.pulls) > 1


def test_pushes_go_one_at_a_time_so_the_superlink_stores_shared_content_once() -> None:
    # Prepare: a grid that records how many pushes are under way at once; a push takes 5 ms.
    # (Flower's SuperLink asks a push for every object of its message not yet *available*:
    # 20 concurrent pushes of one round's instruction upload its hypotheses 20 times.)
    grid = FakeGrid({f"m{i}": 1 for i in range(20)})
    under_way, most = 0, 0
    original = grid.push_messages

    def slow_push(messages: Iterable[Any]) -> list[str]:
        nonlocal under_way, most
        with grid.lock:
            under_way += 1
            most = max(most, under_way)
        time.sleep(0.005)
        with grid.lock:
            under_way -= 1
        return original(messages)

    grid.push_messages = slow_push  # type: ignore[method-assign]
    wrapped: Any = PollingGrid(grid, interval=0.01)  # type: ignore[arg-type]

    # Execute: one thread a device, as Flower's round sends them.
    with ThreadPoolExecutor(20) as pool:
        replies = list(pool.map(
            lambda i: wrapped.send_and_receive([Instruction(f"m{i}")], timeout=30), range(20)))

    # Assert: every device got its reply, and no two pushes overlapped.
    assert [r[0].id for r in replies] == [f"m{i}" for i in range(20)]
    assert most == 1


@pytest.mark.parametrize(("ttl", "timeout"), [(0.05, None), (DEFAULT_TTL, 0.05)],
                         ids=["the instruction's TTL", "a timeout"])
def test_an_instruction_without_reply_times_out_as_a_missed_deadline(
    monkeypatch: pytest.MonkeyPatch, ttl: float, timeout: float | None
) -> None:
    # Prepare: a reply that never comes, a deadline of 0.05 s (+ a short grace): the
    # instruction's TTL, as Flower's client proxy sets it (with no timeout), or a timeout.
    monkeypatch.setattr(polling, "DEADLINE_GRACE", 0.05)
    grid = FakeGrid({})
    wrapped: Any = PollingGrid(grid, interval=0.01)  # type: ignore[arg-type]

    # Execute / Assert: TimeoutError (a missing device for the strategy), after the deadline.
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="deadline"):
        wrapped.send_and_receive([Instruction("lost", ttl)], timeout=timeout)
    assert time.monotonic() - start >= 0.1
    # The poller stops once nothing is awaited: the grid is pulled no more (but for a pull
    # already under way), however long it is left.
    pulls = len(grid.pulls)
    time.sleep(0.2)  # 20 intervals
    assert len(grid.pulls) <= pulls + 1


def test_a_failing_pull_is_retried() -> None:
    # Prepare: the first pull fails (a SuperLink restarting), the reply is ready at pull 3.
    grid = FakeGrid({"m": 3})
    original = grid.pull_messages

    def flaky(ids: Iterable[str]) -> list[Any]:
        result = original(ids)
        if len(grid.pulls) == 1:
            raise ConnectionError("SuperLink unavailable")
        return result

    grid.pull_messages = flaky  # type: ignore[method-assign,assignment]
    wrapped: Any = PollingGrid(grid, interval=0.01)  # type: ignore[arg-type]

    # Execute / Assert
    assert [r.id for r in wrapped.send_and_receive([Instruction("m")], timeout=30)] == ["m"]


class StoredReplies:
    """A stand-in for the SuperLink's Runtime API: envelopes and objects of real replies.

    Each reply is a Flower message deflated by Flower's own code; the objects of the replies
    in ``unfinished`` never become available (their device died mid-upload).
    """

    def __init__(self, replies: dict[str, Any], unfinished: set[str]) -> None:
        self.envelopes = {
            reply_to: (message_to_proto(remove_content_from_message(reply)),
                       get_object_tree(reply))
            for reply_to, reply in replies.items()}
        self.objects = {oid: obj.deflate() for reply in replies.values()
                        for oid, obj in get_all_nested_objects(reply).items()}
        self.withheld = {oid for reply_to in unfinished
                         for oid in get_all_nested_objects(replies[reply_to])
                         if oid != replies[reply_to].object_id}
        self.confirmed: list[str] = []
        self.handed_over: set[str] = set()

    def PullMessages(self, request: Any) -> Any:  # Flower's RPC names
        # The SuperLink hands an envelope over once and deletes the instruction with it; an
        # instruction asked for again is answered with its "Message Unavailable" error.
        found = []
        for mid in request.message_ids:
            if mid in self.envelopes:
                found.append(self.envelopes.pop(mid))
                self.handed_over.add(mid)
            elif mid in self.handed_over:
                error = make_message(
                    metadata=Metadata(run_id=1, message_id="", src_node_id=7, dst_node_id=1,
                                      reply_to_message_id=mid, group_id="", ttl=60,
                                      message_type="train", created_at=time.time()),
                    error=Error(code=ErrorCode.MESSAGE_UNAVAILABLE,
                                reason="Error: Message Unavailable"))
                self.objects[error.object_id] = error.deflate()
                found.append((message_to_proto(error), get_object_tree(error)))
        return SimpleNamespace(messages_list=[p for p, _ in found],
                               message_object_trees=[t for _, t in found])

    def PullObject(self, request: Any) -> Any:
        if request.object_id in self.withheld:
            return PullObjectResponse(object_found=True, object_available=False)
        return PullObjectResponse(object_found=True, object_available=True,
                                  object_content=self.objects[request.object_id])

    def ConfirmMessageReceived(self, request: Any) -> None:
        self.confirmed.append(request.message_object_id)


def _reply(reply_to: str, value: float) -> Any:
    """A device's reply to instruction ``reply_to``: one array, several objects."""
    reply = make_message(
        metadata=Metadata(run_id=1, message_id="", src_node_id=7, dst_node_id=1,
                          reply_to_message_id=reply_to, group_id="", ttl=60,
                          message_type="train", created_at=time.time()),
        content=RecordDict({"update": ArrayRecord([np.full(3, value)])}))
    reply.metadata.__dict__["_message_id"] = reply.object_id
    return reply


def test_a_reply_whose_upload_never_finishes_holds_up_only_its_own_device() -> None:
    # Prepare: Flower's HTTP grid over a stand-in Runtime API holding three devices' replies;
    # the middle device died mid-upload. (Flower's own pull_messages would retry its objects
    # for up to two hours, holding the two finished replies with it.)
    replies = {f"m{i}": _reply(f"m{i}", float(i)) for i in range(3)}
    store = StoredReplies(replies, unfinished={"m1"})

    class Grid(HttpGrid):
        @property
        def _runtime_client(self) -> Any:
            return store

        def push_messages(self, messages: Iterable[Any]) -> list[str]:
            return [str(m) for m in messages]

    grid = Grid(token="t")
    grid.set_run(Run.create_empty(run_id=1))
    wrapped: Any = PollingGrid(grid, interval=0.01)
    timeout = 3.0

    # Execute: one thread a device, as Flower's round sends them.
    start = time.monotonic()
    arrived: dict[str, float] = {}

    def send(mid: str) -> Any:
        # As Flower's client proxy sends it: the deadline is the instruction's TTL alone.
        reply = wrapped.send_and_receive([Instruction(mid, ttl=timeout)])[0]
        arrived[mid] = time.monotonic() - start
        return reply

    with ThreadPoolExecutor(3) as pool:
        got = dict(zip(replies, pool.map(send, replies), strict=True))

    # Assert: the finished replies came whole, before the stuck one's deadline (they did not
    # wait for it), and were confirmed to the SuperLink; the unfinished one became Flower's
    # error reply for it, not before its deadline and long before Flower's two hours. The
    # bounds are the deadline itself and wide margins, not speeds: a loaded CI machine may
    # stall a thread for a second without anything being wrong.
    for mid in ("m0", "m2"):
        assert got[mid].content["update"].to_numpy_ndarrays()[0].tolist() == \
            [float(mid[1])] * 3
        assert arrived[mid] < timeout
    assert sorted(store.confirmed) == sorted(replies[m].object_id for m in ("m0", "m2"))
    assert got["m1"].has_error()
    assert got["m1"].error.reason.startswith(polling.UNAVAILABLE_REASON)
    assert timeout - 0.5 <= arrived["m1"] <= timeout + polling.DEADLINE_GRACE + 30
