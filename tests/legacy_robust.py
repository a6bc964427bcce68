"""The robust clusters and persistence residuals as computed before the one-pass version.

A frozen oracle for tests/test_strategies_geometry.py: these are strategies/robust.py's and
strategies/persistence.py's multi-pass functions as they were (each step recomputing the nearest
hypothesis, the offsets, their norms and the clipping radius in float64 from the float32
releases, the persistence residuals as full float64 vectors), copied verbatim. The shared
pass (strategies/geometry.py) must give the same labels and, up to float64 rounding, the same
hypotheses.
"""

from __future__ import annotations

import math

import numpy as np
from flwr.server.strategy.aggregate import aggregate_krum, aggregate_median, aggregate_trimmed_avg

from strategies.aggregation import cluster_means
from strategies.clustering import assign_clusters, nearest_hypothesis
from strategies.robust import (
    MAX_ITERATIONS,
    check_cluster_aggregator,
    clip_offsets,
    cluster_radius,
    trimmed,
)

__all__ = ["cluster_and_aggregate", "residual_units", "robust_clusters"]


def _one_cluster(rows: np.ndarray, method: str, anchor: np.ndarray, radius: float,
                 trust: np.ndarray | None = None) -> np.ndarray:
    """Return the robust aggregate of one cluster's (m, n) releases, in float64.

    ``trust`` (one weight per row) weighs the clipped offsets of ``clipped-mean``.
    """
    m = rows.shape[0]
    if method == "clipped-mean":
        offsets = rows.astype(np.float64) - anchor
        norms = np.linalg.norm(offsets, axis=1)
        clipped = clip_offsets(offsets, norms, cluster_radius(norms, radius))
        if trust is not None and trust.sum() > 0:
            return anchor + (trust[:, None] * clipped).sum(axis=0) / trust.sum()
        return anchor + clipped.mean(axis=0)
    if m <= 2:
        return rows.astype(np.float64).mean(axis=0)
    results = [([row.astype(np.float64)], 1) for row in rows]
    c = trimmed(m)
    if method == "median":
        return np.asarray(aggregate_median(results)[0])
    if method == "trimmed-mean":
        # Flower cuts int(proportion · m) values at each end; (c + 1/4) / m makes that c exactly
        # (and stays below Flower's bound of 1/2, since c ≤ (m − 1)/2).
        return np.asarray(aggregate_trimmed_avg(results, proportiontocut=(c + 0.25) / m)[0])
    if method == "krum":
        return np.asarray(aggregate_krum(results, num_malicious=c, to_keep=m - c)[0])
    raise AssertionError(method)  # checked by robust_cluster_aggregates


def robust_cluster_aggregates(
    released: np.ndarray, labels: np.ndarray, hypotheses: np.ndarray, method: str,
    radius: float = math.inf, trust: np.ndarray | None = None,
) -> np.ndarray:
    """Each cluster's robust aggregate; an empty cluster keeps its hypothesis.

    ``released``, ``labels`` and ``hypotheses`` are as in
    :func:`strategies.aggregation.cluster_means`; ``method`` is ``median``, ``trimmed-mean``
    or ``krum`` (see the module notes); ``radius`` bounds each release's offset from its
    hypothesis (``clipped-mean``, whose clipped offsets ``trust`` weighs, one weight per
    release). Returns a new (k, n) float32 matrix.

    Raises
    ------
    ValueError
        If ``method`` is not one of the robust aggregators (the message names the setting).
    """
    if check_cluster_aggregator(method) == "mean":
        raise ValueError("cluster-aggregator='mean' is aggregate_clusters' budget-weighted mean")
    out = hypotheses.copy()
    for j in range(hypotheses.shape[0]):
        members = np.flatnonzero(labels == j)
        if members.size:
            out[j] = _one_cluster(released[members], method, hypotheses[j].astype(np.float64),
                                  radius, None if trust is None else trust[members]
                                  ).astype(np.float32)
    return out


def _radius(released: np.ndarray, hypotheses: np.ndarray) -> float:
    """Return the clipping radius of ``clipped-mean``.

    The median distance from a release to its nearest hypothesis: the round's own scale, which
    a minority cannot move far.
    """
    labels = nearest_hypothesis(released, hypotheses)
    distances = np.linalg.norm(released.astype(np.float64) - hypotheses[labels], axis=1)
    return float(np.median(distances)) if distances.size else math.inf


def robust_clusters(
    released: np.ndarray, hypotheses: np.ndarray, method: str, trust: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Lloyd's iterations with a robust centroid; return (labels, (k, n) centroids).

    Starts from the hypotheses; only those that attract a release at the start take part (an
    empty cluster keeps its hypothesis); stops when no label changes (at most
    :data:`MAX_ITERATIONS`). A cluster of at most :func:`trimmed` (m) releases keeps its
    hypothesis. ``trust`` is passed to :func:`robust_cluster_aggregates`.
    """
    labels = nearest_hypothesis(released, hypotheses)
    used = np.unique(labels)
    radius = _radius(released, hypotheses)
    centroids = robust_cluster_aggregates(released, labels, hypotheses, method, radius,
                                          trust)
    for _ in range(MAX_ITERATIONS):
        if used.size < 2:
            break
        new = used[nearest_hypothesis(released, centroids[used])]
        if np.array_equal(new, labels):
            break
        labels = new
        centroids = robust_cluster_aggregates(released, labels, hypotheses, method, radius,
                                              trust)
    # A cluster no larger than the share of the round that may lie (trimmed(m)) could be made
    # of rogues only: it keeps its hypothesis (see the module notes).
    sizes = np.bincount(labels, minlength=hypotheses.shape[0])
    few = (sizes > 0) & (sizes <= trimmed(released.shape[0]))
    centroids[few] = hypotheses[few]
    return labels, centroids


def cluster_and_aggregate(
    released: np.ndarray, sigmas: np.ndarray, hypotheses: np.ndarray, *,
    aggregation: str, cluster_aggregator: str, rng: np.random.Generator,
    trust: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Which cluster each release joins, and what each cluster becomes.

    ``cluster_aggregator="mean"``: :func:`strategies.clustering.assign_clusters` (k-means) and
    :func:`strategies.aggregation.cluster_means` with the ``aggregation`` weights (and
    ``rng``). Any other: :func:`robust_clusters`, which ignores the weights (a weight per
    release is what a rogue would declare in its favour: the smallest σ). ``trust`` (one
    weight per release, from the persistence test) weighs ``mean`` and ``clipped-mean``; the
    median, trimmed mean and Krum do not take weights.

    Returns
    -------
    labels : np.ndarray
        (m,) ``intp``: the cluster of each release.
    hypotheses : np.ndarray
        (k, n) float32: the new hypotheses.
    """
    if cluster_aggregator == "mean":
        labels = assign_clusters(released, hypotheses)
        return labels, cluster_means(released, sigmas, labels, hypotheses, aggregation, rng,
                                     trust)
    labels, centroids = robust_clusters(released, hypotheses, cluster_aggregator, trust)
    if cluster_aggregator == "clipped-mean" and aggregation != "mean":
        # The budget weights apply to the clipped releases: clipping bounds what one release
        # can do, the weights still favour the precise ones.
        anchors = hypotheses[labels].astype(np.float64)
        offsets = released.astype(np.float64) - anchors
        norms = np.linalg.norm(offsets, axis=1)
        radius = _radius(released, hypotheses)
        by_cluster = np.zeros(hypotheses.shape[0])
        for j in np.unique(labels):
            by_cluster[j] = cluster_radius(norms[labels == j], radius)
        clipped = (anchors + clip_offsets(offsets, norms, by_cluster[labels])).astype(np.float32)
        weighted = cluster_means(clipped, sigmas, labels, hypotheses, aggregation, rng, trust)
        moved = ~np.all(centroids == hypotheses, axis=1)  # the clusters robust_clusters moved
        centroids[moved] = weighted[moved]
    return labels, centroids


def residual_units(released: np.ndarray, hypotheses: np.ndarray) -> np.ndarray:
    """Return each release's residual in its round, in units of the round's noise (norm ≤ 1).

    Parameters
    ----------
    released : np.ndarray
        (m, n): the round's screened releases.
    hypotheses : np.ndarray
        (k, n): the hypotheses the round sent.

    Returns
    -------
    np.ndarray
        (m, n) float64: (offset − the median offset of the releases nearest the same
        hypothesis) / τ, shrunk to norm 1, τ the median residual norm of the round. Zero rows
        when the round's residuals are all zero (nothing to tell apart).
    """
    rows = released.astype(np.float64)
    labels = nearest_hypothesis(released, hypotheses)
    offsets = rows - hypotheses[labels].astype(np.float64)
    residuals = np.empty_like(offsets)
    for j in np.unique(labels):
        members = labels == j
        residuals[members] = offsets[members] - np.median(offsets[members], axis=0)
    norms = np.linalg.norm(residuals, axis=1)
    tau = float(np.median(norms)) if norms.size else 0.0
    if not tau > 0 or not math.isfinite(tau):
        return np.zeros_like(residuals)
    return residuals / np.maximum(norms / tau, 1.0)[:, None] / tau
