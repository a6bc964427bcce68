"""Which devices a round asks: wait for the federation to form, then sample uniformly.

Sampling uses the strategy's own rng over the connected node ids in sorted order, so a fixed
seed gives the same devices whatever order they connected in, and Flower's ``random``-based
``ClientManager.sample`` is never used.
"""

from __future__ import annotations

import logging
import math
import numbers

import numpy as np
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy

__all__ = ["FORMING_GRACE_S", "check_int", "check_sampling", "sample_devices"]

_LOG = logging.getLogger(__name__)

#: How long the first round waits for ``clients_per_round`` devices (beyond ``min_replies``):
#: devices started together register within seconds, and a federation smaller than
#: ``clients_per_round`` should not wait a whole round timeout to find that out.
FORMING_GRACE_S = 15.0


def check_int(name: str, value: object, *, minimum: int) -> int:
    """Return ``value`` as an int if it is an integer >= ``minimum``, else raise ValueError."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {name}={value!r}")
    return int(value)


def check_sampling(
    clients_per_round: object, min_replies: object, round_timeout: object
) -> tuple[int, int, float]:
    """Return the arguments of :func:`sample_devices` checked (as int, int, float).

    Raises
    ------
    ValueError
        If ``clients_per_round`` or ``min_replies`` is not an integer >= 1, or
        ``round_timeout`` not a positive finite number (the message names it).
    """
    clients_per_round = check_int("clients_per_round", clients_per_round, minimum=1)
    min_replies = check_int("min_replies", min_replies, minimum=1)
    if isinstance(round_timeout, bool) or not isinstance(round_timeout, int | float) or not (
        math.isfinite(round_timeout) and round_timeout > 0
    ):
        raise ValueError(
            f"round_timeout must be a positive number of seconds, got "
            f"round_timeout={round_timeout!r}"
        )
    return clients_per_round, min_replies, float(round_timeout)


def sample_devices(
    client_manager: ClientManager,
    rng: np.random.Generator,
    *,
    server_round: int,
    clients_per_round: int,
    min_replies: int,
    round_timeout: float,
    forming: bool,
) -> tuple[dict[str, ClientProxy], list[str]]:
    """Wait for enough connected devices, then sample up to ``clients_per_round`` of them.

    Parameters
    ----------
    client_manager : ClientManager
        Flower's view of the connected devices.
    rng : np.random.Generator
        Draws the sample: one ``rng.choice`` call, and none when too few devices are connected.
    server_round : int
        The run's round, for log lines.
    clients_per_round : int
        U, the devices wanted.
    min_replies : int
        The fewest connected devices a round can start with.
    round_timeout : float
        The most seconds to wait for ``min_replies`` devices.
    forming : bool
        Whether the federation may still be forming (the first round of this process): then
        wait first up to ``min(round_timeout, FORMING_GRACE_S)`` for ``clients_per_round``.

    Returns
    -------
    available : dict of str to ClientProxy
        The devices connected after waiting, by node id.
    chosen : list of str
        The sampled node ids (without replacement, in the order drawn); empty if fewer than
        ``min_replies`` are connected.
    """
    t = server_round
    connected = client_manager.num_available()
    if forming and connected < clients_per_round:
        grace = min(round_timeout, FORMING_GRACE_S)
        _LOG.info("round %d: %d devices connected; waiting up to %g s for "
                  "clients-per-round=%d", t, connected, grace, clients_per_round)
        client_manager.wait_for(clients_per_round, timeout=math.ceil(grace))
        connected = client_manager.num_available()
    if connected < min_replies:
        _LOG.info("round %d: %d devices connected; waiting up to %g s for min-replies=%d",
                  t, connected, round_timeout, min_replies)
        client_manager.wait_for(min_replies, timeout=math.ceil(round_timeout))
    available = client_manager.all()
    cids = sorted(available)
    if len(cids) < min_replies:
        return available, []
    size = min(clients_per_round, len(cids))
    if size < clients_per_round:
        _LOG.info("round %d: sampling %d devices, fewer than clients-per-round=%d: only %d "
                  "are connected", t, size, clients_per_round, len(cids))
    return available, [cids[i] for i in rng.choice(len(cids), size=size, replace=False)]
