"""Robust cluster aggregators: what a cluster becomes when some of its members may lie.

The budget-weighted mean (:func:`strategies.aggregation.cluster_means`) lets one release move
its cluster's hypothesis by (its distance) / (cluster size): a device that charges its ledger
honestly but releases far from its hypothesis, within what the screening accepts
(:mod:`strategies.norms`), drags the hypothesis that far every round. The aggregators here bound
what a minority of a cluster can do, each cluster on its own (k-means has already split the
round's releases), with Flower's own functions (``flwr.server.strategy.aggregate``):

``median``
    FedMedian: the coordinate-wise median of the cluster's releases.
``trimmed-mean``
    FedTrimmedAvg: per coordinate, the mean after dropping the c largest and the c smallest
    values, c = ⌈:data:`ROBUST_FRACTION` · m⌉ (at least one while m ≥ 3).
``krum``
    Multi-Krum, adapted to noisy releases: Krum alone returns *one* release, and under local
    noise one release carries the whole noise of one device (ν = 5: five times its update), so
    the m − c releases with the best Krum scores (c as above) are averaged instead.
``clipped-mean``
    Centred clipping: each release's offset from the hypothesis it joins is shrunk to at most
    its cluster's radius, then the cluster's mean is taken, with the ``aggregation`` weights.
    The radius is the lower median of the cluster's own offset norms (a scale a minority moves
    by one rank per release), at most :data:`CLIP_CAP` times the round's median distance from a
    release to its nearest hypothesis (anchored on the hypotheses the round sent, and on the
    whole round's releases, which a cluster's rogues cannot outvote); clusters of one or two
    releases use the round's median. One release moves its hypothesis by at most
    (radius) / m, whatever it holds; honest releases lose their noisiest tails, so the mean is
    *less* noisy than without clipping. A cluster's own scale matters: a hypothesis far from
    its group draws releases farther than the round's median (their updates are larger, and
    so is their noise under the neighbourhood calibration), and clipped to the round's median
    they crawled towards it (2 of 10 runs without rogues ended over 1 from an optimum after 80
    rounds, measured with ``python -m experiments rogue-devices --quick`` while the radius was
    the round's); the cap keeps two colluding rogues in a small
    cluster from setting its radius themselves.

No aggregator of one round can do better than a bias of about (share of rogues) × (noise of one
release) against a rogue that stays within the honest releases' spread: under local noise
(ν = 5: a release's noise is about five times its update) one rogue among five members of a
cluster pulls as hard as the four honest updates together, and can drag a hypothesis away over
many rounds. docs/RESULTS.md ("Rogue devices") measures how far each aggregator holds.

The clusters themselves are made robust the same way: k-means (Lloyd) moves each centroid to
its cluster's *mean*, so a release far outside, accepted by the screening, becomes a cluster of
its own in a few iterations and the honest releases of two hypotheses merge into the other one
(seen with one rogue among six devices: a hypothesis at (14, 100) and the other halfway between
the optima). :func:`robust_clusters` runs Lloyd's iterations with the robust aggregate in place
of the mean (k-medians for ``median``), from the hypotheses, over the hypotheses that attract at
least one release (as :func:`strategies.clustering.assign_clusters` does).

A cluster no larger than the share of the round that may lie (c = ⌈0.2·m⌉ of the round's m
releases, see :func:`trimmed`) keeps its hypothesis: it could be made of rogues only. Without
this rule one rogue took over the hypothesis that no honest device chose in the first rounds
(a cluster of one release, which the median leaves where the rogue put it) and dragged it away
round after round. The cost: a hypothesis needs more than c devices before it moves. Such a
cluster also counts as empty for re-seeding (``reseed-after``,
:func:`strategies.server_update.dead_hypotheses`): otherwise the rogue's one release a round
kept the hypothesis that no honest device chose from ever being re-seeded, and every honest
device shared the other one.

A cluster of one or two releases has nothing to vote with: its mean is used (two values have
the mean as their median). An empty cluster keeps its hypothesis, as with the mean.

What ``clipped-mean`` costs the server: two reads of the round's (m, n) matrix. The first is the
screening's own pass (:func:`strategies.geometry.measure_round`), which also yields everything
the clusters need: the exact distance from each release to each hypothesis (a release's offset
norm in cluster j, since cluster j is anchored on hypothesis j whatever the iteration), the
round's median distance (the clipping radius), and the Gram matrix of the releases and
hypotheses. A clipped-mean centroid is θ_j + Σ_i a_ij (x_i − θ_j), a combination of those rows,
so Lloyd's iterations compare distances through the Gram matrix, in (m + k)² numbers, however
large n is; the second read makes the final centroids, once. The other aggregators compute their
centroids each iteration (a median is no combination of rows).

Robustness costs accuracy under local noise: the median of m noisy values is noisier than
their mean (by ≈ √(π/2) for Gaussian noise), and trimming or Krum's selection drop honest
releases. docs/RESULTS.md measures that cost and the gain against rogue devices.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from flwr.server.strategy.aggregate import aggregate_krum, aggregate_median, aggregate_trimmed_avg

from settings import CLUSTER_AGGREGATORS  # declared once, with the setting
from strategies.aggregation import budget_weights, cluster_means
from strategies.clustering import assign_clusters, nearest_hypothesis
from strategies.geometry import RoundGeometry, measure_round

__all__ = ["CLIP_CAP", "CLUSTER_AGGREGATORS", "ROBUST_FRACTION", "check_cluster_aggregator",
           "clip_offsets", "cluster_and_aggregate", "cluster_radius", "lower_median",
           "robust_cluster_aggregates", "robust_clusters", "trimmed"]

#: The share of a cluster the trimmed mean and Krum assume may lie (rounded up): 1 in 5.
ROBUST_FRACTION = 0.2
#: The most Lloyd iterations of :func:`robust_clusters` (they stop once no label changes).
MAX_ITERATIONS = 50
#: ``clipped-mean``: how many times the round's median distance a cluster's radius may reach.
CLIP_CAP = 3.0
#: float64 values per block of columns when the centroids are made (~32 MiB at a time).
_BLOCK = 1 << 22


def check_cluster_aggregator(method: str) -> str:
    """Return ``method`` if it is one of :data:`CLUSTER_AGGREGATORS`, else raise ValueError."""
    if method not in CLUSTER_AGGREGATORS:
        raise ValueError(f"cluster-aggregator must be one of {', '.join(CLUSTER_AGGREGATORS)}; "
                         f"got cluster-aggregator={method!r}")
    return method


def trimmed(m: int) -> int:
    """Return c, the releases cut at each end (trimmed mean) or dropped (Krum) of m releases.

    ⌈0.2·m⌉, and fewer than half: at least one release always remains in the middle.
    """
    if m < 3:
        return 0
    return min(math.ceil(ROBUST_FRACTION * m), (m - 1) // 2)


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


def lower_median(norms: np.ndarray) -> float:
    """Return the lower median of a non-empty vector (a value it holds: one rank per outlier)."""
    return float(np.sort(norms)[(norms.size - 1) // 2])


def clip_offsets(offsets: np.ndarray, norms: np.ndarray, radius: float | np.ndarray
                 ) -> np.ndarray:
    """Return ``offsets`` (rows) each shrunk to norm at most ``radius`` (one, or one per row)."""
    return offsets * np.minimum(1.0, radius / np.maximum(norms, 1e-300))[:, None]


def cluster_radius(norms: np.ndarray, radius: float) -> float:
    """Return a cluster's ``clipped-mean`` radius from its offsets' norms and the round's radius.

    The lower median of ``norms``, at most :data:`CLIP_CAP` · ``radius``; ``radius`` itself
    for fewer than three releases (see the module notes).
    """
    if norms.size < 3:
        return radius
    return min(lower_median(norms), CLIP_CAP * radius)


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


def _round_radius(geometry: RoundGeometry) -> float:
    """Return the clipping radius of ``clipped-mean``.

    The median distance from a release to its nearest hypothesis: the round's own scale, which
    a minority cannot move far.
    """
    distances = geometry.nearest_distances()
    return float(np.median(distances)) if distances.size else math.inf


@dataclass
class _Clipped:
    """Each cluster's ``clipped-mean`` as a combination of the round's rows.

    Centroid j is θ_j + Σ_i a_ij (x_i − θ_j), a_ij = (weight of i) · (its clip factor): a
    linear combination of the releases and the hypotheses, so its distance to every release
    follows from the Gram matrix (:meth:`scores`) without touching the (m, n) matrix, and the
    centroids themselves are computed once, at the end (:meth:`centroids`).
    """

    members: dict[int, tuple[np.ndarray, np.ndarray]]  # cluster -> (rows, a)

    def matrix(self, m: int, k: int) -> np.ndarray:
        """Return C, (k, m + k): centroid j = C[j] · [X; Θ] (an empty cluster: θ_j)."""
        c = np.zeros((k, m + k))
        c[np.arange(k), m + np.arange(k)] = 1.0
        for j, (rows, a) in self.members.items():
            c[j, rows] = a
            c[j, m + j] = 1.0 - a.sum()
        return c

    def scores(self, gram: np.ndarray, m: int, k: int) -> np.ndarray:
        """Return (m, k): ‖c_j‖² − 2 x_i·c_j, which orders ‖x_i − c_j‖ for each release."""
        c = self.matrix(m, k)
        products = gram[:m] @ c.T
        return np.einsum("jp,pq,jq->j", c, gram, c)[None, :] - 2.0 * products

    def centroids(self, released: np.ndarray, hypotheses: np.ndarray) -> np.ndarray:
        """Return the (k, n) float32 centroids (an empty cluster: its hypothesis).

        float64 over blocks of columns: the offsets x − θ and their weighted sum are exact to
        float64 before the one rounding to float32, as when each cluster was averaged apart.
        """
        out = hypotheses.astype(np.float32, copy=True)
        n = released.shape[1]
        step = max(1, _BLOCK // max(released.shape[0], 1))
        for start in range(0, n, step):
            stop = min(n, start + step)
            for j, (rows, a) in self.members.items():
                anchor = hypotheses[j, start:stop].astype(np.float64)
                offsets = released[rows, start:stop].astype(np.float64) - anchor
                out[j, start:stop] = anchor + a @ offsets
        return out


def _clip_factors(distances: np.ndarray, radius: float) -> np.ndarray:
    """Return min(1, r / ‖offset‖) of each member of one cluster, r its :func:`cluster_radius`."""
    return np.minimum(1.0, cluster_radius(distances, radius) / np.maximum(distances, 1e-300))


def _clipped(geometry: RoundGeometry, labels: np.ndarray, radius: float,
             weights: Callable[[np.ndarray], np.ndarray]) -> _Clipped:
    """Return each non-empty cluster's clipped mean, ``weights(rows)`` weighing its members."""
    members: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for j in np.unique(labels).tolist():
        rows = np.flatnonzero(labels == j)
        # The offsets' norms are the screening's exact distances to hypothesis j: the anchor
        # of cluster j is θ_j whatever the iteration.
        members[j] = rows, weights(rows) * _clip_factors(geometry.distances[rows, j], radius)
    return _Clipped(members)


def _trust_or_equal(trust: np.ndarray | None) -> Callable[[np.ndarray], np.ndarray]:
    """Return the weights of ``clipped-mean``'s iterations: ``trust`` normalized, or 1/m."""
    def weights(rows: np.ndarray) -> np.ndarray:
        if trust is not None and trust[rows].sum() > 0:
            return trust[rows] / trust[rows].sum()
        return np.full(rows.size, 1.0 / rows.size)
    return weights


def _clipped_lloyd(geometry: RoundGeometry, labels: np.ndarray, used: np.ndarray,
                   radius: float, trust: np.ndarray | None) -> tuple[np.ndarray, _Clipped]:
    """Lloyd's iterations of ``clipped-mean`` on the Gram matrix.

    Returns the final labels and their clusters' combination (weighted by ``trust``).
    """
    assert geometry.gram is not None
    m, k = geometry.distances.shape
    weights = _trust_or_equal(trust)
    combination = _clipped(geometry, labels, radius, weights)
    for _ in range(MAX_ITERATIONS):
        if used.size < 2:
            break
        scores = combination.scores(geometry.gram, m, k)
        new = used[np.argmin(scores[:, used], axis=1)]
        if np.array_equal(new, labels):
            break
        labels = new
        combination = _clipped(geometry, labels, radius, weights)
    return labels, combination


def _few(labels: np.ndarray, k: int, m: int) -> np.ndarray:
    """Return which clusters hold at least one and at most :func:`trimmed` (m) releases."""
    sizes = np.bincount(labels, minlength=k)
    return (sizes > 0) & (sizes <= trimmed(m))


def robust_clusters(
    released: np.ndarray, hypotheses: np.ndarray, method: str, trust: np.ndarray | None = None,
    geometry: RoundGeometry | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Lloyd's iterations with a robust centroid; return (labels, (k, n) centroids).

    Starts from the hypotheses; only those that attract a release at the start take part (an
    empty cluster keeps its hypothesis); stops when no label changes (at most
    :data:`MAX_ITERATIONS`). A cluster of at most :func:`trimmed` (m) releases keeps its
    hypothesis. ``trust`` is passed to :func:`robust_cluster_aggregates`. ``geometry``: the
    round's :func:`strategies.geometry.measure_round` of these rows (with the Gram matrix for
    ``clipped-mean``), or None to measure them here.

    ``clipped-mean`` runs its iterations on the Gram matrix (a centroid is a combination of
    the rows, :class:`_Clipped`) and makes the centroids once, at the end; the other methods
    compute each iteration's centroids (a median is no combination of rows).
    """
    check_cluster_aggregator(method)
    k, m = hypotheses.shape[0], released.shape[0]
    clipped = method == "clipped-mean"
    if geometry is None or (clipped and geometry.gram is None):
        geometry = measure_round(released, hypotheses, gram=clipped)
    labels = geometry.nearest()
    used = np.unique(labels)
    radius = _round_radius(geometry)
    if clipped:
        labels, combination = _clipped_lloyd(geometry, labels, used, radius, trust)
        # A cluster no larger than the share of the round that may lie (trimmed(m)) could be
        # made of rogues only: it keeps its hypothesis (see the module notes).
        for j in np.flatnonzero(_few(labels, k, m)).tolist():
            del combination.members[j]
        return labels, combination.centroids(released, hypotheses)
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
    few = _few(labels, k, m)
    centroids[few] = hypotheses[few]
    return labels, centroids


def cluster_and_aggregate(
    released: np.ndarray, sigmas: np.ndarray, hypotheses: np.ndarray, *,
    aggregation: str, cluster_aggregator: str, rng: np.random.Generator,
    trust: np.ndarray | None = None, geometry: RoundGeometry | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Which cluster each release joins, and what each cluster becomes.

    ``cluster_aggregator="mean"``: :func:`strategies.clustering.assign_clusters` (k-means) and
    :func:`strategies.aggregation.cluster_means` with the ``aggregation`` weights (and
    ``rng``). Any other: :func:`robust_clusters`, which ignores the weights (a weight per
    release is what a rogue would declare in its favour: the smallest σ). ``trust`` (one
    weight per release, from the persistence test) weighs ``mean`` and ``clipped-mean``; the
    median, trimmed mean and Krum do not take weights. ``geometry``: the round's
    :func:`strategies.geometry.measure_round` of these rows, shared with the screening and
    the persistence test (None: measured here when needed).

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
    if cluster_aggregator != "clipped-mean" or aggregation == "mean":
        return robust_clusters(released, hypotheses, cluster_aggregator, trust, geometry)
    # The budget weights apply to the clipped releases: clipping bounds what one release can
    # do, the weights still favour the precise ones. The clusters are robust_clusters'; each
    # one it moves becomes the weighted mean of its clipped releases.
    if geometry is None or geometry.gram is None:
        geometry = measure_round(released, hypotheses, gram=True)
    k, m = hypotheses.shape[0], released.shape[0]
    radius = _round_radius(geometry)
    start = geometry.nearest()
    labels, _ = _clipped_lloyd(geometry, start, np.unique(start), radius, trust)
    weights: dict[int, np.ndarray] = {}
    for j in np.unique(labels).tolist():
        # Every non-empty cluster draws its weights in increasing order, as cluster_means does
        # (``probability`` draws one ω per non-empty cluster, the few-member ones included).
        rows = np.flatnonzero(labels == j)
        alpha = budget_weights(sigmas[rows], aggregation, rng)
        if trust is not None:
            scaled = alpha * trust[rows]
            if scaled.sum() > 0:
                alpha = scaled / scaled.sum()
        weights[j] = alpha
    combination = _clipped(geometry, labels, radius, lambda rows: weights[int(labels[rows[0]])])
    for j in np.flatnonzero(_few(labels, k, m)).tolist():
        del combination.members[j]
    return labels, combination.centroids(released, hypotheses)
