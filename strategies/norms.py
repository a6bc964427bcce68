"""How far from the hypotheses a release may plausibly land, and the replies refused beyond it.

A release that passed the form checks (shape, dtype, finite values) can still be absurd: a norm
of 1e12, or values near the float32 maximum, would be averaged into a hypothesis. Each released
vector x (one row of the round's matrix) is measured by d(x) = min_j ‖x − θ_j‖, its distance to
the nearest current hypothesis θ_j (the one it was trained from is at least as far), and refused
when it breaks one of these rules, in order:

1. **Absolute cap**, every mechanism but sign: ‖x‖ ≤ 1e15. Squares stay ≤ 1e30 and k-means'
   sums of squared distances over up to 10⁷ releases stay within float32 (max 3.4e38), and
   cluster means are convex combinations: averaging can neither overflow nor make inf or NaN.
2. **Gaussian mechanism bound**: the release is θ_j̄ + clip(δ) + N(0, σ² I) with ‖clip(δ)‖ ≤ C_Δ
   (C for an L2 clip, C·√n element-wise), so d(x) ≤ C_Δ + σ·(√n + 10) + 1e-6·‖x‖. By Gaussian
   concentration (the norm is 1-Lipschitz) ‖N(0, σ² I_n)‖ exceeds σ(√n + t) with probability at
   most exp(−t²/2): for t = 10, 2·10⁻²², so an honest release is never refused; the last term
   covers the float32 rounding of the release. σ is the reply's declared ``sigma``, itself
   bounded by 1000 × z·(Δ + D), z the noise multiplier of the run's own (ε, δ, releases)
   request, Δ = 2·C_Δ and D the hypotheses' diameter: only a device a thousand times stricter
   than the request could need more (and its release would be pure noise).
3. **Relative rule**, every mechanism but sign: d(x) ≤ F · s, with F the run's
   ``relative_factor`` (:data:`SCREEN_FACTOR` unless a test asks otherwise) and s the lower
   median of the distances of this round's releases (those not already refused) together with
   the releases accepted in the last round that accepted any. Both ends are anchored on what a
   rogue device cannot move: d(x) is measured to the hypotheses the round *sent* (its own
   release cannot move them), and a median moves by one rank per rogue release, however far
   that release lies. (The rule once took s as the larger of that median and the hypotheses'
   diameter, with F = 1000: the diameter includes the hypothesis a rogue moved the round
   before, so an accepted release raised the next round's bound, and one device moved a
   hypothesis from 1.5e3 to 7e14 in five rounds.) The Laplace mechanism has no bound of its
   own: its noise scales with ‖δ‖ (neighbourhood calibration, E‖noise‖ = ν‖δ‖) or is
   unbounded in δ (fixed calibration, no clip). At ν = 5 an honest release lies at
   ≈ (1 + ν)·‖δ‖ from its hypothesis, and ‖δ‖ varies between devices (10-50x within a round in
   the tests, with updates spread over a 100x range; F = 100 refused one in 2,800 there), so
   F = 1000 refuses only a release far beyond any honest one. What a release just inside the
   bound does to a cluster is the aggregator's concern (:mod:`strategies.robust`). A lone
   reply in the very first round has no reference and meets the absolute cap only.

Sign releases must be exactly ±1 (checked where they are read); nothing here applies to them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from strategies.geometry import measure_round

__all__ = ["ABSOLUTE_NORM_CAP", "GAUSSIAN_TAIL", "RELATIVE_FACTOR", "SCREEN_FACTOR", "NormLimits",
           "hypotheses_diameter", "measure", "nearest_distances", "screen_norms"]

#: Rule 1: the largest L2 norm of a release (see the module notes).
ABSOLUTE_NORM_CAP = 1e15
#: Rule 2: how many times the run's request a declared σ may reach.
RELATIVE_FACTOR = 1000.0
#: Rule 3: how many times the round's median distance a release may lie from its hypothesis.
SCREEN_FACTOR = 1000.0
#: Rule 2: t in σ·(√n + t), the Gaussian noise norm's tail (exceeded with probability e^{-t²/2}).
GAUSSIAN_TAIL = 10.0
#: Rule 2: relative room for the float32 rounding of a release (2⁻²⁴ per coordinate, rounded up).
_ROUNDING = 1e-6


@dataclass(frozen=True)
class NormLimits:
    """What the run declares about its releases, for :func:`screen_norms`.

    Attributes
    ----------
    mechanism : str
        ``laplace``, ``gaussian``, ``sign`` or ``none``.
    clip : float
        Gaussian: the clipping bound C of the update.
    clip_mode : str
        Gaussian: ``l2`` (‖clip(δ)‖ ≤ C) or ``elementwise`` (each coordinate: ‖clip(δ)‖ ≤ C√n).
    noise_multiplier : float or None
        Gaussian: z of the run's own request; bounds the declared σ (None: σ is not bounded).
    relative_factor : float
        F of rule 3: the most times the round's median distance a release may lie from its
        nearest hypothesis.
    """

    mechanism: str = "laplace"
    clip: float = 1.0
    clip_mode: str = "l2"
    noise_multiplier: float | None = None
    relative_factor: float = SCREEN_FACTOR

    def clipped_norm(self, n: int) -> float:
        """Return C_Δ, the largest norm of a clipped update of n coordinates."""
        return self.clip * (math.sqrt(n) if self.clip_mode == "elementwise" else 1.0)


def hypotheses_diameter(hypotheses: np.ndarray) -> float:
    """Return the largest distance between two rows of a (k, n) matrix (0 for one)."""
    h = hypotheses.astype(np.float64)
    best = 0.0
    for j in range(1, h.shape[0]):
        best = max(best, float(np.linalg.norm(h[:j] - h[j], axis=1).max()))
    return best


def measure(released: np.ndarray, hypotheses: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return ‖x‖ and d(x) = min_j ‖x − θ_j‖ for each row x of ``released``, in float64.

    Exact differences (not ‖x‖² − 2x·θ + ‖θ‖², whose cancellation would blur small distances),
    over blocks, so that the float64 temporaries stay small whatever the round's size
    (:func:`strategies.geometry.measure_round`).
    """
    geometry = measure_round(released, hypotheses)
    return geometry.norms, geometry.nearest_distances()


def nearest_distances(released: np.ndarray, hypotheses: np.ndarray) -> np.ndarray:
    """Return d(x) = min_j ‖x − θ_j‖ for each row x of ``released``, in float64."""
    return measure(released, hypotheses)[1]


def screen_norms(
    released: np.ndarray,
    hypotheses: np.ndarray,
    sigmas: np.ndarray,
    previous: np.ndarray,
    limits: NormLimits,
    measured: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[list[str | None], np.ndarray]:
    """Refuse the releases whose magnitude the run's mechanism cannot plausibly produce.

    Parameters
    ----------
    released : np.ndarray
        (m, n) float32, the round's releases that passed the form checks.
    hypotheses : np.ndarray
        (k, n), the hypotheses the releases were computed from.
    sigmas : np.ndarray
        (m,) float64, each release's declared σ (NaN where none was declared).
    previous : np.ndarray
        Distances of the releases accepted in the last round that accepted any (rule 3).
    limits : NormLimits
        The run's mechanism and clipping.
    measured : tuple of np.ndarray, optional
        ‖x‖ and d(x) of each release when the caller has measured them already
        (:class:`strategies.geometry.RoundGeometry`); otherwise :func:`measure` measures them.

    Returns
    -------
    reasons : list of str or None
        Per release, why it is refused (naming the rule and the numbers), or None.
    distances : np.ndarray
        (m,) float64, d(x) of every release (the accepted ones feed the next round's rule 3).
    """
    m, n = released.shape
    reasons: list[str | None] = [None] * m
    if limits.mechanism == "sign" or m == 0:
        return reasons, np.zeros(m)
    norms, distances = measured if measured is not None else measure(released, hypotheses)
    for i in range(m):
        if norms[i] > ABSOLUTE_NORM_CAP:
            reasons[i] = (f"norm {norms[i]:.3g} is beyond the absolute cap "
                          f"{ABSOLUTE_NORM_CAP:.0e} (averaging must stay within float32)")
    if limits.mechanism == "gaussian":
        c_delta = limits.clipped_norm(n)
        diameter = hypotheses_diameter(hypotheses)
        sigma_cap = (None if limits.noise_multiplier is None else
                     RELATIVE_FACTOR * limits.noise_multiplier * (2 * c_delta + diameter))
        for i in range(m):
            if reasons[i] is not None:
                continue
            sigma = float(sigmas[i])
            if not math.isfinite(sigma):
                reasons[i] = "a gaussian release must declare its sigma"
                continue
            if sigma_cap is not None and sigma > sigma_cap:
                reasons[i] = (f"declared sigma {sigma:.3g} is beyond {RELATIVE_FACTOR:g} x the "
                              f"run's z*(Delta + D) = {sigma_cap / RELATIVE_FACTOR:.3g}")
                continue
            bound = c_delta + sigma * (math.sqrt(n) + GAUSSIAN_TAIL) + _ROUNDING * norms[i]
            if distances[i] > bound:
                reasons[i] = (f"distance {distances[i]:.3g} to the nearest hypothesis is beyond "
                              f"the gaussian bound C + sigma*(sqrt(n) + 10) = {bound:.3g}")
    ok = np.array([r is None for r in reasons])
    pool = np.concatenate([distances[ok], np.asarray(previous, dtype=np.float64)])
    if pool.size:
        scale = float(np.sort(pool)[(pool.size - 1) // 2])
        factor = limits.relative_factor
        if scale > 0:
            for j in np.flatnonzero(ok).tolist():
                if distances[j] > factor * scale:
                    reasons[j] = (f"distance {distances[j]:.3g} to the nearest hypothesis is "
                                  f"beyond {factor:g} x the round's median {scale:.3g}")
    return reasons, distances
