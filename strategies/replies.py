"""What the server accepts of a reply before it touches the model: metrics, size, name.

Everything a reply carries is written by a device the server does not control. Each check here
returns *why* a reply is unusable (a string for the log line and the round's record) or ``None``;
nothing raises on bad client input. The checks of the released arrays themselves are in
:mod:`strategies.validation` (count, dtype, shape, finite values) and :mod:`strategies.norms`
(magnitude).

Metrics
    Every metric the server reads is type- and range-checked (:func:`parse_metrics`); unknown
    keys are ignored and never stored.
Size
    A reply's tensors may not be larger than the hypotheses' shapes make them
    (:func:`tensor_limits`): checked on the raw bytes, before anything is parsed.
Names
    A reply's ``client-name`` is bound to one node at a time (:class:`NameBook`): two nodes never
    speak for one device in a round. Without SuperNode authentication a new node may take a name
    over (the same device restarted, which Flower gives a new node id while its old one stays
    registered until its heartbeat expires); the old node is then superseded: not asked again,
    its replies under the name dropped (see :meth:`NameBook.check`). With ``node-identity =
    "key"`` a node id is its SuperNode key (:mod:`strategies.identity`) and a name never moves.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.common import ndarray_to_bytes

from mechanisms.events import RELATIONS
from settings import MECHANISMS

__all__ = [
    "MAX_EXAMPLES",
    "SPEND_KEYS",
    "NameBook",
    "ReplyMetrics",
    "check_num_examples",
    "check_tensor_sizes",
    "merge_spend",
    "parse_metrics",
    "tensor_limits",
]

#: Metrics that only grow over a device's life (its ledger's totals): the server keeps the
#: largest value each device ever reported, so a lower (stale or forged) report never lowers it.
SPEND_KEYS: tuple[str, ...] = ("spend-d", "spend-epsilon", "spend-delta", "releases", "declines",
                               "spend-record-epsilon", "spend-epsilon-rdp", "spend-epsilon-pld",
                               "spend-central-epsilon")
#: ``num_examples`` is not used (a gpfl client reports 1: its real count stays private); a count
#: beyond a billion samples on one device is absurd whatever the client.
MAX_EXAMPLES = 10**9
#: The longest ``client-name`` accepted (it names the device's ledger file on the device).
MAX_NAME = 128
#: The longest free text (``decline-reason``) kept from a reply.
MAX_TEXT = 500
#: Bytes a ``.npy`` header may take beyond the one this NumPy writes for the same shape: the
#: format pads headers to a multiple of 64 bytes (older NumPy: 16), so a header of another
#: version is at most one alignment block longer.
_HEADER_SLACK = 64

#: The form of a ``client-name``.
NAME_PATTERN = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]*")
_NAME = NAME_PATTERN


@dataclass(frozen=True)
class ReplyMetrics:
    """The metrics of one reply the server reads, checked.

    Attributes
    ----------
    name : str
        The device's ``client-name``.
    declined : bool
        The device declined the round (no release).
    sigma : float or None
        The declared per-coordinate noise standard deviation, if any.
    mechanism : str or None
        The mechanism the device says it released with, if given.
    values : dict
        Every known metric present, checked (spend, releases, budget, ...), as stored in the
        device's record.
    """

    name: str
    declined: bool
    sigma: float | None
    mechanism: str | None
    values: dict[str, Any]


def _number(value: object) -> float | None:
    """``value`` as a finite float (ints included, bools not), else None."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _count(value: object) -> int | None:
    """``value`` as an int >= 0 (bools and floats refused), else None."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        return None
    return int(value)


def parse_metrics(
    metrics: Mapping[str, Any], *, need_sigma: bool, mechanism: str | None = None
) -> ReplyMetrics | str:
    """Check the metrics of one reply; return them, or why the reply is unusable.

    Parameters
    ----------
    metrics : Mapping[str, Any]
        ``FitRes.metrics`` as received.
    need_sigma : bool
        Whether a release must declare ``sigma`` (budget-aware weights, or a Gaussian release
        whose norm is bounded by it). A decline never needs it.
    mechanism : str, optional
        The run's mechanism: a reply that names another one is refused.

    Returns
    -------
    ReplyMetrics or str
        The checked metrics, or the first problem found, naming the metric and the value.

    Notes
    -----
    Ranges: ``client-name`` letters, digits, ``_ - .`` (at most 128, not starting with ``.``);
    ``declined`` 0 or 1 (absent: 0); ``spend-d``, ``spend-epsilon`` (with
    ``spend-epsilon-rdp`` and ``spend-epsilon-pld``), ``budget-epsilon``,
    ``sigma``, ``spend-record-epsilon``, ``record-clip-final``, ``record-lr-final`` finite and
    >= 0; ``spend-delta``, ``budget-delta`` in [0, 1]; ``releases``,
    ``declines`` integers >= 0; ``mechanism`` one of the known mechanisms; ``relation`` (the
    neighbouring relation the device's release is charged under) one of
    :data:`mechanisms.events.RELATIONS`.
    """
    name = metrics.get("client-name")
    if not isinstance(name, str) or len(name) > MAX_NAME or not _NAME.fullmatch(name):
        return f"metric 'client-name' must be a name of at most {MAX_NAME} letters, digits, " \
               f"'_', '-' or '.', got {_short(name)}"
    declined = metrics.get("declined", 0)
    if isinstance(declined, bool) or declined not in (0, 1):
        return f"metric 'declined' must be 0 or 1, got {_short(declined)}"
    values: dict[str, Any] = {"client-name": name, "declined": int(declined)}
    for key in ("spend-d", "spend-epsilon", "spend-epsilon-rdp", "spend-epsilon-pld",
                "budget-epsilon", "sigma", "spend-record-epsilon", "record-clip-final",
                "record-lr-final", "spend-central-epsilon"):
        if key in metrics:
            number = _number(metrics[key])
            if number is None or number < 0:
                return f"metric {key!r} must be a finite number >= 0, got {_short(metrics[key])}"
            values[key] = number
    for key in ("spend-delta", "budget-delta"):
        if key in metrics:
            number = _number(metrics[key])
            if number is None or not 0 <= number <= 1:
                return f"metric {key!r} must be a number in [0, 1], got {_short(metrics[key])}"
            values[key] = number
    for key in ("releases", "declines"):
        if key in metrics:
            count = _count(metrics[key])
            if count is None:
                return f"metric {key!r} must be an integer >= 0, got {_short(metrics[key])}"
            values[key] = count
    said = metrics.get("mechanism")
    if said is not None:
        if said not in MECHANISMS:
            return f"metric 'mechanism' must be one of {', '.join(MECHANISMS)}, got " \
                   f"{_short(said)}"
        if mechanism is not None and not declined and said != mechanism:
            return f"released with mechanism {said!r}, the run asks for {mechanism!r}"
        values["mechanism"] = said
    relation = metrics.get("relation")
    if relation is not None:
        if relation not in RELATIONS:
            return f"metric 'relation' must be one of {', '.join(RELATIONS)}, got " \
                   f"{_short(relation)}"
        values["relation"] = relation
    for key in ("declined-by", "decline-reason"):
        if isinstance(metrics.get(key), str):
            values[key] = metrics[key][:MAX_TEXT]
    sigma = values.get("sigma")
    if need_sigma and not declined and sigma is None:
        return "metric 'sigma' is missing: this run needs each release's declared noise"
    return ReplyMetrics(name=name, declined=bool(declined), sigma=sigma,
                        mechanism=said if isinstance(said, str) else None, values=values)


def check_num_examples(value: object) -> str | None:
    """Return why ``FitRes.num_examples`` is unusable (not an int in [0, 10⁹]), or None."""
    count = _count(value)
    if count is None or count > MAX_EXAMPLES:
        return f"num_examples must be an integer in [0, {MAX_EXAMPLES}], got {_short(value)}"
    return None


def merge_spend(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """Return ``new`` over ``old``, each of :data:`SPEND_KEYS` the larger of the two.

    A device's ledger only grows: the largest report is the truest one the server has.
    """
    out = {**old, **new}
    for key in SPEND_KEYS:
        if key in old and key in new:
            out[key] = max(old[key], new[key])
    return out


def tensor_limits(shapes: Sequence[tuple[int, ...]], dtype: np.dtype | type) -> list[int]:
    """Return the largest byte size each tensor of a reply may have.

    The data part is exact (the layer's element count × the item size); the ``.npy`` header is
    the one Flower's serialisation writes for that shape, plus one alignment block.
    """
    limits = []
    for shape in shapes:
        empty = np.zeros(shape, dtype=dtype)
        limits.append(len(ndarray_to_bytes(empty)) + _HEADER_SLACK)
    return limits


def check_tensor_sizes(tensors: Sequence[object], limits: Sequence[int]) -> str | None:
    """Return why a reply's raw tensors are oversized (or not bytes), or None.

    Checked before any tensor is parsed, so that an oversized reply costs no more than its
    reception.
    """
    if len(tensors) != len(limits):
        return f"expected {len(limits)} arrays, got {len(tensors)}"
    total = sum(len(t) for t in tensors if isinstance(t, bytes | bytearray | memoryview))
    if total > sum(limits):
        return f"message too large: {total} bytes of arrays, at most {sum(limits)} expected"
    for index, (tensor, limit) in enumerate(zip(tensors, limits, strict=True)):
        if not isinstance(tensor, bytes | bytearray | memoryview):
            return f"array {index} is a {type(tensor).__name__}, not bytes"
        if len(tensor) > limit:
            return f"array {index} is {len(tensor)} bytes, at most {limit} expected"
    return None


def _short(value: object) -> str:
    """``repr`` of a received value, cut so that a log line stays one short line."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class NameBook:
    """Which node each ``client-name`` belongs to, and which name each node speaks for.

    A node keeps the name of its first accepted reply. A name belongs to one node at a time: the
    newest node that speaks as it, unless the name's node answered the same round. Without node
    authentication a name is the device's identity (Flower registers a restarted device under a
    new node id, and its old registration lingers until the heartbeat expires): the newest
    registration is the device; the older one is *superseded* (:meth:`superseded`), no longer
    asked and no longer heard under the name. Records of both nodes merge under the name in the
    summary.

    With ``by_key`` (``node-identity = "key"``: the SuperLink authenticates SuperNodes and binds
    each key to one node id, :mod:`strategies.identity`) the node id *is* the device: a restarted
    device comes back under the same id, so a name never moves; another node that speaks as a
    bound name is another key, and is refused.
    """

    def __init__(self, by_key: bool = False) -> None:
        self.by_key = by_key
        self.node_name: dict[str, str] = {}
        self.name_node: dict[str, str] = {}

    def check(self, node: str, name: str, answered: Collection[str] = ()) -> str | None:
        """Return why ``node`` may not speak as ``name``, or None (and bind them).

        Parameters
        ----------
        node : str
            The replying node id.
        name : str
            The ``client-name`` its reply carries (already checked for form).
        answered : Collection[str]
            The node ids that answered this round (a release, a decline or a failure). A name
            whose node answered this round stays with it: one device, one reply a round. A name
            whose node did not moves to the new node at once (the device restarted: its reply
            counts, rather than being refused after it charged its ledger). Not used with
            ``by_key``: there a name stays with its node.
        """
        bound = self.node_name.get(node)
        if bound is not None and bound != name:
            return f"node {node} speaks as {bound!r}, this reply says {name!r}"
        owner = self.name_node.get(name)
        if owner is not None and owner != node:
            if self.by_key:
                return f"name {name!r} belongs to node {owner}, another SuperNode key " \
                       f"(node-identity=\"key\")"
            if bound == name:
                return f"name {name!r} moved to node {owner}"
            if owner in answered:
                return f"name {name!r} belongs to node {owner}, which answered this round"
        self.node_name[node] = name
        self.name_node[name] = node
        return None

    def superseded(self) -> set[str]:
        """Return the nodes whose name has moved to a newer node (stale registrations)."""
        return {node for node, name in self.node_name.items() if self.name_node.get(name) != node}

    def label(self, node: str) -> str:
        """Return the name a node speaks as, else ``node <id>`` (a device in records)."""
        return self.node_name.get(node) or f"node {node}"

    def to_dict(self) -> dict[str, dict[str, str]]:
        """Return the bindings as plain JSON values."""
        return {"node_name": dict(self.node_name), "name_node": dict(self.name_node)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Mapping[str, str]], by_key: bool = False) -> NameBook:
        """Rebuild from :meth:`to_dict` (``by_key``: the run's ``node-identity``, not stored)."""
        book = cls(by_key)
        book.node_name = {str(k): str(v) for k, v in data.get("node_name", {}).items()}
        book.name_node = {str(k): str(v) for k, v in data.get("name_node", {}).items()}
        return book
