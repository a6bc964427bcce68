"""PollingGrid: replies pulled by one poller for every waiting instruction, deadline kept."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any

import pytest

from server import polling
from server.polling import PollingGrid


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
            lambda i: wrapped.send_and_receive([f"m{i}"], timeout=30), range(20)))

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
            lambda i: wrapped.send_and_receive([f"m{i}"], timeout=30), range(20)))

    # Assert: every device got its reply, and no two pushes overlapped.
    assert [r[0].id for r in replies] == [f"m{i}" for i in range(20)]
    assert most == 1


def test_an_instruction_without_reply_times_out_as_a_missed_deadline(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    # Prepare: a reply that never comes, a deadline of 0.05 s (+ a short grace).
    monkeypatch.setattr(polling, "DEADLINE_GRACE", 0.05)
    grid = FakeGrid({})
    wrapped: Any = PollingGrid(grid, interval=0.01)  # type: ignore[arg-type]

    # Execute / Assert: TimeoutError (a missing device for the strategy), after the deadline.
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="deadline"):
        wrapped.send_and_receive(["lost"], timeout=0.05)
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
    assert [r.id for r in wrapped.send_and_receive(["m"], timeout=30)] == ["m"]
