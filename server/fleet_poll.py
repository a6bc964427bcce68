"""Flower's SuperNode (``flower-supernode``) polling the SuperLink more often than every 3 s.

Flower 1.39's SuperNode loop (``flwr.supernode.start_client_internal``) asks the SuperLink for a
message and, when none is waiting, sleeps a hard-coded 3 s before it asks again; no flag or
variable sets that period. A round's instruction therefore waits up to 3 s at every device, and
since a device asks again exactly 3 s after its last reply, nearly the whole period in every
round: most of a round of a few devices (2 devices: 3.9 s a round at 3 s, 1.7 s at 0.5 s). At
20 devices on 2 cores the SuperLink's own work sets the pace instead (docs/BENCHMARKS.md).

``python -m server.fleet_poll --fleet-poll-interval S [flower-supernode options]`` runs Flower's
own ``flower-supernode`` entry point unchanged, except that no sleep in that module lasts longer
than ``S`` seconds: the idle poll of the SuperLink, and the 0.5 s waits for a reply in the
SuperNode's own memory (which cost nothing to shorten). Only the module's ``time`` name is
replaced; if Flower's module no longer has it (another Flower version), the SuperNode runs with
Flower's own periods and a warning says so.

What a curious server learns from it: nothing it does not see anyway (each poll is a request
the SuperLink serves; a device polls more often, as any Flower SuperNode with a message waiting
does). What it costs: ``1 / S`` requests a second from each idle device to the SuperLink.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Sequence
from types import ModuleType
from typing import Any

__all__ = ["DEFAULT_INTERVAL", "FLAG", "MAX_INTERVAL", "MIN_INTERVAL", "IdleClock", "main",
           "patch"]

logger = logging.getLogger(__name__)

#: Seconds between an idle SuperNode's polls of the SuperLink (Flower's own: 3), the default of
#: ``gpfl supernode --fleet-poll-interval``.
DEFAULT_INTERVAL = 0.5
#: The shortest interval accepted: shorter would only load the SuperLink (a round's messages
#: are tens of milliseconds apart at best).
MIN_INTERVAL = 0.05
#: The longest: Flower's own period.
MAX_INTERVAL = 3.0
#: The option that carries the interval; everything after it is flower-supernode's.
FLAG = "--fleet-poll-interval"


class IdleClock:
    """The ``time`` module, except that ``sleep`` sleeps at most ``interval`` seconds."""

    def __init__(self, interval: float) -> None:
        if not MIN_INTERVAL <= interval <= MAX_INTERVAL:
            raise ValueError(f"{FLAG} must be in [{MIN_INTERVAL}, {MAX_INTERVAL:g}] seconds, "
                             f"got {FLAG}={interval!r}")
        self.interval = interval

    def sleep(self, seconds: float) -> None:
        """Sleep ``min(seconds, interval)``."""
        time.sleep(min(seconds, self.interval))

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def patch(module: ModuleType, interval: float) -> bool:
    """Replace ``module.time`` by an :class:`IdleClock`; False (nothing changed) if it has none."""
    if getattr(module, "time", None) is not time:
        return False
    module.time = IdleClock(interval)  # type: ignore[attr-defined]
    return True


def main(argv: Sequence[str] | None = None) -> None:
    """Run ``flower-supernode`` with the rest of ``argv`` and a shorter idle poll."""
    args = list(sys.argv[1:] if argv is None else argv)
    interval = DEFAULT_INTERVAL
    if args[:1] == [FLAG]:
        try:
            interval = float(args[1])
        except (IndexError, ValueError):
            sys.exit(f"{FLAG} needs a number of seconds, got {args[1:2]}")
        args = args[2:]
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
    sys.argv = ["flower-supernode", *args]
    flower_supernode()


if __name__ == "__main__":  # pragma: no cover - the process entry point
    main()
