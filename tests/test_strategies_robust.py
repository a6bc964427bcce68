"""Robust cluster aggregators (strategies.robust) and the screening a rogue cannot inflate.

The adaptive rogue of experiments/audits/rogue_devices.py sends, each round, the largest release the
screening accepts; these tests check what one such release does, in process, per round.
"""

from __future__ import annotations

import numpy as np
import pytest

from experiments.audits.rogue_devices import largest_accepted
from strategies import ClusteredStrategy
from strategies.norms import NormLimits, screen_norms
from strategies.robust import cluster_radius, robust_cluster_aggregates, trimmed
from tests.test_strategies_clustered import PLAIN_MEAN, hyp, one_layer, reply, results_of
from tests.test_strategies_norms import NO_SIGMA, laplace_releases

F32 = np.float32
HYPOTHESES = np.array([[5.0, 6.0], [4.0, -4.5]], F32)


def test_trimmed_counts() -> None:
    assert [trimmed(m) for m in range(1, 12)] == [0, 0, 1, 1, 1, 2, 2, 2, 2, 2, 3]


@pytest.mark.parametrize("method", ["median", "trimmed-mean", "krum"])
def test_one_far_release_moves_a_robust_cluster_by_little(method: str) -> None:
    # Prepare: cluster 0 holds 4 releases around (5, 6) and one at 1e6; cluster 1 is empty.
    rows = np.array([[5.0, 6.0], [5.2, 6.1], [4.9, 5.8], [5.1, 6.2], [1e6, 1e6]], F32)
    labels = np.zeros(5, dtype=np.intp)

    # Execute
    out = robust_cluster_aggregates(rows, labels, HYPOTHESES, method)

    # Assert: within the honest releases' range; the empty cluster keeps its hypothesis.
    assert np.all(out[0] >= [4.9, 5.8]) and np.all(out[0] <= [5.2, 6.2])
    np.testing.assert_array_equal(out[1], HYPOTHESES[1])


def test_robust_aggregates_by_hand() -> None:
    rows = np.array([[0.0], [1.0], [2.0], [10.0], [100.0]], F32)
    labels = np.zeros(5, dtype=np.intp)
    one = np.zeros((1, 1), F32)

    assert robust_cluster_aggregates(rows, labels, one, "median")[0, 0] == 2.0
    # c = 1 cut at each end: mean of 1, 2, 10.
    assert robust_cluster_aggregates(rows, labels, one, "trimmed-mean")[0, 0] == pytest.approx(
        13 / 3)
    # Multi-Krum keeps the 4 releases with the smallest scores (100 is far from all): mean 3.25.
    assert robust_cluster_aggregates(rows, labels, one, "krum")[0, 0] == pytest.approx(3.25)
    # Two releases: their mean.
    assert robust_cluster_aggregates(rows[:2], labels[:2], one, "median")[0, 0] == 0.5


def test_clipped_mean_clips_to_the_clusters_own_median_capped_at_three_rounds() -> None:
    # Offsets 0, 1, 2, 10, 100 from 0: the cluster's lower median norm is 2, so 10 and 100 are
    # clipped to 2: mean (0 + 1 + 2 + 2 + 2) / 5 = 1.4 (with the round's radius 10: 4.6).
    rows = np.array([[0.0], [1.0], [2.0], [10.0], [100.0]], F32)
    labels = np.zeros(5, dtype=np.intp)
    one = np.zeros((1, 1), F32)

    assert robust_cluster_aggregates(rows, labels, one, "clipped-mean", 10.0)[0, 0] == \
        pytest.approx(1.4)
    # The cap: with the round's radius 0.5 the cluster's radius is at most 1.5: (0+1+1.5·3)/5.
    assert robust_cluster_aggregates(rows, labels, one, "clipped-mean", 0.5)[0, 0] == \
        pytest.approx(1.1)
    # Fewer than three releases: the round's radius.
    assert cluster_radius(np.array([7.0, 9.0]), 2.0) == 2.0
    assert cluster_radius(np.array([3.0, 1.0, 2.0, 8.0]), 10.0) == 2.0
    assert cluster_radius(np.array([3.0, 1.0, 2.0, 8.0]), 0.5) == 1.5


def test_a_far_cluster_moves_at_its_own_scale() -> None:
    # Cluster 0 settled (offsets 0.1), cluster 1 far from its group (offsets 3 along x): clipped
    # to the round's median distance (0.1) hypothesis 1 would move 0.1; its own radius, 3,
    # capped at 3 × 0.1, lets it move 0.3.
    hyps = np.array([[0.0, 0.0], [10.0, 0.0]], F32)
    rows = np.array([[0.1, 0.0], [0.0, 0.1], [-0.1, 0.0], [0.0, -0.1], [0.1, 0.0],
                     [13.0, 0.0], [13.0, 0.0], [13.0, 0.0]], F32)
    labels = np.array([0, 0, 0, 0, 0, 1, 1, 1], dtype=np.intp)

    out = robust_cluster_aggregates(rows, labels, hyps, "clipped-mean", 0.1)

    np.testing.assert_allclose(out[1], [10.3, 0.0], rtol=1e-6)
    np.testing.assert_allclose(out[0], rows[:5].mean(axis=0), atol=1e-7)


def test_an_unknown_aggregator_names_the_setting() -> None:
    with pytest.raises(ValueError, match="cluster-aggregator must be one of"):
        robust_cluster_aggregates(np.zeros((1, 2), F32), np.zeros(1, np.intp), HYPOTHESES, "x")
    with pytest.raises(ValueError, match="got cluster-aggregator='mode'"):
        ClusteredStrategy(initial_hypotheses=hyp([0.0]), clients_per_round=1,
                          cluster_aggregator="mode")


def test_the_largest_accepted_release_does_not_grow_with_the_rogues_moves() -> None:
    # The measured attack: each round the rogue sends the largest release the screening
    # accepts and the hypotheses move by it (mean aggregation). Under the old rule (scale =
    # max(median, diameter), factor 1000) the accepted distance grew 1.5e3 -> 1.4e12 in five
    # rounds; anchored on the median, it stays at F x the honest distances, round after round.
    rng = np.random.default_rng(7)
    strategy = ClusteredStrategy(initial_hypotheses=hyp([5.0, 6.0], [4.0, -4.5]),
                                 clients_per_round=7, rng=rng, **PLAIN_MEAN)
    accepted = []
    for t in range(1, 6):
        current = one_layer(strategy).astype(F32)
        honest = laplace_releases(rng, current, 6)
        rogue = largest_accepted(honest, current, strategy)
        accepted.append(float(np.min(np.linalg.norm(current - rogue[0], axis=1))))
        replies = [reply(row) for row in honest] + [reply(rogue[0])]
        strategy.aggregate_fit(t, results_of(replies), [])

    assert max(accepted) < 1000 * 10  # F x (honest distances of at most ~10)
    assert max(accepted) / min(accepted) < 10


def test_a_rogue_within_the_bound_barely_moves_a_median_cluster() -> None:
    # Prepare: 6 honest releases near the hypotheses and the largest accepted rogue release.
    rng = np.random.default_rng(8)
    strategy = ClusteredStrategy(initial_hypotheses=hyp([5.0, 6.0], [4.0, -4.5]),
                                 clients_per_round=7, rng=rng, cluster_aggregator="median",
                                 persistence_threshold=0.0)
    honest = laplace_releases(rng, HYPOTHESES, 6)
    rogue = largest_accepted(honest, HYPOTHESES, strategy)

    # Execute
    strategy.aggregate_fit(1, results_of([reply(r) for r in [*honest, rogue[0]]]), [])

    # Assert: the rogue was accepted (it is the worst case) yet no hypothesis left the honest
    # releases' bounding box.
    moved = one_layer(strategy)
    assert np.all(moved >= honest.min(axis=0) - 1e-6) and np.all(moved <= honest.max(axis=0)
                                                                  + 1e-6)


def test_the_screening_refuses_beyond_f_times_the_median() -> None:
    released = np.array([[5.0, 7.0], [5.0, 8.0], [5.0, 9.0], [5.0, 6.0 + 301.0]], F32)
    limits = NormLimits(mechanism="laplace", relative_factor=100.0)

    reasons, distances = screen_norms(released, HYPOTHESES, NO_SIGMA[:4], np.zeros(0), limits)

    # Distances 1, 2, 3, 301: lower median 2, bound 200.
    assert reasons[:3] == [None] * 3
    assert reasons[3] == ("distance 301 to the nearest hypothesis is beyond 100 x the round's "
                          "median 2")
    np.testing.assert_allclose(distances, [1, 2, 3, 301])
