"""Privacy events: the immutable record of what one release costs.

A mechanism emits one event per release (``Mechanism.event``), before any noise
is drawn; the client's :class:`~mechanisms.ledger.PrivacyLedger` composes them.
Events round-trip through plain dicts (``to_dict`` / :func:`event_from_dict`) so
that the ledger can keep them in a JSON file.

====================  ===========  ============================================
class                 ``kind``     fields
====================  ===========  ============================================
MetricPrivacyEvent    ``metric``   ``layers``: (epsilon, radius) per layer
GaussianReleaseEvent  ``gaussian`` ``noise_multiplier`` (sigma / L2 sensitivity)
SignReleaseEvent      ``sign``     ``noise_multiplier`` (of the Gaussian it post-processes)
NonPrivateEvent       ``none``     (none)
====================  ===========  ============================================
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from mechanisms._validation import check_positive_finite, check_real


@dataclass(frozen=True)
class PrivacyEvent:
    """Base class of every privacy event; subclasses set ``kind``."""

    kind: ClassVar[str] = ""

    def validate(self) -> None:
        """Raise ``ValueError`` or ``TypeError`` if a field is out of range."""

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict with a ``kind`` key."""
        return {"kind": self.kind}


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
        """Return ``{"kind": "metric", "layers": [[epsilon, radius], ...]}``."""
        return {"kind": self.kind, "layers": [[e, r] for e, r in self.layers]}


@dataclass(frozen=True)
class GaussianReleaseEvent(PrivacyEvent):
    """One Gaussian release; ``noise_multiplier`` = sigma / (L2 sensitivity of the clipped update).

    Composed by the ledger with dp-accounting's ``GaussianDpEvent``.
    """

    kind: ClassVar[str] = "gaussian"
    noise_multiplier: float

    def __post_init__(self) -> None:
        z = check_positive_finite("noise_multiplier", self.noise_multiplier)
        object.__setattr__(self, "noise_multiplier", z)

    def validate(self) -> None:
        """Check ``noise_multiplier`` is positive and finite."""
        check_positive_finite("noise_multiplier", self.noise_multiplier)

    def to_dict(self) -> dict[str, Any]:
        """Return ``{"kind": ..., "noise_multiplier": z}``."""
        return {"kind": self.kind, "noise_multiplier": self.noise_multiplier}


@dataclass(frozen=True)
class SignReleaseEvent(GaussianReleaseEvent):
    """One stochastic-sign release: post-processing of a Gaussian release, accounted as one."""

    kind: ClassVar[str] = "sign"


@dataclass(frozen=True)
class NonPrivateEvent(PrivacyEvent):
    """A release without noise: no privacy guarantee at all (infinite cost)."""

    kind: ClassVar[str] = "none"


_KINDS: dict[str, type[PrivacyEvent]] = {
    cls.kind: cls
    for cls in (MetricPrivacyEvent, GaussianReleaseEvent, SignReleaseEvent, NonPrivateEvent)
}


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
    expected = {
        "metric": {"layers"},
        "gaussian": {"noise_multiplier"},
        "sign": {"noise_multiplier"},
        "none": set(),
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
    return _KINDS[kind](**fields)
