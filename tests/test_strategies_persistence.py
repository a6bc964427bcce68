"""The persistence test: honest noise averages out over rounds, a push does not.

Seeded statistical tests on synthetic residuals (no federation); experiments/audits/rogue_devices.py
measures the test against an adaptive rogue in federations of real clients.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from strategies.persistence import Persistence, residual_units


def test_residual_units_remove_the_cluster_drift_and_have_norm_at_most_one() -> None:
    rng = np.random.default_rng(0)
    hypotheses = np.array([[0.0, 0.0, 0.0], [100.0, 100.0, 100.0]])
    drift = np.array([3.0, -2.0, 1.0])
    rows = np.vstack([hypotheses[0] + drift + rng.normal(size=(6, 3)),
                      hypotheses[1] - drift + rng.normal(size=(5, 3)),
                      hypotheses[0] + drift + [40.0, 0.0, 0.0]])

    units = residual_units(rows.astype(np.float32), hypotheses)

    norms = np.linalg.norm(units, axis=1)
    assert norms.max() <= 1.0 + 1e-12
    # The far release is shrunk to norm 1 and points the way it was pushed; the common drift
    # of each cluster is gone (the median residual of a cluster is ~0).
    assert units[-1] == pytest.approx([1.0, 0.0, 0.0], abs=0.05)
    assert np.abs(np.median(units[:6], axis=0)).max() < 0.35
    assert residual_units(np.zeros((3, 3), np.float32), hypotheses[:1]).tolist() == [[0.0] * 3] * 3


@pytest.mark.parametrize("dimension", [2, 50])
def test_honest_devices_are_not_set_aside(dimension: int) -> None:
    # 200 honest devices x 80 rounds of unit-bounded zero-mean residuals, c = 4. Pinelis'
    # bound: P(a device is ever set aside) <= 80 * 2 exp(-8) = 0.054 per device, far less in
    # practice; the test allows 2 of 200 (seeded: it either always passes or always fails).
    rng = np.random.default_rng(1)
    persistence = Persistence(threshold=4.0)
    names = [f"d{i}" for i in range(200)]
    for t in range(1, 81):
        noise = rng.laplace(size=(200, dimension))
        units = noise / np.maximum(np.linalg.norm(noise, axis=1, keepdims=True) /
                                   np.median(np.linalg.norm(noise, axis=1)), 1.0)
        units /= np.median(np.linalg.norm(noise, axis=1))
        persistence.update(t, names, units)
    assert len(persistence.set_aside) <= 2


def test_a_device_that_pushes_the_same_way_is_set_aside_once_it_can_be() -> None:
    rng = np.random.default_rng(2)
    persistence = Persistence(threshold=4.0)
    push = np.array([1.0, 0.0])
    rounds = []
    for t in range(1, 41):
        honest = rng.normal(size=(9, 2))
        honest /= np.maximum(np.linalg.norm(honest, axis=1, keepdims=True), 1.0)
        if persistence.update(t, ["rogue", *(f"d{i}" for i in range(9))],
                              np.vstack([push, honest])):
            rounds.append(t)
    # ||S|| = n reaches 4 sqrt(n) at n = 16, and not before.
    assert persistence.set_aside == {"rogue": 16} and rounds == [16]
    assert persistence.statistic("rogue") == pytest.approx(math.sqrt(16))


def test_off_and_round_trip() -> None:
    off = Persistence(threshold=0.0)
    assert off.update(1, ["a"], np.ones((1, 2))) == [] and off.sums == {}
    on = Persistence(threshold=1.0)
    on.update(3, ["a", "b"], np.array([[1.0, 0.0], [0.0, 0.5]]))
    again = Persistence(threshold=1.0)
    again.load_dict(on.to_dict())
    assert again.set_aside == on.set_aside == {"a": 3}
    assert again.statistic("b") == on.statistic("b") == 0.5


def test_trust_falls_with_the_statistic_and_weighs_each_release_in_its_cluster() -> None:
    from strategies.aggregation import cluster_means
    from strategies.robust import cluster_and_aggregate

    persistence = Persistence(threshold=2.0)
    persistence.update(1, ["a", "b"], np.array([[1.0, 0.0], [0.0, 0.0]]))
    # ‖S‖/√n = 1 for a: 1 − (1/2)² = 0.75; b has summed nothing that leans: 1. Off: 1.
    assert persistence.trust("a") == pytest.approx(0.75) and persistence.trust("b") == 1.0
    assert Persistence(threshold=0.0).trust("a") == 1.0

    # The mean: releases 0 and 10 weighted 1 and 0.25 → (0 + 2.5) / 1.25 = 2.
    rows = np.array([[0.0], [10.0]], np.float32)
    hypotheses = np.zeros((1, 1), np.float32)
    labels = np.zeros(2, np.intp)
    rng = np.random.default_rng(0)
    trust = np.array([1.0, 0.25])
    assert cluster_means(rows, np.zeros(2), labels, hypotheses, "mean", rng, trust)[0, 0] == (
        pytest.approx(2.0))
    assert cluster_means(rows, np.zeros(2), labels, hypotheses, "mean", rng)[0, 0] == 5.0
    # Clipped mean: offsets 1, 2, 3 and 40 from hypothesis 0 (radius: the lower median, 2):
    # clipped to 1, 2, 2, 2; the last weighted 0.25 → (1 + 2 + 2 + 0.5) / 3.25.
    rows = np.array([[1.0], [2.0], [3.0], [40.0]], np.float32)
    _, means = cluster_and_aggregate(rows, np.zeros(4), hypotheses, aggregation="mean",
                                     cluster_aggregator="clipped-mean", rng=rng,
                                     trust=np.array([1.0, 1.0, 1.0, 0.25]))
    assert means[0, 0] == pytest.approx(5.5 / 3.25, rel=1e-6)


def test_the_strategy_sets_a_pushing_device_aside_and_no_longer_asks_it() -> None:
    # Prepare: 8 honest devices release around hypothesis 0 with fresh noise each round; one
    # rogue releases 1.2 (about the noise's median norm) to the right of it every round.
    from flwr.common import Parameters

    from strategies import ClusteredStrategy
    from tests.test_strategies_clustered import FakeManager, FakeProxy
    from tests.test_strategies_faults import res

    rng = np.random.default_rng(3)
    ids = [str(i) for i in range(9)]
    manager = FakeManager(ids)
    strategy = ClusteredStrategy(initial_hypotheses=[[np.zeros(2, np.float32)]],
                                 clients_per_round=9, rng=np.random.default_rng(0),
                                 cluster_aggregator="clipped-mean", persistence_threshold=3.0)
    params = strategy.initialize_parameters(manager)
    asked_rogue = []
    for t in range(1, 31):
        asked = [proxy.cid for proxy, _ in strategy.configure_fit(t, Parameters([], ""), manager)]
        asked_rogue.append("0" in asked)
        h = strategy.hypotheses[0][0]
        replies = [(FakeProxy(cid), res((h + (np.array([1.2, 0.0]) if cid == "0" else
                                              rng.normal(size=2))).astype(np.float32),
                                        name=f"dev-{cid}"))
                   for cid in asked]
        new, _ = strategy.aggregate_fit(t, replies, [])
        params = new or params
        strategy.evaluate(t, params)

    # Assert: set aside once its sum passed 3√n (possible from n > c² = 9); never asked after;
    # no honest device set aside; the state survives a checkpoint.
    aside = strategy.state()[0]["screen"]["persistence"]["set_aside"]
    assert list(aside) == ["dev-0"] and 10 <= aside["dev-0"] <= 25
    assert asked_rogue == [t <= aside["dev-0"] for t in range(1, 31)]
    state, arrays = strategy.state()
    again = ClusteredStrategy(initial_hypotheses=[[np.zeros(2, np.float32)]],
                              clients_per_round=9, rng=np.random.default_rng(0),
                              persistence_threshold=3.0)
    again.restore(state, arrays)
    assert again.state()[0]["screen"]["persistence"]["set_aside"] == aside
