"""Privacy events: the immutable record of what one release costs.

A mechanism emits one event per release (``Mechanism.event``), before any noise
is drawn; the client's :class:`~mechanisms.ledger.PrivacyLedger` records them and
:mod:`mechanisms.accountant` composes them.
Events round-trip through plain dicts (``to_dict`` / :func:`event_from_dict`) so
that the ledger can keep them in a JSON file.

Every event belongs to a ``family``, the unit its cost is counted and capped in:
``"d-privacy"`` (Σ ε·r, composed by addition), ``"rdp"`` (the (ε, δ) that
dp-accounting's RDP accountant composes), ``"record"`` (the record-level (ε, δ) of
DP-SGD on the device, composed by the same accountant in its own unit) or ``"none"``
(no guarantee at all). Costs of different families are never added to one another.

Every event names its promise and neighbouring relation (:attr:`PrivacyEvent.relation`, in its
JSON form as ``relation``): the device-level events (``metric``, ``neighbourhood``,
``gaussian``, ``sign``) protect the device's whole local data set replaced by any other,
``device-replace`` (the sensitivity of a clipped update covers any two data sets; d-privacy
states it at the distance between the two data sets' models); a record-level event protects
one record, ``add-remove`` or ``replace-one``, as the device chose; a release without noise has
no guarantee (``none``). An entry written before device-level events named their relation
reads as that implied one.

====================  =================  =========  ==========================================
class                 ``kind``           family     fields
====================  =================  =========  ==========================================
MetricPrivacyEvent    ``metric``         d-privacy  ``layers``: (epsilon, radius) per layer
NeighbourhoodEvent    ``neighbourhood``  d-privacy  ``dimensions`` (size of each block),
                                                    ``noise_multiplier`` ν
GaussianReleaseEvent  ``gaussian``       rdp        ``noise_multiplier`` (σ / L2 sensitivity)
SignReleaseEvent      ``sign``           rdp        ``noise_multiplier`` (of the Gaussian it
                                                    post-processes)
DistributedGaussian-  ``distributed-     rdp        ``noise_multiplier`` (the local floor:
Event                 gaussian``                    σ / 2B), ``central_noise_multiplier``
                                                    (of the sum of ``cohort`` shares),
                                                    ``cohort``
NonPrivateEvent       ``none``           none       (none)
RecordLevelEvent      ``dpsgd``          record     ``sampling_rate`` q, ``noise_multiplier``
                                                    ν, ``steps`` T, ``relation``,
                                                    ``selection_noise_multiplier``
====================  =================  =========  ==========================================
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from mechanisms._validation import check_positive_finite, check_positive_int, check_real

#: The families of events, i.e. the units in which a ledger counts and caps spend.
FAMILIES: tuple[str, ...] = ("d-privacy", "rdp", "record", "none")

#: The neighbouring relations a record-level guarantee can be stated under.
RECORD_RELATIONS: tuple[str, ...] = ("add-remove", "replace-one")

#: The relation of every device-level event: the device's whole data set, replaced.
DEVICE_RELATION = "device-replace"

#: The "relation" of a release without noise: it has no guarantee.
NO_RELATION = "none"

#: Every relation an event can name, and what it protects (for people: ``gpfl ledger``).
RELATIONS: dict[str, str] = {
    DEVICE_RELATION: "device level: the device's whole local data set replaced by any other "
                     "(d-privacy: at the distance between the two data sets' models)",
    "add-remove": "record level: one record of the device added or removed",
    "replace-one": "record level: one record of the device replaced by any other",
    NO_RELATION: "no guarantee: released without noise",
}


@dataclass(frozen=True)
class PrivacyEvent:
    """Base class of every privacy event; subclasses set ``kind`` and ``family``."""

    kind: ClassVar[str] = ""
    family: ClassVar[str] = ""
    #: The relation every event of the kind is under (None: each event names its own).
    implied_relation: ClassVar[str | None] = DEVICE_RELATION

    @property
    def relation(self) -> str:
        """The neighbouring relation the cost is stated under (device level: the whole data set)."""
        return self.implied_relation or DEVICE_RELATION

    def validate(self) -> None:
        """Raise ``ValueError`` or ``TypeError`` if a field is out of range."""

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict with a ``kind`` key (and, last, the ``relation``)."""
        return {"kind": self.kind, "relation": self.relation}


@dataclass(frozen=True)
class MetricPrivacyEvent(PrivacyEvent):
    """A d-privacy release (Euclidean Laplace), one ``(epsilon, radius)`` pair per layer.

    The release is ``epsilon``-d-private with respect to the Euclidean distance in
    each layer's space, and the user reports it at the neighbourhood ``radius``:
    any two inputs within ``radius`` are indistinguishable up to a factor
    ``exp(epsilon * radius)``. Costs compose by addition (Theorem 3.1 of Galli et
    al.), both across layers and across releases.

    Parameters
    ----------
    layers : tuple of (float, float)
        ``(epsilon, radius)`` per sanitized layer (one pair when the whole model
        is sanitized at once); ``epsilon > 0`` and ``radius >= 0``, both finite.
    """

    kind: ClassVar[str] = "metric"
    family: ClassVar[str] = "d-privacy"
    layers: tuple[tuple[float, float], ...]

    def __post_init__(self) -> None:
        if isinstance(self.layers, (str, bytes)) or not hasattr(self.layers, "__iter__"):
            raise TypeError(
                f"layers must be a sequence of (epsilon, radius) pairs, got layers={self.layers!r}"
            )
        pairs = []
        for pair in self.layers:
            if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                raise TypeError(
                    "layers must be a sequence of (epsilon, radius) pairs, "
                    f"got layers={self.layers!r}"
                )
            pairs.append((check_real("epsilon", pair[0]), check_real("radius", pair[1])))
        object.__setattr__(self, "layers", tuple(pairs))
        self.validate()

    def validate(self) -> None:
        """Check there is at least one layer, every epsilon > 0, every radius >= 0, all finite."""
        if not self.layers:
            raise ValueError("layers must hold at least one (epsilon, radius) pair, got layers=()")
        for epsilon, radius in self.layers:
            check_positive_finite("epsilon", epsilon)
            if not (radius >= 0.0 and math.isfinite(radius)):
                raise ValueError(f"radius must be non-negative and finite, got radius={radius!r}")

    @property
    def cost(self) -> float:
        """The d-privacy cost of the release: the sum of epsilon * radius over layers."""
        return math.fsum(epsilon * radius for epsilon, radius in self.layers)

    def to_dict(self) -> dict[str, Any]:
        """Return ``{"kind": "metric", "layers": [[epsilon, radius], ...], "relation": ...}``."""
        return {"kind": self.kind, "layers": [[e, r] for e, r in self.layers],
                "relation": self.relation}


@dataclass(frozen=True)
class NeighbourhoodEvent(PrivacyEvent):
    """A Euclidean Laplace release under the neighbourhood calibration, from public numbers only.

    Under that calibration a block of ``n`` parameters gets ε = n/(ν‖δ‖) and is
    reported at the radius ‖δ‖, so its cost ε·‖δ‖ is n/ν whatever ‖δ‖ is. Computing
    it as the product ε·‖δ‖ would give n/ν only up to the last bits, and those bits
    would depend on ‖δ‖: a spend reported from such costs leaks about one bit of
    private data per release. This event therefore records only what is public, the
    block sizes and ν, and its :attr:`cost` is a function of them alone: two releases
    with the same ``(dimensions, noise_multiplier)`` have bit-identical costs.

    Parameters
    ----------
    dimensions : tuple of int
        The parameter count of each sanitized block: one entry for the whole
        model, or one per non-empty layer with ``per_layer``; each >= 1.
    noise_multiplier : float
        ν > 0 and finite.
    """

    kind: ClassVar[str] = "neighbourhood"
    family: ClassVar[str] = "d-privacy"
    dimensions: tuple[int, ...]
    noise_multiplier: float

    def __post_init__(self) -> None:
        if isinstance(self.dimensions, (str, bytes)) or not hasattr(self.dimensions, "__iter__"):
            raise TypeError(
                "dimensions must be a sequence of positive integers, "
                f"got dimensions={self.dimensions!r}"
            )
        dims = tuple(check_positive_int("dimensions", n) for n in self.dimensions)
        object.__setattr__(self, "dimensions", dims)
        nu = check_positive_finite("noise_multiplier", self.noise_multiplier)
        object.__setattr__(self, "noise_multiplier", nu)
        self.validate()

    def validate(self) -> None:
        """Check there is at least one block, every size >= 1 and ν positive and finite."""
        if not self.dimensions:
            raise ValueError("dimensions must hold at least one block size, got dimensions=()")
        for n in self.dimensions:
            check_positive_int("dimensions", n)
        check_positive_finite("noise_multiplier", self.noise_multiplier)

    @property
    def cost(self) -> float:
        """The d-privacy cost of the release: Σ_l n_l/ν over the blocks."""
        nu = self.noise_multiplier
        return math.fsum(n / nu for n in self.dimensions)

    def to_dict(self) -> dict[str, Any]:
        """Return ``{"kind": "neighbourhood", "dimensions": [n, ...], "noise_multiplier": ν}``.

        With, last, its ``relation``.
        """
        return {
            "kind": self.kind,
            "dimensions": list(self.dimensions),
            "noise_multiplier": self.noise_multiplier,
            "relation": self.relation,
        }


@dataclass(frozen=True)
class GaussianReleaseEvent(PrivacyEvent):
    """One Gaussian release; ``noise_multiplier`` = sigma / (L2 sensitivity of the clipped update).

    Composed by :mod:`mechanisms.accountant` with dp-accounting's ``GaussianDpEvent``.
    """

    kind: ClassVar[str] = "gaussian"
    family: ClassVar[str] = "rdp"
    noise_multiplier: float

    def __post_init__(self) -> None:
        z = check_positive_finite("noise_multiplier", self.noise_multiplier)
        object.__setattr__(self, "noise_multiplier", z)

    def validate(self) -> None:
        """Check ``noise_multiplier`` is positive and finite."""
        check_positive_finite("noise_multiplier", self.noise_multiplier)

    def to_dict(self) -> dict[str, Any]:
        """Return ``{"kind": ..., "noise_multiplier": z, "relation": "device-replace"}``."""
        return {"kind": self.kind, "noise_multiplier": self.noise_multiplier,
                "relation": self.relation}


@dataclass(frozen=True)
class SignReleaseEvent(GaussianReleaseEvent):
    """One stochastic-sign release: post-processing of a Gaussian release, accounted as one."""

    kind: ClassVar[str] = "sign"
    family: ClassVar[str] = "rdp"


@dataclass(frozen=True)
class DistributedGaussianEvent(GaussianReleaseEvent):
    """One device's share of a secure per-cluster sum (:mod:`mechanisms.distributed`).

    ``noise_multiplier`` is the local floor, what the ledger caps: the device's masked vector
    alone, were the server to unmask it, is a discrete Gaussian release of this multiplier.
    ``central_noise_multiplier`` is what the server learns from the sum, provided at least
    ``cohort`` honest devices' shares are in it; it is recorded, composed and reported beside
    the floor, never charged in its place. Both compose by RDP alone (no PLD).
    """

    kind: ClassVar[str] = "distributed-gaussian"
    family: ClassVar[str] = "rdp"
    central_noise_multiplier: float = 0.0
    cohort: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        z = check_positive_finite("central_noise_multiplier", self.central_noise_multiplier)
        object.__setattr__(self, "central_noise_multiplier", z)
        object.__setattr__(self, "cohort", check_positive_int("cohort", self.cohort))

    def validate(self) -> None:
        """Check both multipliers are positive and finite and the cohort a positive integer."""
        super().validate()
        check_positive_finite("central_noise_multiplier", self.central_noise_multiplier)
        check_positive_int("cohort", self.cohort)

    def to_dict(self) -> dict[str, Any]:
        """Return the kind, both multipliers, the cohort and the relation."""
        return {"kind": self.kind, "noise_multiplier": self.noise_multiplier,
                "central_noise_multiplier": self.central_noise_multiplier,
                "cohort": self.cohort, "relation": self.relation}


@dataclass(frozen=True)
class NonPrivateEvent(PrivacyEvent):
    """A release without noise: no privacy guarantee at all (infinite cost)."""

    kind: ClassVar[str] = "none"
    family: ClassVar[str] = "none"
    #: A release without noise protects nothing.
    implied_relation: ClassVar[str | None] = NO_RELATION


@dataclass(frozen=True)
class RecordLevelEvent(PrivacyEvent):
    """A model trained with DP-SGD on the device's records, released (record-level privacy).

    The cost is known before training, from public numbers only: ``steps`` Poisson-sampled
    steps at rate q, each a Gaussian query of noise multiplier ν on the clipped per-record sums
    (one joint query when a clipping strategy adds its own, see
    :mod:`mechanisms.record_clipping`), plus, with k >= 2 hypotheses, one Gaussian
    report-noisy-min of noise multiplier ``selection_noise_multiplier`` (0: no choice was made).
    Under ``replace-one`` the L2 sensitivity of every clipped sum is twice that of
    ``add-remove``, so the accountant composes the same queries at half the noise multiplier.

    Parameters
    ----------
    sampling_rate : float
        q in (0, 1]: each record is in a step's batch independently with probability q.
    noise_multiplier : float
        ν > 0: σ of each step's noise over the add/remove sensitivity of its clipped sum.
    steps : int
        T >= 1 steps of the release.
    relation : str
        ``"add-remove"`` or ``"replace-one"`` (the device's choice).
    selection_noise_multiplier : float
        >= 0; σ of the report-noisy-min over its add/remove sensitivity (0 = no choice).
    """

    kind: ClassVar[str] = "dpsgd"
    family: ClassVar[str] = "record"
    implied_relation: ClassVar[str | None] = None
    sampling_rate: float
    noise_multiplier: float
    steps: int
    relation_name: str
    selection_noise_multiplier: float = 0.0

    def __post_init__(self) -> None:
        q = check_positive_finite("sampling_rate", self.sampling_rate)
        if q > 1.0:
            raise ValueError(f"sampling_rate must be in (0, 1], got sampling_rate={q!r}")
        object.__setattr__(self, "sampling_rate", q)
        object.__setattr__(self, "noise_multiplier",
                           check_positive_finite("noise_multiplier", self.noise_multiplier))
        object.__setattr__(self, "steps", check_positive_int("steps", self.steps))
        if self.relation_name not in RECORD_RELATIONS:
            raise ValueError(f"relation must be one of {RECORD_RELATIONS}, "
                             f"got relation={self.relation_name!r}")
        z = check_real("selection_noise_multiplier", self.selection_noise_multiplier)
        if not (z >= 0.0 and math.isfinite(z)):
            raise ValueError("selection_noise_multiplier must be >= 0 and finite, got "
                             f"selection_noise_multiplier={z!r}")
        object.__setattr__(self, "selection_noise_multiplier", z)

    def validate(self) -> None:
        """Check the fields (the constructor already did; kept for the accountant's check)."""
        RecordLevelEvent(self.sampling_rate, self.noise_multiplier, self.steps,
                         self.relation_name, self.selection_noise_multiplier)

    @property
    def relation(self) -> str:
        """``add-remove`` or ``replace-one``: one record, as the device declared."""
        return self.relation_name

    @property
    def sensitivity_factor(self) -> float:
        """The L2 sensitivity of a clipped sum in units of the clipping bound: 1, or 2."""
        return 2.0 if self.relation_name == "replace-one" else 1.0

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form (every field, the relation by name)."""
        return {"kind": self.kind, "sampling_rate": self.sampling_rate,
                "noise_multiplier": self.noise_multiplier, "steps": self.steps,
                "relation": self.relation_name,
                "selection_noise_multiplier": self.selection_noise_multiplier}


#: Every event class the accountant knows how to compose, in the order they were introduced.
EVENT_TYPES: tuple[type[PrivacyEvent], ...] = (
    MetricPrivacyEvent,
    NeighbourhoodEvent,
    GaussianReleaseEvent,
    SignReleaseEvent,
    NonPrivateEvent,
    RecordLevelEvent,
    DistributedGaussianEvent,
)

_KINDS: dict[str, type[PrivacyEvent]] = {cls.kind: cls for cls in EVENT_TYPES}


def event_from_dict(d: Mapping[str, Any]) -> PrivacyEvent:
    """Rebuild an event from :meth:`PrivacyEvent.to_dict`'s output.

    Raises
    ------
    ValueError
        On an unknown ``kind``, missing or extra fields, or out-of-range values.
    TypeError
        If ``d`` is not a mapping or a field has the wrong type.
    """
    if not isinstance(d, Mapping):
        raise TypeError(f"an event must be a dict, got {type(d).__name__}")
    kind = d.get("kind")
    if kind not in _KINDS:
        raise ValueError(f"unknown privacy event kind {kind!r}; known kinds: {sorted(_KINDS)}")
    fields = {k: v for k, v in d.items() if k != "kind"}
    if kind != "dpsgd" and "relation" in fields:
        # Device-level kinds have one relation, implied by the kind: an entry written before
        # they named it has none; one that names another is not this code's.
        relation = fields.pop("relation")
        implied = _KINDS[kind].implied_relation
        if relation != implied:
            raise ValueError(f"a {kind!r} event is under the relation {implied!r}, "
                             f"got relation={relation!r}")
    expected = {
        "metric": {"layers"},
        "neighbourhood": {"dimensions", "noise_multiplier"},
        "gaussian": {"noise_multiplier"},
        "sign": {"noise_multiplier"},
        "distributed-gaussian": {"noise_multiplier", "central_noise_multiplier", "cohort"},
        "none": set(),
        "dpsgd": {"sampling_rate", "noise_multiplier", "steps", "relation",
                  "selection_noise_multiplier"},
    }[kind]
    if set(fields) != expected:
        raise ValueError(
            f"a {kind!r} event needs exactly the fields {sorted(expected)}, got {sorted(fields)}"
        )
    if kind == "metric":
        layers = fields["layers"]
        if not isinstance(layers, list):
            raise TypeError(f"layers must be a list of [epsilon, radius] pairs, got {layers!r}")
        return MetricPrivacyEvent(
            tuple(tuple(p) if isinstance(p, (list, tuple)) else p for p in layers)
        )
    if kind == "neighbourhood":
        dimensions = fields["dimensions"]
        if not isinstance(dimensions, list):
            raise TypeError(
                f"dimensions must be a list of positive integers, got {dimensions!r}"
            )
        return NeighbourhoodEvent(tuple(dimensions), fields["noise_multiplier"])
    if kind == "dpsgd":
        steps = fields["steps"]
        if isinstance(steps, bool) or not isinstance(steps, int):
            raise TypeError(f"steps must be an integer, got {steps!r}")
        return RecordLevelEvent(fields["sampling_rate"], fields["noise_multiplier"], steps,
                                fields["relation"], fields["selection_noise_multiplier"])
    if kind == "distributed-gaussian":
        cohort = fields["cohort"]
        if isinstance(cohort, bool) or not isinstance(cohort, int):
            raise TypeError(f"cohort must be an integer, got {cohort!r}")
    return _KINDS[kind](**fields)
