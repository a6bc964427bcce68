"""What each cluster becomes: budget-aware weights, cluster means, the sign vote.

Pure functions on NumPy arrays (no Flower), as Flower keeps its averaging in
``flwr/server/strategy/aggregate.py``; the clusters themselves come from
:func:`strategies.clustering.assign_clusters`.

:func:`cluster_means`
    each cluster's weighted mean of its releases; an empty cluster keeps its hypothesis.
:func:`sign_step`
    the stochastic-sign release (k = 1): θ ← θ + η·sign(weighted mean of the signs).
:func:`budget_weights`
    the weights of section 4 of Wu, Xu, Zhu (2023), plus inverse variance (below).

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

from settings import AGGREGATIONS  # declared once, with the setting

__all__ = ["AGGREGATIONS", "budget_weights", "check_aggregation", "cluster_means", "sign_step"]

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


def cluster_means(
    released: np.ndarray,
    sigmas: np.ndarray,
    labels: np.ndarray,
    hypotheses: np.ndarray,
    mode: str,
    rng: np.random.Generator,
    trust: np.ndarray | None = None,
) -> np.ndarray:
    """Budget-weighted mean of each cluster's releases; an empty cluster keeps its hypothesis.

    Parameters
    ----------
    released : np.ndarray
        (m, n) float32: one release per row.
    sigmas : np.ndarray
        (m,): each release's noise standard deviation (see :func:`budget_weights`).
    labels : np.ndarray
        (m,) integers in [0, k): the cluster of each release.
    hypotheses : np.ndarray
        (k, n) float32: the current hypotheses (row j is what an empty cluster j keeps).
    mode : str
        One of :data:`AGGREGATIONS`.
    rng : np.random.Generator
        Passed to :func:`budget_weights` once per non-empty cluster, in increasing cluster
        order (so ``probability`` draws exactly one ω per non-empty cluster, cluster 0 first).
    trust : np.ndarray, optional
        (m,) in (0, 1]: each release's budget weight is multiplied by it, and the cluster's
        weights normalized again (:meth:`strategies.persistence.Persistence.trust`).

    Returns
    -------
    np.ndarray
        (k, n) float32, a new matrix (``hypotheses`` is not modified).
    """
    k = hypotheses.shape[0]
    weights = np.zeros((k, released.shape[0]), dtype=np.float32)
    for j in range(k):
        members = np.flatnonzero(labels == j)
        if members.size:
            weights[j, members] = budget_weights(sigmas[members], mode, rng)
            if trust is not None:
                scaled = weights[j, members] * trust[members].astype(np.float32)
                if scaled.sum() > 0:
                    weights[j, members] = scaled / scaled.sum()
    # One (k × m)·(m × n) product in float32 (a float64 weight matrix would upcast the
    # whole m × n matrix).
    means = weights @ released
    empty = ~weights.any(axis=1)
    means[empty] = hypotheses[empty]
    return means


def sign_step(
    hypotheses: np.ndarray,
    released: np.ndarray,
    sigmas: np.ndarray,
    mode: str,
    rng: np.random.Generator,
    learning_rate: float,
) -> np.ndarray:
    """One majority-vote step of the stochastic-sign release: θ + η·sign(Σ_i α_i s_i).

    Parameters
    ----------
    hypotheses : np.ndarray
        (1, n) float32: the single model θ (the sign release has k = 1).
    released : np.ndarray
        (m, n) float32 of ±1: the released signs s_i.
    sigmas : np.ndarray
        (m,): each release's σ, for the weights α_i of :func:`budget_weights`.
    mode : str
        One of :data:`AGGREGATIONS`.
    rng : np.random.Generator
        Passed to :func:`budget_weights` once.
    learning_rate : float
        η > 0, applied in float32.

    Returns
    -------
    np.ndarray
        (1, n) float32, a new matrix: each coordinate moves by ±η, or stays on a tied vote.
    """
    # float32 weights: the vote stays a float32 product, like the releases.
    weights = budget_weights(sigmas, mode, rng).astype(np.float32)
    vote = weights @ released
    return hypotheses + np.float32(learning_rate) * np.sign(vote)
