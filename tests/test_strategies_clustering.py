"""strategies.clustering: nearest hypothesis and k-means seeded with the hypotheses, on NumPy
arrays alone (no Flower). Expected labels are worked out by hand in the comments."""

import logging

import numpy as np
import pytest

from strategies.clustering import assign_clusters, nearest_hypothesis, seeded_kmeans

F32 = np.float32


def rows(*values: list[float]) -> np.ndarray:
    return np.asarray(values, dtype=F32)


def test_nearest_hypothesis_by_euclidean_distance() -> None:
    # Prepare: hypotheses (0, 0) and (10, 0); (4, 9) is at √97 from the first, √117 from the
    # second; (6, -9) the other way round; (5, 0) is a tie, which goes to the lower index.
    released = rows([4, 9], [6, -9], [5, 0])
    hypotheses = rows([0, 0], [10, 0])

    # Execute
    labels = nearest_hypothesis(released, hypotheses)

    # Assert
    assert labels.tolist() == [0, 1, 0]
    assert labels.dtype == np.intp


def test_one_hypothesis_takes_every_release() -> None:
    # Prepare
    released = rows([1, 2], [-50, 7], [3, 3])

    # Execute
    labels = assign_clusters(released, rows([100, 100]))

    # Assert
    assert labels.tolist() == [0, 0, 0]


def test_kmeans_moves_a_release_away_from_its_nearest_hypothesis() -> None:
    # Prepare: hypotheses 0 and 4 on a line; releases 1, 2.1, 10. Nearest: {1} and {2.1, 10}
    # (centres 1 and 6.05); the next Lloyd step moves 2.1 (|2.1 - 1| < |2.1 - 6.05|) to the
    # first centre: {1, 2.1} → 1.55 and {10} → 10, which is stable.
    released = rows([1.0], [2.1], [10.0])
    hypotheses = rows([0.0], [4.0])

    # Execute
    start = nearest_hypothesis(released, hypotheses)
    labels = assign_clusters(released, hypotheses)

    # Assert
    assert start.tolist() == [0, 1, 1]
    assert labels.tolist() == [0, 0, 1]


def test_a_hypothesis_nearest_to_no_release_gets_none_even_with_enough_releases() -> None:
    # Prepare: m = 5 ≥ k = 2, all nearest to (0, 0); plain k-means would move the empty
    # centroid (40, 40) onto the farthest release (15, 0). Here it stays empty.
    released = rows([0, 0], [1, 0], [2, 0], [2, 0], [15, 0])

    # Execute
    labels = assign_clusters(released, rows([0, 0], [40, 40]))

    # Assert
    assert labels.tolist() == [0, 0, 0, 0, 0]


def test_kmeans_runs_over_the_attracting_hypotheses_only_and_keeps_their_indices() -> None:
    # Prepare: hypothesis 1 (at 100) attracts nothing; hypotheses 0 and 2 (at 0 and 4) play
    # the k = 2 example above, so the labels are those of hypotheses 0 and 2, never 1.
    released = rows([1.0], [2.1], [10.0])
    hypotheses = rows([0.0], [100.0], [4.0])

    # Execute
    labels = assign_clusters(released, hypotheses)

    # Assert
    assert labels.tolist() == [0, 0, 2]


def test_fewer_releases_than_hypotheses_stay_with_their_nearest() -> None:
    # Prepare: k = 3, m = 2 (scikit-learn's KMeans needs m ≥ k): no k-means.
    released = rows([19, 21], [1, 1])

    # Execute
    labels = assign_clusters(released, rows([0, 0], [10, 10], [20, 20]))

    # Assert
    assert labels.tolist() == [2, 0]


def test_seeded_kmeans_logs_instead_of_warning_on_identical_releases(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Prepare: 3 identical points, 2 centroids: scikit-learn's ConvergenceWarning (which
    # filterwarnings=error would turn into a failure) becomes one INFO line.
    released = rows([1, 1], [1, 1], [1, 1])

    # Execute
    with caplog.at_level(logging.INFO, logger="strategies.clustering"):
        labels = seeded_kmeans(released, rows([0, 0], [9, 9]))

    # Assert
    assert labels.tolist() == [0, 0, 0]
    assert any(r.message.startswith("k-means: ") for r in caplog.records)


def test_assign_clusters_does_not_modify_its_inputs() -> None:
    # Prepare
    released = rows([1.0], [2.1], [10.0])
    hypotheses = rows([0.0], [4.0])
    before = (released.copy(), hypotheses.copy())

    # Execute
    assign_clusters(released, hypotheses)

    # Assert
    np.testing.assert_array_equal(released, before[0])
    np.testing.assert_array_equal(hypotheses, before[1])
