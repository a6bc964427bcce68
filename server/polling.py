"""Replies pulled every 0.1 s, not every 3 s: a grid whose ``send_and_receive`` waits less.

Flower's legacy round sends each sampled device its instruction through its client proxy
(``GridClientProxy``), which calls the grid's ``send_and_receive`` with one message. Flower's
gRPC/HTTP grid (``flwr.superlink.grid.http_grid``) pushes the message, then pulls its reply and
sleeps 3 s between pulls: a reply waits up to 3 s on the SuperLink before the ServerApp sees it,
on top of the SuperNode's own wait between polls for work (3 s in Flower; 0.5 s for a device run
by ``gpfl supernode``, :mod:`server.fleet_poll`). :class:`PollingGrid` does the same with
Flower's public Grid API (``push_messages``, ``pull_messages``) and one poller thread that pulls
every instruction in flight at once, every :data:`POLL_INTERVAL` seconds, so a round waits at
most one SuperNode poll plus 0.1 s, and the SuperLink gets one pull request per interval however
many devices a round has.

The round's deadline stays Flower's: the instruction's TTL is the round timeout, and the
SuperLink answers an instruction still unanswered at its TTL with a *Message Unavailable* error
when it is pulled. The poller pulls for :data:`DEADLINE_GRACE` seconds past the deadline to
receive that answer; if none came, ``send_and_receive`` raises :class:`TimeoutError`, which
:func:`strategies.proxies.classify_failure` counts as a missed deadline, as the error would be.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout

from flwr.app import Message, RecordDict
from flwr.serverapp.grid import Grid
from flwr.supercore.run import Run

logger = logging.getLogger(__name__)

__all__ = ["DEADLINE_GRACE", "POLL_INTERVAL", "PollingGrid"]

#: Seconds between two pulls of the replies in flight.
POLL_INTERVAL = 0.1
#: Seconds pulled past a deadline, for the SuperLink's own answer to an expired instruction.
DEADLINE_GRACE = 1.0


class PollingGrid(Grid):
    """Wrap a Flower grid; its ``send_and_receive`` waits for replies a shared poller pulls.

    Every other method is the wrapped grid's.

    Parameters
    ----------
    grid : Grid
        Flower's grid the ServerApp was given.
    interval : float
        Seconds between pulls.
    """

    def __init__(self, grid: Grid, interval: float = POLL_INTERVAL) -> None:
        self.grid = grid
        self.interval = interval
        self._lock = threading.Lock()
        self._push_lock = threading.Lock()
        self._waiting: dict[str, Future[Message]] = {}
        self._poller: threading.Thread | None = None

    def set_run(self, run: Run) -> None:
        """Flower's ``Grid.set_run``, on the wrapped grid."""
        self.grid.set_run(run)

    @property
    def run(self) -> Run:
        """The wrapped grid's run."""
        return self.grid.run

    def create_message(self, content: RecordDict, message_type: str, dst_node_id: int,
                       group_id: str, ttl: float | None = None) -> Message:
        """Flower's ``Grid.create_message``, on the wrapped grid."""
        return self.grid.create_message(content, message_type, dst_node_id, group_id, ttl)

    def get_node_ids(self) -> Iterable[int]:
        """Flower's ``Grid.get_node_ids``, on the wrapped grid."""
        return self.grid.get_node_ids()

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        """Flower's ``Grid.push_messages``, on the wrapped grid."""
        return self.grid.push_messages(messages)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        """Flower's ``Grid.pull_messages``, on the wrapped grid."""
        return self.grid.pull_messages(message_ids)

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> list[Message]:
        """Push ``messages``; return their replies as they arrive, until ``timeout`` (+ grace).

        Raises
        ------
        TimeoutError
            If no reply at all came in time (the caller's one instruction missed its deadline).
        """
        # One push at a time: the SuperLink asks each push for every object of its message
        # that is not yet *available* in its store, so concurrent pushes of a round's
        # instruction (the same hypotheses for every device) each uploaded all of it; in turn,
        # the second and later pushes upload their message's envelope only (1,824 object
        # requests in 12 rounds of 20 devices before, 331 after; docs/BENCHMARKS.md).
        with self._push_lock:
            ids = list(self.grid.push_messages(messages))
        futures: dict[str, Future[Message]] = {}
        with self._lock:
            for mid in ids:
                futures[mid] = self._waiting[mid] = Future()
            if self._poller is None:
                self._poller = threading.Thread(target=self._poll, name="gpfl-grid-poller",
                                                 daemon=True)
                self._poller.start()
        end = None if timeout is None else time.monotonic() + timeout + DEADLINE_GRACE
        replies: list[Message] = []
        try:
            for future in futures.values():
                left = None if end is None else max(0.0, end - time.monotonic())
                try:
                    replies.append(future.result(timeout=left))
                except FutureTimeout:
                    continue
        finally:
            with self._lock:
                for mid in ids:
                    self._waiting.pop(mid, None)
        if ids and not replies:
            raise TimeoutError(f"no reply within the round's deadline ({timeout} s)")
        return replies

    def _poll(self) -> None:
        """Pull every reply awaited, every ``interval`` seconds, while any is awaited."""
        failing = False
        while True:
            with self._lock:
                ids = list(self._waiting)
                if not ids:
                    self._poller = None
                    return
            try:
                replies = list(self.grid.pull_messages(ids))
                failing = False
            except Exception as err:  # a SuperLink restarting: the next pull tries again
                if not failing:  # once per outage, not every 0.1 s
                    logger.warning("pulling replies failed (%s); retrying every %g s", err,
                                   self.interval)
                failing = True
                replies = []
            with self._lock:
                for reply in replies:
                    future = self._waiting.pop(reply.metadata.reply_to_message_id, None)
                    if future is not None and not future.done():
                        future.set_result(reply)
            time.sleep(self.interval)
