"""Which cluster each release joins: k-means seeded with the current hypotheses.

Pure functions on NumPy arrays (no Flower), as Flower keeps its averaging in
``flwr/server/strategy/aggregate.py``. :func:`assign_clusters` is the clustering step of
Algorithm 1: centroid j starts at hypothesis j and stays its index, so label j means "this
release updates hypothesis j". What each cluster then becomes is
:func:`strategies.aggregation.cluster_means`.

Empty clusters: k-means runs only over the hypotheses that attract at least one release at the
start (by nearest hypothesis). A hypothesis that attracts none is an empty cluster and keeps its
value. scikit-learn would otherwise move an empty centroid onto the farthest point, which under
local noise is the noisiest release of the round, and a hypothesis that jumps there is then
chosen by no client again. (With ν = 5 on the synthetic task this relocation alone sent
hypotheses 5-7 units away in most runs.)
"""

from __future__ import annotations

import logging
import warnings

import numpy as np

__all__ = ["assign_clusters", "load_kmeans", "nearest_hypothesis", "seeded_kmeans"]

_LOG = logging.getLogger(__name__)

#: Numbers per float64 block of :func:`nearest_hypothesis` (8 MiB).
_BLOCK_NUMBERS = 1 << 20


def nearest_hypothesis(released: np.ndarray, hypotheses: np.ndarray) -> np.ndarray:
    """Index of the nearest hypothesis (Euclidean) for each released vector.

    Parameters
    ----------
    released : np.ndarray
        (m, n): one release per row.
    hypotheses : np.ndarray
        (k, n): one hypothesis per row.

    Returns
    -------
    np.ndarray
        (m,) ``intp`` in [0, k); a tie goes to the lowest index.
    """
    # ‖x − h‖² = ‖x‖² − 2x·h + ‖h‖²; ‖x‖² does not change the argmin, so it is not computed.
    # In float64, over blocks of columns: a float64 copy of all m releases (800 MB for 100
    # replies of 10^6 parameters) is never held, only m × (block) numbers at a time.
    m, n = released.shape
    scores = np.zeros((m, hypotheses.shape[0]), dtype=np.float64)
    columns = max(1, _BLOCK_NUMBERS // max(m, hypotheses.shape[0]))
    for start in range(0, n, columns):
        h = hypotheses[:, start:start + columns].astype(np.float64)
        x = released[:, start:start + columns].astype(np.float64)
        scores += np.einsum("ij,ij->i", h, h)[None, :] - 2.0 * (x @ h.T)
    return np.argmin(scores, axis=1).astype(np.intp)


def load_kmeans() -> None:
    """Import scikit-learn's k-means now rather than in the first round's aggregation.

    The import costs 1-2 s (SciPy included). The ServerApp calls this while it starts, so that
    round 1 does not pay it on top of its clients; ``import strategies`` itself stays light.
    """
    from sklearn.cluster import KMeans  # noqa: F401


def seeded_kmeans(released: np.ndarray, init: np.ndarray) -> np.ndarray:
    """Labels of scikit-learn's k-means (Lloyd) on ``released``, started from the rows of ``init``.

    Parameters
    ----------
    released : np.ndarray
        (m, n) with m ≥ number of rows of ``init`` (scikit-learn's requirement).
    init : np.ndarray
        (c, n): the starting centroids; label i refers to row i.

    Returns
    -------
    np.ndarray
        (m,) ``intp`` in [0, c). Deterministic: one initialisation, no random restarts.

    Notes
    -----
    scikit-learn's ``ConvergenceWarning`` (fewer distinct points than clusters, e.g. identical
    replies) is expected here and logged at INFO instead of being raised as a warning.
    """
    # Imported here: sklearn costs ~2 s to import, and only the ServerApp needs it (which
    # imports it as it starts: load_kmeans).
    from sklearn.cluster import KMeans
    from sklearn.exceptions import ConvergenceWarning

    # tol=0: stop when the assignment stops changing (which Lloyd's algorithm reaches),
    # and it spares sklearn's np.var(X, axis=0), a temporary as large as the data.
    # copy_x=True (the default): sklearn centres a copy, so the releases stay exact.
    kmeans = KMeans(n_clusters=init.shape[0], init=init, n_init=1, tol=0.0, copy_x=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        kmeans.fit(released)
    for warning in caught:
        _LOG.info("k-means: %s", warning.message)
    return np.asarray(kmeans.labels_, dtype=np.intp)


def assign_clusters(released: np.ndarray, hypotheses: np.ndarray) -> np.ndarray:
    """Cluster index of each released vector; centroid j starts at, and is, hypothesis j.

    Parameters
    ----------
    released : np.ndarray
        (m, n) float32: one release per row.
    hypotheses : np.ndarray
        (k, n) float32: the current hypotheses, k ≥ 1.

    Returns
    -------
    np.ndarray
        (m,) ``intp`` in [0, k). With k = 1 all zeros. Otherwise each release's nearest
        hypothesis, refined by :func:`seeded_kmeans` over the hypotheses that attract at least
        one release (see the module notes) when at least two do and there are more releases
        than such hypotheses; a hypothesis that attracts none gets no release.
    """
    k = hypotheses.shape[0]
    m = released.shape[0]
    if k == 1:
        return np.zeros(m, dtype=np.intp)
    start = nearest_hypothesis(released, hypotheses)
    used = np.unique(start)
    # One attracting hypothesis: nothing to refine. m = (attracting hypotheses): each holds
    # exactly one release, which k-means would not move.
    if used.size < 2 or m <= used.size:
        return start
    return used[seeded_kmeans(released, hypotheses[used])]
