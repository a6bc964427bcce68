"""What the strategy records: a :class:`RoundRecord` per round, a :class:`ClientRecord` per node.

Both are plain data, turned into JSON values for ``summary.json`` and the checkpoint and back.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from flwr.common import Scalar

__all__ = ["ClientRecord", "RoundRecord"]


@dataclass(frozen=True)
class RoundRecord:
    """What happened in one round (round 0: the initial hypotheses, no replies).

    Attributes
    ----------
    round : int
        The server round (0 = before training).
    val_loss : float or None
        Validation loss of the hypotheses after this round; ``None`` if not evaluated this round.
    val_metrics : dict of str to float
        The other entries ``evaluate_fn`` returned (empty if not evaluated).
    cluster_sizes : list of int
        Usable replies assigned to each hypothesis (k entries; all zero in round 0).
    replies : int
        Usable replies aggregated (declines, dropped replies and failures excluded).
    declined : int
        Clients that declined (``declined`` = 1: their next release would pass their cap).
    dropped : list of (str, str)
        ``(device, reason)`` of each reply that failed validation; the device is its
        ``client-name`` once bound to its node, else ``node <id>``.
    failures : int
        Devices that answered with an error (plus failures Flower reported without a device).
    released : list of list of float or None
        The usable released vectors (flattened, in aggregation order) if ``keep_released``.
    labels : list of int or None
        The hypothesis each released vector was assigned to, if ``keep_released``.
    missing : list of str
        Sampled devices that sent no reply in time (deadline passed, or the SuperLink lost them).
    failed : list of (str, str)
        ``(device, reason)`` of each device that answered with an error.
    kept : str or None
        Why the hypotheses were kept unchanged this round (too few usable replies), if they were.
    sampled : int
        Devices sent the hypotheses this round.
    asked : list of str
        Their keys in the draw, in the order drawn: ``name:<client-name>`` (``sample-by =
        "name"``) or ``node:<node id>`` (:mod:`strategies.device_keys`).
    """

    round: int
    val_loss: float | None
    val_metrics: dict[str, float]
    cluster_sizes: list[int]
    replies: int
    declined: int
    dropped: list[tuple[str, str]]
    failures: int
    released: list[list[float]] | None = None
    labels: list[int] | None = None
    missing: list[str] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)
    kept: str | None = None
    sampled: int = 0
    asked: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Return the record as plain JSON-serialisable Python values (copies, not views)."""
        # Field by field rather than dataclasses.asdict, whose recursive deep copy made the
        # every-round checkpoint of a long run cost O(rounds x replies) in asdict alone.
        out = {name: getattr(self, name) for name in _ROUND_FIELDS}
        out["val_metrics"] = dict(self.val_metrics)
        out["cluster_sizes"] = list(self.cluster_sizes)
        out["dropped"] = [list(pair) for pair in self.dropped]
        out["failed"] = [list(pair) for pair in self.failed]
        out["missing"] = list(self.missing)
        out["asked"] = list(self.asked)
        if self.released is not None:
            out["released"] = [list(vector) for vector in self.released]
        if self.labels is not None:
            out["labels"] = list(self.labels)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RoundRecord:
        """Rebuild a record from :meth:`to_dict` (e.g. read back from a checkpoint)."""
        values = dict(data)
        values["dropped"] = [(str(d), str(r)) for d, r in values.get("dropped", [])]
        values["failed"] = [(str(d), str(r)) for d, r in values.get("failed", [])]
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in names})


@dataclass
class ClientRecord:
    """What the server knows about one node (keyed by its node id, ``ClientProxy.cid``).

    Attributes
    ----------
    cid : str
        The node id.
    name : str
        The ``client-name`` the node speaks as ("" until its first accepted reply).
    sampled : int
        Rounds it was sent the hypotheses.
    participations : int
        Usable replies of it that were aggregated.
    declines : int
        Rounds it declined.
    dropped : int
        Replies of it that failed validation.
    failures : int
        Rounds it answered with an error.
    missing : int
        Rounds it was sampled in and sent no reply in time.
    last_round : int
        Last round it replied in (0 = never).
    missed_in_a_row : int
        Rounds it was sampled in and sent nothing, since its last answer (any answer, a
        failure included, resets it): a device with misses is not counted towards a round's
        quorum and rests before it is sampled again (:func:`strategies.sampling.rests`).
    last_missed : int
        The last round it was sampled in and sent nothing (0 = never).
    pull : float
        The sum, over its accepted releases, of the release's distance to its nearest
        hypothesis over the round's median distance: about 1 a release for an honest device,
        far more for one that pulls the hypotheses away (named when they are pushed away).
    metrics : dict of str to Scalar
        The checked metrics of its replies: the last reported value of each, except the
        spend totals (``spend-d``, ``spend-epsilon`` and its two bounds, ``spend-delta``,
        ``releases``, ``declines``), which hold the largest value it ever reported.
    record_schedule : list of [round, C, step]
        Record-level (dpsgd) releases: the clipping bound and the step each release ended
        with, by round (the clipping strategy's trajectory, from sanitized values only).
    failure : str
        The class of its last failure (``ledger``, ``release``, ``refused-hypotheses``,
        ``error``; "" if it never failed).
    failed_as : str
        The ``client-name`` its last failure's text claimed (a device that fails every round
        sends no reply with its name); "" if none.
    """

    cid: str
    name: str = ""
    sampled: int = 0
    participations: int = 0
    declines: int = 0
    dropped: int = 0
    failures: int = 0
    missing: int = 0
    last_round: int = 0
    missed_in_a_row: int = 0
    last_missed: int = 0
    pull: float = 0.0
    metrics: dict[str, Scalar] = field(default_factory=dict)
    record_schedule: list[list[float]] = field(default_factory=list)
    failure: str = ""
    failed_as: str = ""

    def answered(self) -> None:
        """Note an answer of the device (a reply, a decline or an error): it is alive."""
        self.missed_in_a_row = 0

    def missed(self, server_round: int) -> None:
        """Note that the device sent nothing in ``server_round``."""
        self.missing += 1
        self.missed_in_a_row += 1
        self.last_missed = server_round

    def to_dict(self) -> dict[str, Any]:
        """Return the record as plain JSON values (a copy)."""
        # Every client's record goes into every round's checkpoint (up to thousands on the
        # Simulation Engine): field by field is ~15x faster than dataclasses.asdict's deep copy.
        out = {name: getattr(self, name) for name in _CLIENT_FIELDS}
        out["metrics"] = dict(self.metrics)
        out["record_schedule"] = [list(row) for row in self.record_schedule]
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ClientRecord:
        """Rebuild a record from :meth:`to_dict`."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


_ROUND_FIELDS = tuple(f.name for f in dataclasses.fields(RoundRecord))
_CLIENT_FIELDS = tuple(f.name for f in dataclasses.fields(ClientRecord))
