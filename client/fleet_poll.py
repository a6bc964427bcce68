"""Flower's SuperNode (``flower-supernode``) polling the SuperLink more often than every 3 s.

Flower 1.39's SuperNode loop (``flwr.supernode.start_client_internal``) asks the SuperLink for a
message and, when none is waiting, sleeps a hard-coded 3 s before it asks again; no flag or
variable sets that period. A round's instruction therefore waits up to 3 s at every device, and
since a device asks again exactly 3 s after its last reply, nearly the whole period in every
round: most of a round of a few devices (2 devices: 3.9 s a round at 3 s, 1.7 s at 0.5 s). At
20 devices on 2 cores the SuperLink's own work sets the pace instead (docs/BENCHMARKS.md).

``python -m client.fleet_poll --fleet-poll-interval S [--task-notify-fd FD] [flower-supernode
options]`` runs Flower's own ``flower-supernode`` entry point unchanged, except for two things:

* **Its sleeps.** The idle poll of the SuperLink (Flower's 3 s) lasts at most ``S`` seconds; the
  0.5 s waits in the SuperNode's own memory (for the executor's reply to a message, for an
  object of it) at most :data:`LOCAL_WAIT` (they only look at the SuperNode's own state, so a
  short wait costs nothing; at 0.5 s the last device's reply waited ~0.5 s in every round).
  Only the module's ``time`` name is replaced.
* **A wake-up for the executor.** With ``--task-notify-fd``, each message the SuperNode has
  pulled and stored (its task ready for ``AcquireTask``) writes one byte to that file
  descriptor, a pipe whose other end the device's executor waits on (:mod:`client.supernode`
  makes it): the executor asks for the task at once instead of at its next idle poll (1 s).
  The write never blocks (a full pipe already says "look").

If Flower's module no longer has these names (another Flower version), the SuperNode runs with
Flower's own periods, or the executor with its idle poll only, and a warning says so.

What a curious server learns from it: nothing it does not see anyway (each poll is a request
the SuperLink serves; a device polls more often, as any Flower SuperNode with a message waiting
does); the wake-up stays inside the device. What it costs: ``1 / S`` requests a second from
each idle device to the SuperLink.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

__all__ = ["DEFAULT_INTERVAL", "FLAG", "LOCAL_WAIT", "MAX_INTERVAL", "MIN_INTERVAL", "NOTIFY_FLAG",
           "IdleClock", "main", "notify_after", "patch", "patch_notify"]

logger = logging.getLogger(__name__)

#: Seconds between an idle SuperNode's polls of the SuperLink (Flower's own: 3), the default of
#: ``gpfl supernode --fleet-poll-interval``.
DEFAULT_INTERVAL = 0.5
#: The shortest interval accepted: shorter would only load the SuperLink (a round's messages
#: are tens of milliseconds apart at best).
MIN_INTERVAL = 0.05
#: The longest: Flower's own period.
MAX_INTERVAL = 3.0
#: The longest wait in the SuperNode's own memory (Flower's: 0.5 s).
LOCAL_WAIT = 0.02
#: Flower's sleeps shorter than this are waits in memory; the idle poll of the SuperLink is 3 s.
_IDLE_POLL_FROM = 1.0
#: The option that carries the interval, and the one that carries the executor's pipe; everything
#: after them is flower-supernode's.
FLAG = "--fleet-poll-interval"
NOTIFY_FLAG = "--task-notify-fd"


class IdleClock:
    """The ``time`` module, except for ``sleep``.

    A sleep of a second or more (Flower's idle poll of the SuperLink) lasts at most
    ``interval`` seconds; a shorter one (a wait in the SuperNode's memory) at most
    :data:`LOCAL_WAIT`.
    """

    def __init__(self, interval: float) -> None:
        if not MIN_INTERVAL <= interval <= MAX_INTERVAL:
            raise ValueError(f"{FLAG} must be in [{MIN_INTERVAL}, {MAX_INTERVAL:g}] seconds, "
                             f"got {FLAG}={interval!r}")
        self.interval = interval

    def sleep(self, seconds: float) -> None:
        """Sleep ``min(seconds, interval)``, or ``min(seconds, LOCAL_WAIT)`` below a second."""
        cap = self.interval if seconds >= _IDLE_POLL_FROM else LOCAL_WAIT
        time.sleep(min(seconds, cap))

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def patch(module: ModuleType, interval: float) -> bool:
    """Replace ``module.time`` by an :class:`IdleClock`; False (nothing changed) if it has none."""
    if getattr(module, "time", None) is not time:
        return False
    module.time = IdleClock(interval)  # type: ignore[attr-defined]
    return True


def notify_after(pull: Callable[..., Any], fd: int) -> Callable[..., Any]:
    """Wrap Flower's ``_pull_and_store_message``: one byte to ``fd`` after each stored message.

    Flower's function returns the run id of a message it stored (its task created), else None.
    """
    @functools.wraps(pull)
    def pull_and_notify(*args: Any, **kwargs: Any) -> Any:
        run_id = pull(*args, **kwargs)
        if run_id is not None:
            try:
                os.write(fd, b"\x01")
            except (BlockingIOError, BrokenPipeError):
                pass  # full: the executor has a byte waiting already; closed: it polls anyway
        return run_id

    return pull_and_notify


def patch_notify(module: ModuleType, fd: int) -> bool:
    """Make ``module._pull_and_store_message`` write to ``fd``; False if it has none."""
    pull = getattr(module, "_pull_and_store_message", None)
    if not callable(pull):
        return False
    os.set_blocking(fd, False)
    module._pull_and_store_message = notify_after(pull, fd)  # type: ignore[attr-defined]
    return True


def _parse(args: list[str]) -> tuple[float, int | None, list[str]]:
    """Split gpfl's leading options off ``args``: (interval, notify fd or None, the rest)."""
    interval, fd = DEFAULT_INTERVAL, None
    while args[:1] in ([FLAG], [NOTIFY_FLAG]):
        flag = args[0]
        try:
            value = float(args[1]) if flag == FLAG else int(args[1])
        except (IndexError, ValueError):
            sys.exit(f"{flag} needs a {'number of seconds' if flag == FLAG else 'file descriptor'}"
                     f", got {args[1:2]}")
        if flag == FLAG:
            interval = float(value)
        else:
            fd = int(value)
        args = args[2:]
    return interval, fd, args


def main(argv: Sequence[str] | None = None) -> None:
    """Run ``flower-supernode`` with the rest of ``argv``, a shorter idle poll and the wake-up."""
    interval, fd, args = _parse(list(sys.argv[1:] if argv is None else argv))
    try:
        clock = IdleClock(interval)  # validates before Flower starts
    except ValueError as err:
        sys.exit(str(err))
    from flwr.supernode import start_client_internal
    from flwr.supernode.cli import flower_supernode

    if not patch(start_client_internal, clock.interval):
        logging.basicConfig()
        logger.warning("flwr.supernode.start_client_internal has no `time` to replace: this "
                       "SuperNode polls the SuperLink with Flower's own period")
    if fd is not None and not patch_notify(start_client_internal, fd):
        logging.basicConfig()
        logger.warning("flwr.supernode.start_client_internal has no `_pull_and_store_message`: "
                       "the executor finds each task at its next idle poll")
    sys.argv = ["flower-supernode", *args]
    flower_supernode()


if __name__ == "__main__":  # pragma: no cover - the process entry point
    main()
