"""Which devices a round asks: wait for the federation to form, then sample uniformly.

The draw is keyed on the seed, the round and each device's key
(:class:`strategies.device_keys.DeviceKeys`: its node id, or the name it announced), so a fixed
seed gives the same devices whatever order they connected in and whatever else the strategy
drew; Flower's ``random``-based ``ClientManager.sample`` is never used. Without keys (unit
tests of the waiting), one ``rng.choice`` over the sorted node ids draws it.

Every device asked charges its ledger before it answers, so a round the server can tell in
advance it would discard is not started. A dead device stays registered at the SuperLink for
about a minute after it died, and a frozen one forever, so "connected" is not "alive":

Quorum
    Only *responsive* devices count towards ``min-replies``: those that answered (a reply, a
    decline or an error) every round they were asked in since they last answered, i.e. whose
    :attr:`~strategies.records.ClientRecord.missed_in_a_row` is 0 (a new node has no record and
    counts). Short of the quorum, the round waits up to ``round_timeout`` for new devices (a
    restarted device registers under a new node id), then the run stops, resumable, rather than
    charge the live devices for a round that cannot change the hypotheses.
Back-off
    A device that missed its last s rounds in a row rests 2^s − 1 rounds (at most
    :data:`MAX_REST`) before it is asked again: a dead or frozen device costs the round's
    deadline O(log rounds) times instead of every time it is drawn, and is asked again (and
    counted again once it answers) if it comes back.
A round lost on the server's side
    When no connected device counts towards the quorum and every one of them missed exactly
    one round, the same round (:func:`lost_together`), that round was lost on the server's
    side, not by the devices: a SuperLink restarted on its database after every asked device's
    instruction was lost with it (Flower marks an instruction delivered when a device's pull
    reaches the SuperLink, so a pull the crash cut off loses it), or a network outage at the
    server longer than the round. They are asked again at once, as if they had answered,
    instead of the run stopping. This is forgiven once: a device that misses again is back
    under the rules above.
A device asked whether it is alive
    When the quorum is short otherwise, each connected device that missed only its last round
    (one miss in a row: its instruction lost with a SuperLink restart, or its reply a moment
    late) is asked its properties (:func:`strategies.device_keys.ask_properties`: Flower's
    ``get_properties``, which a gpfl client answers with its name, reading no data and
    charging nothing), all at once within the round's deadline. One that answers counts as
    responsive for this round and is not rested; one that does not (a dead device still
    registered) stays out, and short of the quorum the run stops as before. A device that
    misses again is back under the rules above.
"""

from __future__ import annotations

import logging
import math
import numbers
import time
from collections.abc import Callable, Collection, Iterable, Mapping

import numpy as np
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy

from strategies.device_keys import DeviceKeys, ask_properties
from strategies.records import ClientRecord
from strategies.replies import NameBook

__all__ = ["FORMING_GRACE_S", "MAX_REST", "check_int", "check_sampling", "lost_together",
           "missed_once", "responsive", "rests", "sample_devices"]

_LOG = logging.getLogger(__name__)

#: How long the first round waits for ``clients_per_round`` devices (beyond ``min_replies``):
#: devices started together register within seconds, and a federation smaller than
#: ``clients_per_round`` should not wait a whole round timeout to find that out.
FORMING_GRACE_S = 15.0
#: The most rounds a silent device rests before it is asked again.
MAX_REST = 31
#: Seconds between two looks at the federation while waiting for the quorum.
_QUORUM_POLL_S = 2


def rests(record: ClientRecord | None, server_round: int) -> bool:
    """Whether a device sits ``server_round`` out: 2^s − 1 rounds after s misses in a row."""
    if record is None or record.missed_in_a_row == 0:
        return False
    rest = min(2 ** min(record.missed_in_a_row, 16) - 1, MAX_REST)
    return server_round - record.last_missed <= rest


def responsive(cids: Iterable[str], records: Mapping[str, ClientRecord]) -> list[str]:
    """Return the node ids that count towards the quorum.

    Those among ``cids`` that answered every round they were asked in since their last answer
    (new nodes included).
    """
    return [cid for cid in cids if cid not in records or records[cid].missed_in_a_row == 0]


def missed_once(cids: Iterable[str], records: Mapping[str, ClientRecord]) -> list[str]:
    """Return those of ``cids`` whose record shows exactly one miss since they last answered."""
    return [cid for cid in cids if cid in records and records[cid].missed_in_a_row == 1]


def lost_together(cids: Collection[str], records: Mapping[str, ClientRecord]) -> int | None:
    """Return the round every one of ``cids`` missed as their only miss in a row, if there is one.

    None unless ``cids`` is not empty, each missed exactly one round since it last answered
    (:func:`missed_once`), and that round is the same for all of them.
    """
    once = missed_once(cids, records)
    rounds = {records[cid].last_missed for cid in once}
    return rounds.pop() if cids and len(once) == len(cids) and len(rounds) == 1 else None


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
    records: Mapping[str, ClientRecord] | None = None,
    keys: DeviceKeys | None = None,
    excluded: Collection[str] = (),
    names: NameBook | None = None,
) -> tuple[dict[str, ClientProxy], list[str]]:
    """Wait for enough connected devices, then sample up to ``clients_per_round`` of them.

    Parameters
    ----------
    client_manager : ClientManager
        Flower's view of the connected devices.
    rng : np.random.Generator
        Draws the sample when no ``keys`` are given: one ``rng.choice`` call, and none when too
        few devices are connected.
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
    records : mapping of str to ClientRecord, optional
        What the strategy knows of each node: the quorum counts only responsive devices and
        resting ones are not sampled (see the module notes).
    keys : DeviceKeys, optional
        Draws the sample by the devices' keys (``rng`` is then not used); None: ``rng``.
    excluded : collection of str
        Nodes never asked and not counted towards the quorum: the old registration of a
        restarted device (its name moved to a newer node), and devices set aside by the
        persistence test (:mod:`strategies.persistence`).
    names : NameBook, optional
        The run's name bindings: with ``keys`` keyed by identity ``"key"``, nodes that claim
        another node's name are left out like ``excluded`` ones (:meth:`DeviceKeys.refused`),
        checked each time the connected set is read, so a node joining while the round waits
        is checked too.

    Returns
    -------
    available : dict of str to ClientProxy
        The devices connected after waiting, by node id.
    chosen : list of str
        The sampled node ids (without replacement, in the order drawn); empty if fewer than
        ``min_replies`` connected devices are responsive.
    """
    t = server_round
    _wait_for_devices(client_manager, t, clients_per_round, min_replies, round_timeout, forming)
    stale = set(excluded)

    def current() -> dict[str, ClientProxy]:
        now = {cid: p for cid, p in client_manager.all().items() if cid not in stale}
        if keys is not None and names is not None:
            # Before the draw: a node that could not count is never asked to charge.
            refused = keys.refused(now, names, t)
            now = {cid: p for cid, p in now.items() if cid not in refused}
        return now

    available = current()
    records = _forgive_a_round_lost_together(available, dict(records or {}), t)
    deadline = time.monotonic() + round_timeout
    counted = (_count_the_alive(available, records, min_replies, round_timeout, t)
               if len(responsive(available, records)) < min_replies else None)
    if counted is not None:
        records = counted
        available = current()  # a device restarted meanwhile registered as a new node
    available, alive = _wait_for_quorum(client_manager, current, available, records,
                                        min_replies, deadline, t)
    if len(alive) < min_replies:
        return available, []
    return available, _draw(available, records, clients_per_round, t, rng, keys)


def _wait_for_devices(client_manager: ClientManager, t: int, clients_per_round: int,
                      min_replies: int, round_timeout: float, forming: bool) -> None:
    """Wait for a forming federation's devices, then for ``min_replies`` of them to connect."""
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


def _forgive_a_round_lost_together(available: Mapping[str, ClientProxy],
                                   records: dict[str, ClientRecord],
                                   t: int) -> dict[str, ClientRecord]:
    """Return ``records`` without the connected devices' if they all lost one round together.

    Their miss was the server's side (see the module notes): they are asked again at once.
    """
    if responsive(available, records):
        return records
    lost = lost_together(available, records)
    if lost is None:
        return records
    _LOG.warning("round %d: all %d connected devices missed round %d and no other: taken as "
                 "a round lost on the server's side; asking them again", t, len(available),
                 lost)
    return {cid: r for cid, r in records.items() if cid not in available}


def _count_the_alive(available: Mapping[str, ClientProxy], records: dict[str, ClientRecord],
                     min_replies: int, round_timeout: float, t: int
                     ) -> dict[str, ClientRecord] | None:
    """Ask the devices that missed only their last round whether they are alive.

    Returns ``records`` without those that answered (they count towards this round's quorum),
    or None when no device missed only its last round (nobody was asked). Nothing is charged
    (Flower's ``get_properties``).
    """
    once = missed_once(available, records)
    if not once:
        return None
    alive = responsive(available, records)
    _LOG.warning("round %d: %d of %d connected devices answered their last round, fewer than "
                 "min-replies=%d; asking the %d that missed only their last round whether "
                 "they are alive (nothing is charged)", t, len(alive), len(available),
                 min_replies, len(once))
    answered = ask_properties({cid: available[cid] for cid in once}, round_timeout, t)
    _LOG.warning("round %d: %d of %d answered; they count this round", t, len(answered),
                 len(once))
    return {cid: r for cid, r in records.items() if cid not in answered}


def _wait_for_quorum(
    client_manager: ClientManager, current: Callable[[], dict[str, ClientProxy]],
    available: dict[str, ClientProxy], records: Mapping[str, ClientRecord], min_replies: int,
    deadline: float, t: int,
) -> tuple[dict[str, ClientProxy], list[str]]:
    """Wait until ``deadline`` for ``min_replies`` responsive devices; return them and all.

    Returns the connected devices and the responsive ones among them, as they are when the
    quorum is met or the deadline passes. Only new nodes (a restarted device) raise the count.
    """
    alive = responsive(available, records)
    if len(available) >= min_replies and len(alive) < min_replies:
        _LOG.warning("round %d: %d devices connected, %d of them answered their last round; "
                     "waiting up to %g s for min-replies=%d before asking anyone", t,
                     len(available), len(alive), max(0.0, deadline - time.monotonic()),
                     min_replies)
        while len(alive) < min_replies and time.monotonic() < deadline:
            client_manager.wait_for(client_manager.num_available() + min_replies - len(alive),
                                    timeout=_QUORUM_POLL_S)
            available = current()
            alive = responsive(available, records)
    return available, alive


def _draw(available: Mapping[str, ClientProxy], records: Mapping[str, ClientRecord],
          clients_per_round: int, t: int, rng: np.random.Generator,
          keys: DeviceKeys | None) -> list[str]:
    """Draw up to ``clients_per_round`` of the connected devices that are not resting."""
    cids = sorted(available)
    resting = [cid for cid in cids if rests(records.get(cid), t)]
    if resting:
        _LOG.info("round %d: not asking %s: silent in their last rounds (back-off)", t,
                  ", ".join(records[c].name or f"node {c}" for c in resting))
        cids = [cid for cid in cids if cid not in set(resting)]
    size = min(clients_per_round, len(cids))
    if size < clients_per_round:
        _LOG.info("round %d: sampling %d devices, fewer than clients-per-round=%d: only %d "
                  "are connected and not resting", t, size, clients_per_round, len(cids))
    if keys is not None:
        # Every connected device gets its key (duplicate names are told apart among all of
        # them); the resting ones are then left out of the draw.
        keyed = keys.keys(available, t)
        return keys.draw({cid: keyed[cid] for cid in cids}, t, size)
    return [cids[i] for i in rng.choice(len(cids), size=size, replace=False)]
