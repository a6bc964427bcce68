"""The Laplace mechanism under the Euclidean distance in R^n (Galli et al., Proposition 3.1).

The noise ρ has density ∝ exp(−ε‖ρ‖₂). Its norm follows Gamma(shape n, scale 1/ε)
and its direction is uniform on the sphere, independent of the norm, so

* E‖ρ‖ = n/ε,
* each coordinate has mean 0 and variance (n+1)/ε² (Lemma 2 of the extended paper),
* adding ρ to x is ε-d-private: for any x, x′ and any set S of outputs,
  P[x + ρ ∈ S] ≤ exp(ε‖x − x′‖) · P[x′ + ρ ∈ S].

The guarantee is on the released point itself: two trained models x, x′ are
indistinguishable up to exp(ε‖x − x′‖), wherever they came from. With k ≥ 2
hypotheses the client trains the one it picked with its private loss, so the
choice of hypothesis is protected only at the scale of the distance between
hypotheses (well-separated hypotheses are told apart easily); no ``spread`` enters
the calibration.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from numpy.random import Generator

from mechanisms._numeric import sum_of_squared_differences, sum_of_squares
from mechanisms._validation import (
    check_bool,
    check_choice,
    check_generator,
    check_positive_finite,
    check_positive_int,
)
from mechanisms.base import Layers, Mechanism
from mechanisms.events import MetricPrivacyEvent, NeighbourhoodEvent
from mechanisms.grid import grid_spacing, on_grid

CALIBRATIONS = ("neighbourhood", "fixed")


def sample_euclidean_laplace(n: int, epsilon: float, rng: np.random.Generator) -> np.ndarray:
    """Draw one noise vector of the Euclidean Laplace mechanism in R^n.

    The radius is drawn from Gamma(shape ``n``, scale ``1/epsilon``) in float64;
    the direction is a standard normal vector divided by its norm.

    Parameters
    ----------
    n : int
        Dimension, >= 1.
    epsilon : float
        Privacy parameter per unit of Euclidean distance, > 0 and finite.
    rng : numpy.random.Generator
        Source of randomness (on a device: :func:`mechanisms.device_rng`).

    Returns
    -------
    numpy.ndarray
        float64 array of shape ``(n,)`` with density ∝ exp(−epsilon‖x‖₂).

    Raises
    ------
    ValueError
        ``n < 1``, ``epsilon`` not positive and finite, or ``epsilon`` so small
        that the radius overflows float64.
    TypeError
        ``n`` not an integer, ``epsilon`` not a real number, ``rng`` not a Generator.
    """
    # The fast paths keep the per-call overhead to a few type checks: this runs
    # once per release and should cost little more than drawing the normals.
    if type(n) is not int or n < 1:
        n = check_positive_int("n", n)
    if type(epsilon) is not float or not 0.0 < epsilon < math.inf:
        epsilon = check_positive_finite("epsilon", epsilon)
    if type(rng) is not np.random.Generator:
        check_generator(rng)
    # One float64 draw, normalised in place: no temporaries beyond the result.
    noise = rng.standard_normal(n)
    squared = sum_of_squares(noise)
    while squared == 0.0:  # probability ~0 (only conceivable for tiny n); never divide by 0
        noise = rng.standard_normal(n)
        squared = sum_of_squares(noise)
    radius = float(rng.gamma(n, 1.0 / epsilon))
    if not math.isfinite(radius):
        raise ValueError(
            f"epsilon is too small: the noise radius overflows float64, got epsilon={epsilon!r}"
        )
    noise *= radius / math.sqrt(squared)
    return noise


@dataclass(frozen=True)
class _Block:
    """A group of layers sanitized with one noise vector."""

    layers: tuple[int, ...]
    size: int
    epsilon: float  # > 0 and finite: the noise of every block is real


class EuclideanLaplace(Mechanism[MetricPrivacyEvent | NeighbourhoodEvent]):
    """Euclidean Laplace noise on the trained model (Algorithm 2, SanitizeUpdate).

    The release is ``updated + ρ`` with ρ drawn by :func:`sample_euclidean_laplace`
    over the flattened model (or layer by layer with ``per_layer=True``). The noise
    is drawn in float64; the exact real sum is rounded onto a public power-of-two grid
    (:mod:`mechanisms.grid`, a sixteenth of the noise's per-coordinate scale or finer) and
    the release leaves as float32.

    Parameters
    ----------
    calibration : {"neighbourhood", "fixed"}
        ``"neighbourhood"`` (the paper's heuristic): with δ = updated − reference
        over ``n`` parameters and r = max(‖δ‖, ``least_radius``), ε = n / (ν·r), so
        that E‖ρ‖ = ν·r and every model within r of the released one is
        indistinguishable up to e^{n/ν}. Each
        release costs n/ν, recorded as a
        :class:`~mechanisms.events.NeighbourhoodEvent` of the block sizes and ν
        alone (never of ‖δ‖, whose last bits would otherwise show in the reported
        spend). Caveat: the noise scale depends on the data; the norm of
        the noise concentrates around ν‖δ‖ (relative spread 1/√n), so the release
        reveals ‖δ‖ approximately; ``sigma`` in :meth:`public_metrics` is
        proportional to ‖δ‖ and reveals it exactly to whoever sees the metrics.
        ``"fixed"``: ε is given, no data-dependent scale and no ‖δ‖ leak; the cost
        is reported as ε·r at the public radius r (a
        :class:`~mechanisms.events.MetricPrivacyEvent`: both numbers are public).
    noise_multiplier : float, optional
        ν > 0 (neighbourhood only). Larger is more private.
    least_radius : float, optional
        r_min > 0 (neighbourhood only): the least radius a release protects, so
        that the noise never falls below ν·r_min however small ‖δ‖ is (a server
        that shrinks the update, e.g. with a tiny learning rate, still gets a
        noisy release). Without it (``None``) a release with ‖δ‖ = 0 is refused.
    epsilon : float, optional
        ε > 0 per unit distance (fixed only).
    public_radius : float, optional
        r > 0, the distance at which the fixed calibration's cost ε·r is reported.
    per_layer : bool
        Sanitize each layer with its own noise vector (and, in the neighbourhood
        calibration, its own ε_l = n_l/(ν‖δ_l‖)). Costs add over layers:
        Σ n_l/ν = n/ν (neighbourhood) or L·ε·r (fixed, L non-empty layers).

    Notes
    -----
    **No release without noise.** The heuristic's ε = n/(ν‖δ‖) is infinite at
    ‖δ‖ = 0 (its noise radius 0: the release would be the hypothesis the client
    started from, unnoised). With ``least_radius`` the radius is never below it;
    without, such a release is refused (``ValueError``), as is any block whose ε
    would not be positive and finite (ν·r overflowing float64, or underflowing).
    A release always carries noise at the scale its event is charged for.

    **k ≥ 2 hypotheses**: d-privacy is a guarantee on the released point itself, so
    the choice of hypothesis (made with private data) is protected only at the scale
    of the distance between hypotheses; ``spread`` is validated and ignored.
    """

    name: ClassVar[str] = "laplace"

    def __init__(
        self,
        *,
        calibration: str = "neighbourhood",
        noise_multiplier: float | None = None,
        epsilon: float | None = None,
        public_radius: float | None = None,
        per_layer: bool = False,
        least_radius: float | None = None,
    ) -> None:
        self.calibration = check_choice("calibration", calibration, CALIBRATIONS)
        self.per_layer = check_bool("per_layer", per_layer)
        self.noise_multiplier: float | None = None
        self.epsilon: float | None = None
        self.public_radius: float | None = None
        self.least_radius: float | None = None
        if self.calibration == "neighbourhood":
            if noise_multiplier is None:
                raise ValueError("noise_multiplier is required with calibration='neighbourhood'")
            if epsilon is not None or public_radius is not None:
                raise ValueError(
                    "epsilon and public_radius are only used with calibration='fixed'"
                )
            self.noise_multiplier = check_positive_finite("noise_multiplier", noise_multiplier)
            if least_radius is not None:
                self.least_radius = check_positive_finite("least_radius", least_radius)
        else:
            if epsilon is None or public_radius is None:
                raise ValueError("epsilon and public_radius are required with calibration='fixed'")
            if noise_multiplier is not None or least_radius is not None:
                raise ValueError(
                    "noise_multiplier and least_radius are only used with "
                    "calibration='neighbourhood'"
                )
            self.epsilon = check_positive_finite("epsilon", epsilon)
            self.public_radius = check_positive_finite("public_radius", public_radius)

    def __repr__(self) -> str:
        if self.calibration == "neighbourhood":
            params = f"noise_multiplier={self.noise_multiplier!r}"
            if self.least_radius is not None:
                params += f", least_radius={self.least_radius!r}"
        else:
            params = f"epsilon={self.epsilon!r}, public_radius={self.public_radius!r}"
        return (
            f"EuclideanLaplace(calibration={self.calibration!r}, {params}, "
            f"per_layer={self.per_layer!r})"
        )

    def _groups(self, upd: list[np.ndarray]) -> list[tuple[int, ...]]:
        """Return the groups of layers sanitized together: all, or each non-empty layer alone."""
        if self.per_layer:
            return [(i,) for i in range(len(upd)) if upd[i].size > 0]
        return [tuple(range(len(upd)))]

    def _blocks(self, ref: list[np.ndarray], upd: list[np.ndarray]) -> list[_Block]:
        blocks = []
        for group in self._groups(upd):
            size = sum(upd[i].size for i in group)
            if self.calibration == "fixed":
                assert self.epsilon is not None
                blocks.append(_Block(group, size, self.epsilon))
                continue
            assert self.noise_multiplier is not None
            radius = max(_distance(ref, upd, group), self.least_radius or 0.0)
            blocks.append(_Block(group, size, neighbourhood_epsilon(
                size, self.noise_multiplier, radius)))
        return blocks

    def _event(self, upd: Layers) -> MetricPrivacyEvent | NeighbourhoodEvent:
        """Return the d-privacy event of the release.

        ``NeighbourhoodEvent(block sizes, ν)`` for the neighbourhood calibration
        (computed from the shapes alone: the values of the models do not enter),
        ``MetricPrivacyEvent`` with one (ε, r) pair per block for the fixed one.
        """
        groups = self._groups(upd)
        if self.calibration == "neighbourhood":
            assert self.noise_multiplier is not None
            sizes = tuple(sum(upd[i].size for i in group) for group in groups)
            return NeighbourhoodEvent(sizes, self.noise_multiplier)
        assert self.epsilon is not None and self.public_radius is not None
        return MetricPrivacyEvent(tuple((self.epsilon, self.public_radius) for _ in groups))

    def _release(self, ref: Layers, upd: Layers, rng: Generator, spread: float) -> Layers:
        """Return ``updated + ρ`` in float64, arrays with the shapes of ``updated``.

        ``spread`` (the hypotheses' diameter) is validated and ignored: the
        guarantee is on the released point itself (see the class notes).
        """
        out: list[np.ndarray | None] = [None] * len(upd)
        for block in self._blocks(ref, upd):
            noise = sample_euclidean_laplace(block.size, block.epsilon, rng)
            spacing = laplace_grid(block.size, block.epsilon)
            offset = 0
            for i in block.layers:
                layer = noise[offset:offset + upd[i].size].reshape(upd[i].shape)
                offset += upd[i].size
                # The exact sum, rounded onto the block's public grid (mechanisms.grid).
                out[i] = on_grid([layer, upd[i]], spacing)
        # Empty layers (skipped in per-layer mode) have nothing to hide.
        return [u.astype(np.float64) if o is None else o for o, u in zip(out, upd, strict=True)]

    def _metrics(self, ref: Layers, upd: Layers, spread: float) -> dict[str, float]:
        """Return ``sigma`` (per-coordinate noise std), ``budget-epsilon`` = ``budget-delta`` = 0.

        ``sigma`` = √(n+1)/ε for one block. With ``per_layer`` the layers have
        different scales; ``sigma`` is their root mean square over coordinates,
        √(Σ_l n_l σ_l² / n), so that n·sigma² = E‖ρ‖², the same identity as for one
        block.
        ``spread`` is validated and ignored, as in :meth:`sanitize`.
        """
        blocks = self._blocks(ref, upd)
        total = sum(b.size for b in blocks)
        # Products, not powers: a float power that overflows raises, a product gives inf.
        energy = math.fsum(b.size * (b.size + 1) * (1.0 / b.epsilon) * (1.0 / b.epsilon)
                           for b in blocks)
        sigma = math.sqrt(energy / total) if total else 0.0
        return {"sigma": sigma, "budget-epsilon": 0.0, "budget-delta": 0.0}


def laplace_grid(size: int, epsilon: float) -> float:
    """Return the grid of a block of ``size`` coordinates under Euclidean Laplace noise of ε.

    The noise's per-coordinate standard deviation is √(n+1)/ε; the grid is computed from
    √n/ε (slightly less, so at least as fine) by :func:`mechanisms.grid.grid_spacing`.
    For the fixed calibration ε is public; for the neighbourhood one ε = n/(ν·r) carries the
    block's radius r, so the grid says ⌊log2(ν·r/√n)⌋, less than the noise's own norm says of
    r (its relative spread is 1/√n).
    """
    return grid_spacing(math.sqrt(size) / epsilon, size)


def neighbourhood_epsilon(size: int, noise_multiplier: float, radius: float) -> float:
    """Return the neighbourhood calibration's ε = n/(ν·r) of a block, checked.

    Raises
    ------
    ValueError
        If ε is not positive and finite: ``radius`` 0 (no least radius and ‖δ‖ = 0:
        the release would carry no noise), or ν·r overflowing or underflowing float64.
        The message holds no private value.
    """
    scale = noise_multiplier * radius
    epsilon = size / scale if scale > 0.0 else math.inf
    if not 0.0 < epsilon < math.inf:
        raise ValueError(
            "the neighbourhood calibration's epsilon = n/(nu*r) is not positive and finite "
            "(r = 0 without a least radius, or nu*r out of float64's range): refusing a "
            "release without noise"
        )
    return epsilon


def _distance(ref: list[np.ndarray], upd: list[np.ndarray], group: tuple[int, ...]) -> float:
    """Return ‖updated − reference‖₂ over the layers of ``group``, computed in float64."""
    # fsum, as the release invariant computes it: the grid of the release follows from this
    # radius, and the invariant must find the very same one.
    radius = math.sqrt(math.fsum(sum_of_squared_differences(upd[i], ref[i]) for i in group))
    if not math.isfinite(radius):
        raise ValueError("the update norm ‖updated − reference‖ overflows float64")
    return radius
