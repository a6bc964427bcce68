"""Budget-aware aggregation weights (section 4 of Wu, Xu, Zhu 2023, plus inverse variance).

Each released vector carries the standard deviation σ_i of its per-coordinate noise (the
``sigma`` metric of a reply). The server turns the σ of the releases it averages into
weights:

``mean``
    002's method A: every release weighs 1/m.
``weighted``
    002's method B (4.1): α_i = ρ_i / Σ_j ρ_j with ρ_i = 1/σ_i.
``inverse-variance``
    ours: α_i ∝ 1/σ_i², the minimum-variance unbiased combination of independent noisy
    estimates of the same vector.
``probability``
    002's method C (4.2): P_i = ρ_i / Σ_j ρ_j (the same numbers as α_i); one ω ~ U[0, 1) is
    drawn per call and release i is kept if P_i > ω; the kept releases are averaged with equal
    weights 1/m' (002: "an arithmetic average operation on the local models from the selected
    clients"). If nobody is kept (ω ≥ max P_i), the release(s) with the largest P_i are kept
    (all of them when tied): this is the smallest change to ω that keeps someone, and it makes
    equal σ give the plain mean whatever ω is. So release i is kept with probability P_i, except
    the most precise one, which is always kept. Since Σ P_i = 1, few releases are kept: on
    average Σ_i P_i = 1 pass the threshold (2 - max P_i counting the fallback), whatever m is,
    unless the σ are equal.

002 computes P_i once over all N clients before training; here the weights are computed over
the releases being averaged (one cluster of one round), since the sampled set changes every round.

σ_i = 0 (a non-private release, mechanism ``none``) under any mode but ``mean``: the weights are
the limit σ_i → 0 of the formulas above, i.e. the non-private releases share all the weight
equally and the noisy ones get none (for ``probability``: exactly the non-private ones are kept).
This never divides by zero and is continuous: a release with a tiny σ already takes nearly all
the weight. A warning is logged the first time this happens in a process for a given mode.
"""

from __future__ import annotations

import logging

import numpy as np

__all__ = ["AGGREGATIONS", "budget_weights", "check_aggregation"]

AGGREGATIONS: tuple[str, ...] = ("mean", "weighted", "probability", "inverse-variance")

_LOG = logging.getLogger(__name__)
# Modes for which the σ = 0 warning has been logged in this process (one line per mode, not per
# round: with non-private clients present it would otherwise repeat every round).
_ZERO_SIGMA_WARNED: set[str] = set()


def check_aggregation(mode: str) -> str:
    """Return ``mode`` if it is one of :data:`AGGREGATIONS`, else raise ``ValueError``."""
    if mode not in AGGREGATIONS:
        raise ValueError(
            f"aggregation must be one of {', '.join(AGGREGATIONS)}; got aggregation={mode!r}"
        )
    return mode


def budget_weights(sigmas: np.ndarray, mode: str, rng: np.random.Generator) -> np.ndarray:
    """Weights for averaging releases whose noise has standard deviations ``sigmas``.

    Parameters
    ----------
    sigmas : np.ndarray
        Shape (m,), m ≥ 1: per-coordinate noise standard deviation of each release (≥ 0, finite).
    mode : str
        One of :data:`AGGREGATIONS` (see the module docstring for the formulas).
    rng : np.random.Generator
        Used by ``probability`` only: exactly one ``rng.uniform()`` (the ω of 002) per call.

    Returns
    -------
    np.ndarray
        Shape (m,), float64, non-negative, summing to 1. A zero weight means the release is not
        used (``probability`` mode, or a noisy release next to non-private ones).

    Raises
    ------
    ValueError
        If ``mode`` is unknown (the message names ``aggregation``), or ``sigmas`` is empty, not
        one-dimensional, negative or not finite.
    """
    check_aggregation(mode)
    s = np.asarray(sigmas, dtype=np.float64)
    if s.ndim != 1 or s.size == 0:
        raise ValueError(f"sigmas must be a non-empty 1-D array, got shape {s.shape}")
    if not np.isfinite(s).all() or (s < 0).any():
        raise ValueError(f"sigmas must be finite and non-negative, got sigmas={s.tolist()}")
    m = s.size
    if mode == "mean":
        return np.full(m, 1.0 / m)

    zero = s == 0.0
    if zero.any():
        if mode not in _ZERO_SIGMA_WARNED:
            _ZERO_SIGMA_WARNED.add(mode)
            _LOG.warning(
                "aggregation=%r: %d of %d releases have sigma=0 (non-private); they share all "
                "the weight and the noisy releases are not used (logged once per process)",
                mode,
                int(zero.sum()),
                m,
            )
        score = zero.astype(np.float64)
    else:
        # ρ_i / max ρ = σ_min / σ_i lies in (0, 1]: no overflow even for tiny σ, and the
        # normalisation below gives the same α_i as ρ_i / Σ ρ_j.
        score = s.min() / s
        if mode == "inverse-variance":
            score = score * score
    p = score / score.sum()
    if mode != "probability":
        return p

    omega = rng.uniform(0.0, 1.0)
    kept = p > omega
    if not kept.any():
        kept = p == p.max()
    return kept / kept.sum()
