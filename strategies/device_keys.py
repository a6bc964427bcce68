"""Each round's draw of devices, keyed on the seed, the round and something stable per device.

A round asks the ``clients_per_round`` devices whose *priority* is lowest, the priority of a
device being a uniform number hashed from ``(seed, round, key)``: a uniform sample without
replacement ("bottom-k" sampling), which depends on nothing else. Two runs at one seed that
differ only in ν, k or aggregation therefore ask the same devices every round as long as their
devices have the same keys, whatever the strategy's other randomness did (k-means, initial
hypotheses), and a device that leaves or rests changes no one else's draw.

The key is

``"node"`` (``sample-by = "node"``, the default)
    the node id: the SuperLink assigns it, at random, so no device can choose its own chances;
    but it differs between runs (the Simulation Engine draws new ids each run), so runs at one
    seed ask different devices.
``"name"`` (``sample-by = "name"``)
    the ``client-name`` each device announces when the server asks its properties (once per
    node, before the node is first drawn): stable across runs (a simulated device is
    ``client-<partition-id>``), so runs at one seed ask the same devices and, the devices'
    data and training being keyed on their partition, give them the same data. A device picks
    its own name and the seed is in the run config, so a device could search for a name drawn
    more often than its share: use it where the server trusts the devices' names (its own
    devices, a simulation). A node that does not answer, answers no valid name, or announces a
    name another node announced too is keyed by its node id; the nodes are asked at once, so a
    silent one delays the round it joins by the query's timeout (the round timeout), once.

With ``node-identity = "key"`` (SuperNode authentication, :mod:`strategies.identity`) every new
node is asked its name this way, whatever keys the draw, so that a node claiming a name that is
another node's is left out before it is asked to train (:meth:`DeviceKeys.refused`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from flwr.common import GetPropertiesIns, GetPropertiesRes
from flwr.server.client_proxy import ClientProxy

from settings import SAMPLE_BY
from strategies.identity import NODE_IDENTITY, refused_claims
from strategies.replies import MAX_NAME, NAME_PATTERN, NameBook

__all__ = ["SAMPLE_BY", "DeviceKeys", "ask_properties", "draw_priority", "lowest_priorities",
           "seed_of"]

_LOG = logging.getLogger(__name__)

#: The most seconds the properties query waits for a node's name.
NAME_QUERY_TIMEOUT_S = 30.0


def draw_priority(seed: int, server_round: int, key: str) -> float:
    """Return the uniform number in [0, 1) that ranks device ``key`` in round ``server_round``.

    The first 64 bits of SHA-256 over the three, as a fraction of 2^64: the same on every
    platform and Python version (unlike ``hash``), and independent between keys and rounds.
    """
    digest = hashlib.sha256(f"{int(seed)}|{int(server_round)}|{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def seed_of(rng: np.random.Generator) -> int:
    """Return a draw seed derived from ``rng``'s state without drawing from it.

    A strategy given a seeded rng and no `DeviceKeys` samples reproducibly, and every other use
    of its rng (k-means, the probability aggregation's ω) sees the same numbers as if the draw
    had no seed of its own.
    """
    state = json.dumps(rng.bit_generator.state, sort_keys=True, default=str)
    return int.from_bytes(hashlib.sha256(state.encode()).digest()[:8], "big") >> 1


def lowest_priorities(keys: Mapping[str, str], seed: int, server_round: int,
                      size: int) -> list[str]:
    """Return the ``size`` node ids whose keys have the lowest priorities, lowest first.

    Ties (two nodes with one key cannot occur: duplicates are keyed by node id) are broken by
    the node id, so the result never depends on the mapping's order.
    """
    ranked = sorted(keys, key=lambda cid: (draw_priority(seed, server_round, keys[cid]), cid))
    return ranked[:size]


class DeviceKeys:
    """What keys each device in the draw: its node id, or the name it announced.

    Parameters
    ----------
    seed : int or None
        The run's seed; None draws a secret one (the draw is then not reproducible).
    by : str
        ``"node"`` or ``"name"`` (see the module notes).
    timeout : float
        The most seconds a properties query waits (``"name"`` or ``identity="key"`` only).
    identity : str
        ``node-identity``: ``"name"`` or ``"key"`` (:mod:`strategies.identity`).
    """

    def __init__(self, seed: int | None = None, by: str = "node",
                 timeout: float = NAME_QUERY_TIMEOUT_S, identity: str = "name") -> None:
        if by not in SAMPLE_BY:
            raise ValueError(f"sample-by must be one of {', '.join(SAMPLE_BY)}, got "
                             f"sample-by={by!r}")
        if identity not in NODE_IDENTITY:
            raise ValueError(f"node-identity must be one of {', '.join(NODE_IDENTITY)}, got "
                             f"node-identity={identity!r}")
        self.identity = identity
        #: Nodes already named in a log line as refused (each is named once, not every round).
        self._told: set[str] = set()
        self.seed = int(seed) if seed is not None else secrets.randbits(63)
        self.by = by
        self.timeout = float(timeout)
        #: node id -> the name it announced ("" when it announced none).
        self.announced: dict[str, str] = {}
        #: node id -> its key in the last draw.
        self.current: dict[str, str] = {}

    def keys(self, available: Mapping[str, ClientProxy], server_round: int) -> dict[str, str]:
        """Return each available node's key: ``name:<client-name>`` or ``node:<node id>``."""
        if self.by == "name":
            self._ask([cid for cid in available if cid not in self.announced], available,
                      server_round)
        names = {cid: self.announced.get(cid, "") for cid in available}
        counts: dict[str, int] = {}
        for name in names.values():
            counts[name] = counts.get(name, 0) + 1
        self.current = {cid: f"name:{name}" if name and counts[name] == 1 else f"node:{cid}"
                        for cid, name in names.items()}
        return dict(self.current)

    def refused(self, available: Mapping[str, ClientProxy], names: NameBook,
                server_round: int) -> dict[str, str]:
        """Return the connected nodes not to ask this round, with why (empty unless by key).

        Under ``node-identity = "key"`` each node not asked yet is asked its name first
        (:meth:`_ask`); a node claiming a name that belongs to another node (another key) is
        refused (:func:`strategies.identity.refused_claims`), named once in the log.
        """
        if self.identity != "key":
            return {}
        self._ask([cid for cid in available if cid not in self.announced], available,
                  server_round)
        refused = refused_claims({cid: self.announced.get(cid, "") for cid in available},
                                 names)
        for cid in sorted(set(refused) - self._told):
            _LOG.warning("round %d: node %s is not asked: it %s", server_round, cid,
                         refused[cid])
        self._told = set(refused)  # a node refused again after a pause is named again
        return refused

    def draw(self, keys: Mapping[str, str], server_round: int, size: int) -> list[str]:
        """Return the ``size`` node ids drawn in ``server_round`` (see `lowest_priorities`)."""
        return lowest_priorities(keys, self.seed, server_round, size)

    def _ask(self, cids: Sequence[str], available: Mapping[str, ClientProxy],
             server_round: int) -> None:
        """Ask ``cids`` their names at once (each query waits on the network only)."""
        if not cids:
            return
        answers = ask_properties({cid: available[cid] for cid in cids}, self.timeout,
                                 server_round)
        names = [_valid_name(answers.get(cid)) for cid in cids]
        self.announced.update(zip(cids, names, strict=True))
        unnamed = sum(1 for name in names if not name)
        if unnamed:
            _LOG.warning("round %d: %d of %d devices announced no valid client-name; they are "
                         "drawn by node id", server_round, unnamed, len(cids))


def _valid_name(res: GetPropertiesRes | None) -> str:
    """Return the ``client-name`` an answer announced, or "" (no answer, none, or invalid)."""
    name = res.properties.get("client-name") if res is not None and res.properties else None
    if isinstance(name, str) and len(name) <= MAX_NAME and NAME_PATTERN.fullmatch(name):
        return name
    return ""


def ask_properties(proxies: Mapping[str, ClientProxy], timeout: float,
                   server_round: int) -> dict[str, GetPropertiesRes]:
    """Ask every device of ``proxies`` its properties at once; return the answers by node id.

    A gpfl client answers with its name only (no data read, nothing charged). A device that
    does not answer within ``timeout`` seconds, or whose answer fails, is left out (logged).
    """
    def one(cid: str) -> GetPropertiesRes | None:
        try:
            return proxies[cid].get_properties(GetPropertiesIns(config={}), timeout=timeout,
                                               group_id=server_round)
        except Exception as err:  # a dead device times out; any failure leaves it out
            _LOG.info("round %d: node %s did not answer: %s", server_round, cid, str(err)[:200])
            return None

    cids = sorted(proxies)
    if not cids:
        return {}
    with ThreadPoolExecutor(max_workers=min(len(cids), 64)) as pool:
        return {cid: res for cid, res in zip(cids, pool.map(one, cids), strict=True)
                if res is not None}
