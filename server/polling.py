"""Replies pulled every 0.1 s, not every 3 s: a grid whose ``send_and_receive`` waits less.

Flower's legacy round sends each sampled device its instruction through its client proxy
(``GridClientProxy``), which calls the grid's ``send_and_receive`` with one message. Flower's
gRPC/HTTP grid (``flwr.superlink.grid.http_grid``) pushes the message, then pulls its reply and
sleeps 3 s between pulls: a reply waits up to 3 s on the SuperLink before the ServerApp sees it,
on top of the SuperNode's own wait between polls for work (3 s in Flower; 0.5 s for a device run
by ``gpfl supernode``, :mod:`client.fleet_poll`). :class:`PollingGrid` does the same with
Flower's public Grid API (``push_messages``, ``pull_messages``) and one poller thread that pulls
every instruction in flight at once, every :data:`POLL_INTERVAL` seconds, so a round waits at
most one SuperNode poll plus 0.1 s, and the SuperLink gets one pull request per interval however
many devices a round has.

The round's deadline stays Flower's: the instruction's TTL is the round timeout, and the
SuperLink answers an instruction still unanswered at its TTL with a *Message Unavailable* error
when it is pulled. Flower's client proxy passes ``send_and_receive`` no ``timeout`` (only the
TTL), so the deadline is read from the instructions themselves (``created_at + ttl``, as the
SuperLink reads it; an explicit ``timeout`` can only shorten it). The poller pulls for
:data:`DEADLINE_GRACE` seconds past the deadline to receive the SuperLink's answer; if none
came, ``send_and_receive`` raises :class:`TimeoutError`, which
:func:`strategies.proxies.classify_failure` counts as a missed deadline, as the error would be.

The SuperLink hands a reply over as soon as its envelope is stored, before the device has
uploaded the reply's objects, and Flower's ``HttpGrid.pull_messages`` then pulls each reply's
objects in turn, retrying a missing one for up to two hours. One device dying mid-upload would
hold every reply of that pull (already confirmed, so never handed over again) past the round's
deadline. On Flower's HTTP grid the poller therefore asks the SuperLink for the envelopes
itself and pulls each reply's objects in a worker of its own, for no longer than that reply's
round deadline plus the grace: a stuck upload costs its own device's reply and nothing else.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, cast

from flwr.app import Message, Metadata, RecordDict
from flwr.app.error import Error
from flwr.app.message import make_message
from flwr.common.constant import ErrorCode
from flwr.proto.message_pb2 import ConfirmMessageReceivedRequest  # pylint: disable=E0611
from flwr.proto.runtime_pb2 import PullAppMessagesRequest  # pylint: disable=E0611
from flwr.serverapp.grid import Grid
from flwr.supercore.constant import PULL_MAX_TIME, SYSTEM_MESSAGE_TYPE
from flwr.supercore.inflatable.inflatable_object import iterate_object_tree
from flwr.supercore.inflatable.inflatable_protobuf_utils import make_pull_object_fn_protobuf
from flwr.supercore.inflatable.inflatable_utils import (
    ObjectPullError,
    inflate_object_from_contents,
    pull_objects,
)
from flwr.supercore.run import Run
from flwr.superlink.grid.http_grid import HttpGrid

logger = logging.getLogger(__name__)

__all__ = ["DEADLINE_GRACE", "POLL_INTERVAL", "UNAVAILABLE_REASON", "PollingGrid"]

#: Seconds between two pulls of the replies in flight.
POLL_INTERVAL = 0.1
#: Seconds pulled past a deadline, for the SuperLink's own answer to an expired instruction.
DEADLINE_GRACE = 1.0
#: Workers pulling replies' objects; a stuck one holds a worker until its deadline only.
REPLY_WORKERS = 16
#: Longest wait, in seconds, between two pulls of an object not uploaded yet.
RETRY_CAP = 0.25
#: The reason of the error reply standing in for a reply whose objects never all arrived
#: (Flower's own words for it).
UNAVAILABLE_REASON = "Reply message objects are unavailable"


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
        # Each instruction in flight: the future its reply resolves, and its deadline.
        self._waiting: dict[str, tuple[Future[Message], float | None]] = {}
        # Replies handed over whose objects a worker pulls: not asked for again, since the
        # SuperLink deleted their instruction and would answer "Message Unavailable".
        self._pulling: set[str] = set()
        self._poller: threading.Thread | None = None
        # Threads start with the first reply pulled (none on an in-memory grid).
        self._workers = ThreadPoolExecutor(REPLY_WORKERS, "gpfl-reply-pull")

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
        """Push ``messages``; return their replies as they arrive, until the deadline (+ grace).

        The deadline is the earliest instruction's TTL (its ``created_at + ttl``), or ``timeout``
        seconds from now if that comes first.

        Raises
        ------
        TimeoutError
            If no reply at all came in time (the caller's one instruction missed its deadline).
        """
        messages = list(messages)
        started = time.monotonic()
        end = _deadline(messages, timeout)
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
                futures[mid] = Future()
                self._waiting[mid] = (futures[mid], end)
            if self._poller is None:
                self._poller = threading.Thread(target=self._poll, name="gpfl-grid-poller",
                                                 daemon=True)
                self._poller.start()
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
                    self._pulling.discard(mid)
        if ids and not replies:
            raise TimeoutError(f"no reply within the round's deadline (waited "
                               f"{time.monotonic() - started:.1f} s)")
        return replies

    def _poll(self) -> None:
        """Pull every reply awaited, every ``interval`` seconds, while any is awaited."""
        failing = False
        while True:
            with self._lock:
                if not self._waiting:
                    self._poller = None
                    return
                ids = [mid for mid in self._waiting if mid not in self._pulling]
            try:
                if ids and isinstance(self.grid, HttpGrid):
                    self._pull_envelopes(self.grid, ids)
                elif ids:
                    self._resolve(list(self.grid.pull_messages(ids)))
                failing = False
            except Exception as err:  # a SuperLink restarting: the next pull tries again
                if not failing:  # once per outage, not every 0.1 s
                    logger.warning("pulling replies failed (%s); retrying every %g s", err,
                                   self.interval)
                failing = True
            time.sleep(self.interval)

    def _resolve(self, replies: list[Message]) -> None:
        """Hand each reply to the ``send_and_receive`` waiting for it."""
        with self._lock:
            for reply in replies:
                self._pulling.discard(reply.metadata.reply_to_message_id)
                waiting = self._waiting.pop(reply.metadata.reply_to_message_id, None)
                if waiting is not None and not waiting[0].done():
                    waiting[0].set_result(reply)

    def _pull_envelopes(self, grid: HttpGrid, ids: list[str]) -> None:
        """Ask the SuperLink for the replies stored so far; pull each one's objects apart.

        Flower's ``HttpGrid.pull_messages`` in two steps (see the module notes): its Runtime
        API client is private to the grid, and is what its ``pull_messages`` uses.
        """
        client: Any = grid._runtime_client  # the grid's own connection
        res = client.PullMessages(PullAppMessagesRequest(message_ids=ids))
        for proto, tree in zip(res.messages_list, res.message_object_trees, strict=True):
            reply_to = proto.metadata.reply_to_message_id
            with self._lock:
                waiting = self._waiting.get(reply_to)
                if waiting is None:  # its round is over: nobody to give it to
                    continue
                self._pulling.add(reply_to)
            self._workers.submit(self._pull_reply, grid, client, proto.metadata.message_id,
                                 reply_to, tree, waiting[1])

    def _pull_reply(self, grid: HttpGrid, client: Any, msg_id: str, reply_to: str,
                    tree: Any, end: float | None) -> None:
        """Pull one reply's objects until ``end`` at the latest; resolve its waiter."""
        run_id = grid.run.run_id
        # Retry a missing object every 0.1-0.25 s (Flower: 1 s doubling to 10 s), so a reply
        # still uploading is seen soon after it lands, and the last retry falls before ``end``.
        left = PULL_MAX_TIME if end is None else max(self.interval,
                                                     end - time.monotonic() - 2 * RETRY_CAP)
        try:
            contents = pull_objects(
                object_ids=[node.object_id for node in iterate_object_tree(tree)],
                pull_object_fn=make_pull_object_fn_protobuf(
                    pull_object_protobuf=client.PullObject, node=grid.node, run_id=run_id),
                max_time=left, initial_backoff=self.interval, backoff_cap=RETRY_CAP,
            )
        except ObjectPullError as err:
            logger.warning("reply to %s: its objects did not all arrive (%s)", reply_to, err)
            self._resolve([make_message(
                metadata=Metadata(run_id=run_id, message_id="", src_node_id=grid.node.node_id,
                                  dst_node_id=grid.node.node_id,
                                  message_type=SYSTEM_MESSAGE_TYPE, group_id="", ttl=0,
                                  reply_to_message_id=reply_to, created_at=time.time()),
                error=Error(code=ErrorCode.MESSAGE_UNAVAILABLE,
                            reason=f"{UNAVAILABLE_REASON}: {err}"),
            )])
            return
        except Exception as err:  # the SuperLink gone mid-pull: the deadline decides
            logger.warning("reply to %s: pulling its objects failed (%s)", reply_to, err)
            return
        client.ConfirmMessageReceived(ConfirmMessageReceivedRequest(
            node=grid.node, run_id=run_id, message_object_id=msg_id))
        message = cast(Message, inflate_object_from_contents(msg_id, contents))
        message.metadata.__dict__["_message_id"] = msg_id  # as Flower's pull_messages does
        self._resolve([message])


def _deadline(messages: list[Message], timeout: float | None) -> float | None:
    """Return the monotonic time until which replies to ``messages`` are awaited (None: ever).

    The SuperLink expires an instruction at its ``created_at + ttl`` (wall-clock seconds); the
    replies are awaited :data:`DEADLINE_GRACE` seconds past the earliest such time, or past
    ``timeout`` seconds from now if that is earlier.
    """
    now, wall = time.monotonic(), time.time()
    left = [m.metadata.created_at + m.metadata.ttl - wall for m in messages]
    if timeout is not None:
        left.append(timeout)
    return now + max(0.0, min(left)) + DEADLINE_GRACE if left else None
