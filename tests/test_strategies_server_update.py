"""The server update (strategies.server_update): steps, annealing, dead hypotheses, re-seeding.

Expected values are computed by hand in the comments. The last tests drive the update inside
ClusteredStrategy with hand-built replies (the fakes of test_strategies_clustered).
"""

import math

import numpy as np
import pytest
from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays

from deploy.quickstart import QUICKSTART_RUN_CONFIG, quickstart_run_config
from server.settings import RunSettings
from settings import SettingError, federation_defaults
from strategies.records import RoundRecord
from strategies.robust import trimmed
from strategies.server_update import (
    ServerUpdate,
    anneal_start,
    dead_hypotheses,
    plateaus,
    reseed,
    split_cluster,
    step_towards,
)
from tests.test_strategies_clustered import (
    FakeManager,
    hyp,
    make,
    one_layer,
    reply,
    results_of,
)

F32 = np.float32


def record(t: int, loss: float | None, sizes: list[int]) -> RoundRecord:
    return RoundRecord(round=t, val_loss=loss, val_metrics={}, cluster_sizes=sizes,
                       replies=sum(sizes), declined=0, dropped=[], failures=0)


# ---------------------------------------------------------------------------- the steps


def test_step_towards_moves_each_hypothesis_eta_of_the_way() -> None:
    # h0 = (0, 0), mean (2, 4), η = 0.25 → (0.5, 1); h1 = its own mean (empty cluster) stays.
    h = np.array([[0, 0], [10, 10]], F32)
    means = np.array([[2, 4], [10, 10]], F32)

    new = step_towards(h, means, 0.25)

    np.testing.assert_array_equal(new, [[0.5, 1.0], [10, 10]])
    assert new.dtype == F32
    assert step_towards(h, means, 1.0) is means  # the papers' update: the means themselves


def test_anneal_starts_at_the_patience_th_validation_without_a_new_best() -> None:
    # Best 4 at round 1; round 2 (4.5) and round 3 (4.2) are no better: the 2nd is round 3.
    # Unvalidated rounds (None) do not count.
    losses = [(0, 5.0), (1, 4.0), (2, 4.5), (3, None), (4, 4.2), (5, 3.0)]

    assert anneal_start(losses, patience=2) == 4
    assert anneal_start(losses, patience=3) is None
    assert anneal_start([], patience=1) is None


def test_eta_of_each_rule() -> None:
    losses = [(0, 5.0), (1, 4.0), (2, 4.5), (3, 4.2)]  # anneal-after 2: starts at round 3
    assert ServerUpdate("mean").eta(9, losses) == 1.0
    assert ServerUpdate("step", step=0.3).eta(9, losses) == 0.3
    anneal = ServerUpdate("anneal", anneal_after=2, anneal_rounds=4.0)
    # Round 4: 1 / (1 + (4 - 3) / 4) = 0.8; round 7: 1 / (1 + 4/4) = 0.5.
    assert anneal.eta(4, losses) == pytest.approx(0.8)
    assert anneal.eta(7, losses) == pytest.approx(0.5)
    # Before a stall: the full step.
    assert anneal.eta(3, losses[:3]) == 1.0


def test_plateaus_counts_each_stall_afresh_and_says_when_the_last_one_completed() -> None:
    # Patience 2. Best 4 at round 1; rounds 2 and 4 (4.5, 4.2) are no better: stall 1 at
    # round 4 (round 3 unvalidated). The count restarts: rounds 5 and 6 (4.1, 4.0) no better
    # than 4: stall 2 at round 6. Round 7 (3.0) is a new best.
    losses = [(0, 5.0), (1, 4.0), (2, 4.5), (3, None), (4, 4.2), (5, 4.1), (6, 4.0), (7, 3.0)]

    assert plateaus(losses[:4], 2) == (0, False)
    assert plateaus(losses[:5], 2) == (1, True)
    assert plateaus(losses[:6], 2) == (1, False)
    assert plateaus(losses[:7], 2) == (2, True)
    assert plateaus(losses, 2) == (2, False)
    # A NaN loss is never a new best; an unvalidated record after a stall does not repeat it.
    assert plateaus([(0, 1.0), (1, math.nan), (2, math.nan)], 2) == (1, True)
    assert plateaus([(0, 1.0), (1, 2.0), (2, 2.0), (3, None)], 2) == (1, False)


def test_plateau_shrinks_the_step_by_its_factor_at_each_stall_down_to_a_floor() -> None:
    rule = ServerUpdate("plateau", anneal_after=1, plateau_factor=0.5)
    assert rule.eta(3, [(0, 5.0), (1, 4.0)]) == 1.0
    assert rule.eta(3, [(0, 5.0), (1, 4.0), (2, 4.5)]) == 0.5
    assert rule.eta(4, [(0, 5.0), (1, 4.0), (2, 4.5), (3, 4.5)]) == 0.25
    stalled = [(0, 1.0)] + [(t, 2.0) for t in range(1, 30)]
    assert rule.eta(31, stalled) == 0.02  # 0.5 ** 29 < MIN_PLATEAU_STEP


def test_the_strategy_restores_its_best_hypotheses_at_a_stall_and_sends_them() -> None:
    # Validation 5 (round 0), 4 (round 1: h = (1, 1) is the best), 4.5 (round 2: h = (3, 3)),
    # 4.5 (round 3: h = (5, 5)): anneal-after 2 stalls at round 3, so h = (1, 1) is restored
    # and round 4 is sent (1, 1). Round 4's step is 0.5: mean (3, 3) → (2, 2).
    losses = iter([5.0, 4.0, 4.5, 4.5, 4.5])
    strategy = make(hyp([0, 0]), clients_per_round=1, evaluate_fn=lambda h: {"loss": next(losses)},
                    server_update=ServerUpdate("plateau", anneal_after=2, plateau_factor=0.5))
    manager = FakeManager(["c0"])
    strategy.evaluate(0, None)  # type: ignore[arg-type]
    for t, v in ((1, [1, 1]), (2, [3, 3]), (3, [5, 5])):
        strategy.aggregate_fit(t, results_of([reply(v)]), [])
        strategy.evaluate(t, None)  # type: ignore[arg-type]

    np.testing.assert_array_equal(one_layer(strategy), [[1, 1]])
    (_, ins), = strategy.configure_fit(4, ndarrays_to_parameters([np.zeros(2, F32)]), manager)
    np.testing.assert_array_equal(parameters_to_ndarrays(ins.parameters)[0], [1, 1])
    strategy.aggregate_fit(4, results_of([reply([3, 3])]), [])
    np.testing.assert_array_equal(one_layer(strategy), [[2, 2]])


@pytest.mark.parametrize(("kwargs", "name"), [
    ({"rule": "median"}, "server-update"),
    ({"step": 0.0}, "server-step"),
    ({"step": 1.5}, "server-step"),
    ({"anneal_rounds": 0.0}, "anneal-rounds"),
    ({"anneal_after": 0}, "anneal-after"),
    ({"reseed_after": -1}, "reseed-after"),
    ({"plateau_factor": 0.0}, "plateau-factor"),
    ({"plateau_factor": 1.5}, "plateau-factor"),
    ({"plateau_factor": math.nan}, "plateau-factor"),
])
def test_a_bad_value_names_its_setting(kwargs: dict, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        ServerUpdate(**kwargs)


def test_run_settings_build_the_update_from_the_run_config() -> None:
    v = {**federation_defaults(), "server-update": "anneal", "anneal-after": 4,
         "anneal-rounds": 10.0, "reseed-after": 2}
    assert RunSettings.from_run_config(v).server_update == ServerUpdate("anneal", 0.5, 4, 10.0, 2)
    # The app's defaults are the papers' update, without re-seeding.
    assert RunSettings.from_run_config(federation_defaults()).server_update == ServerUpdate()
    with pytest.raises(SettingError, match="server-update"):
        RunSettings.from_run_config({**federation_defaults(), "server-update": "median"})


def test_the_quickstart_restores_on_plateaus_reseeds_and_runs_longer_below_16_supernodes(
) -> None:
    assert QUICKSTART_RUN_CONFIG["server-update"] == "plateau"
    assert QUICKSTART_RUN_CONFIG["reseed-after"] == 3
    assert quickstart_run_config(20, {})["num-rounds"] == 60
    assert quickstart_run_config(8, {})["num-rounds"] == 100
    # Robust clusters against rogue devices from 10 SuperNodes, where they were measured
    # (docs/RESULTS.md, "rogue-devices"); below, the papers' mean; the command line wins.
    for supernodes, aggregator, threshold in ((20, "clipped-mean", 3.0), (10, "clipped-mean", 3.0),
                                              (9, None, None)):
        config = quickstart_run_config(supernodes, {})
        assert config.get("cluster-aggregator") == aggregator, supernodes
        assert config.get("persistence-threshold") == threshold, supernodes
    assert quickstart_run_config(20, {"cluster-aggregator": "mean"})["cluster-aggregator"] == "mean"
    assert quickstart_run_config(8, {"num-rounds": 7})["num-rounds"] == 7


# ---------------------------------------------------------------------------- the guard


def test_dead_hypotheses_are_empty_in_each_of_the_last_rounds() -> None:
    rounds = [(1, [1, 2]), (2, [3, 0]), (3, [2, 0]), (4, [4, 0])]

    assert dead_hypotheses(rounds, 3) == [1]
    assert dead_hypotheses(rounds, 4) == []  # round 1 gave hypothesis 1 two releases
    assert dead_hypotheses(rounds, 0) == []  # never
    # Re-seeded in round 3: only round 4 counts for it.
    assert dead_hypotheses(rounds, 2, {1: 3}) == []
    assert dead_hypotheses(rounds, 1, {1: 3}) == [1]


def test_split_cluster_goes_one_standard_deviation_along_the_principal_axis() -> None:
    # x = 0, 2, 4, 6 (y = 0): mean 3, sample variance (9 + 1 + 1 + 9) / 3 = 20/3, s = 2.5820;
    # the principal axis is (1, 0). Centre (3, 1) → (0.4180, 1) and (5.5820, 1).
    released = np.array([[0, 0], [2, 0], [4, 0], [6, 0]], F32)
    s = math.sqrt(20 / 3)

    low, high = split_cluster(released, np.array([3, 1], F32))

    np.testing.assert_allclose(low, [3 - s, 1], rtol=1e-6)
    np.testing.assert_allclose(high, [3 + s, 1], rtol=1e-6)
    # The axis's sign does not depend on the SVD: reversed releases give the same split.
    np.testing.assert_allclose(split_cluster(released[::-1], np.array([3, 1], F32))[0], low)


def test_a_robust_split_is_not_thrown_by_a_minority_of_far_releases() -> None:
    # Around (4, 0): offsets -2, 0, 2 and two rogues' at 996. Clipped to the lower median norm 2:
    # -2, 0, 2, 2, 2 (mean 0.8), s² = (2.8² + 0.8² + 3 · 1.2²) / 4 = 3.2. Unclipped, s ≈ 545.
    released = np.array([[2, 0], [4, 0], [6, 0], [1000, 0], [1000, 0]], np.float32)
    centre = np.array([4, 0], np.float32)

    low, high = split_cluster(released, centre, robust=True)
    wide, _ = split_cluster(released, centre)

    s = math.sqrt(3.2)
    np.testing.assert_allclose([low, high], [[4 - s, 0], [4 + s, 0]], rtol=1e-6)
    assert np.linalg.norm(wide - centre) > 500


def test_reseed_splits_the_largest_cluster_and_needs_two_releases() -> None:
    # Hypothesis 1 is dead; cluster 0 holds the 4 releases of the test above.
    h = np.array([[3, 1], [50, 50]], F32)
    released = np.array([[0, 0], [2, 0], [4, 0], [6, 0]], F32)
    labels = np.zeros(4, dtype=np.intp)

    new, splits = reseed(h, released, labels, [1])

    s = math.sqrt(20 / 3)
    assert splits == [(0, 1)]
    np.testing.assert_allclose(new, [[3 - s, 1], [3 + s, 1]], rtol=1e-6)
    # One release: nothing to split.
    same, none = reseed(h, released[:1], labels[:1], [1])
    assert none == [] and np.array_equal(same, h)


def test_the_strategy_reseeds_a_hypothesis_no_release_reaches() -> None:
    # Both groups' releases land nearest hypothesis 0 = (0, 0); hypothesis 1 = (100, 100) draws
    # none. Round 1: cluster 0 mean (3, 0) → h0 = (3, 0) (papers' update). Round 2: the same
    # releases, hypothesis 1 empty for the 2nd round → split around the new h0 = (3, 0):
    # (3 ∓ 2.5820, 0).
    strategy = make(hyp([0, 0], [100, 100]), clients_per_round=4,
                    server_update=ServerUpdate("mean", reseed_after=2))
    replies = [reply(v) for v in ([0, 0], [2, 0], [4, 0], [6, 0])]

    strategy.aggregate_fit(1, results_of(replies), [])
    strategy.evaluate(1, None)  # type: ignore[arg-type]
    np.testing.assert_array_equal(one_layer(strategy), [[3, 0], [100, 100]])
    strategy.aggregate_fit(2, results_of(replies), [])

    s = math.sqrt(20 / 3)
    np.testing.assert_allclose(one_layer(strategy), [[3 - s, 0], [3 + s, 0]], rtol=1e-6)


def test_under_the_median_a_hypothesis_held_by_one_release_is_reseeded() -> None:
    # Five releases along the x axis join hypothesis 0 = (0, 0); one (a rogue's) lands by
    # hypothesis 1 = (100, 100): a cluster of 1 <= trimmed(6) = 2, which the median leaves
    # where it is. Round 1: h0 = the median (4, 0). Round 2: hypothesis 1 has not moved for 2
    # rounds → cluster 0 is split around (4, 0), offsets clipped to their lower median norm 2:
    # -2, -2, 0, 2, 2, so s² = 16 / 4 = 4.
    strategy = make(hyp([0, 0], [100, 100]), clients_per_round=6, cluster_aggregator="median",
                    server_update=ServerUpdate("mean", reseed_after=2))
    replies = [reply(v) for v in ([0, 0], [2, 0], [4, 0], [6, 0], [8, 0], [100, 101])]

    strategy.aggregate_fit(1, results_of(replies), [])
    strategy.evaluate(1, None)  # type: ignore[arg-type]
    np.testing.assert_array_equal(one_layer(strategy), [[4, 0], [100, 100]])
    strategy.aggregate_fit(2, results_of(replies), [])

    np.testing.assert_allclose(one_layer(strategy), [[2, 0], [6, 0]], rtol=1e-6)


def test_the_strategy_anneals_once_the_validation_stalls() -> None:
    # Validation loss 5, 4, 4.5, 4.5: anneal-after 2 starts at round 3; round 4's step is
    # 1 / (1 + (4 - 3) / 1) = 0.5: h = (0, 0), mean (2, 2) → (1, 1).
    losses = iter([5.0, 4.0, 4.5, 4.5, 4.5])
    strategy = make(hyp([0, 0]), clients_per_round=1, evaluate_fn=lambda h: {"loss": next(losses)},
                    server_update=ServerUpdate("anneal", anneal_after=2, anneal_rounds=1.0))
    strategy.evaluate(0, None)  # type: ignore[arg-type]
    for t in (1, 2, 3):
        strategy.aggregate_fit(t, results_of([reply([0, 0])]), [])
        strategy.evaluate(t, None)  # type: ignore[arg-type]

    strategy.aggregate_fit(4, results_of([reply([2, 2])]), [])

    np.testing.assert_array_equal(one_layer(strategy), [[1, 1]])


def test_the_server_app_gives_the_strategy_the_run_configs_update(tmp_path) -> None:
    from server.app import build_components

    config = {**federation_defaults(), "out-dir": str(tmp_path), "server-update": "anneal",
              "reseed-after": 3}
    components, _ = build_components(config)

    strategy = components.server.strategy
    assert strategy.server_update == ServerUpdate("anneal", reseed_after=3)  # type: ignore
    # The app's defaults: the papers' update.
    components, _ = build_components({**federation_defaults(), "out-dir": str(tmp_path / "b")})
    assert components.server.strategy.server_update == ServerUpdate()  # type: ignore


def test_under_a_robust_aggregator_a_cluster_too_small_to_move_counts_as_empty() -> None:
    # Hypothesis 1 holds one release a round (a rogue's, say): never empty, so the plain rule
    # never re-seeds it; with trimmed(10) = 2 a cluster of one or two leaves it where it was.
    rounds = [(1, [9, 1]), (2, [8, 2]), (3, [9, 1])]

    assert dead_hypotheses(rounds, 3) == []
    assert dead_hypotheses(rounds, 3, inert=trimmed) == [1]
    assert dead_hypotheses([*rounds[:2], (3, [7, 3])], 3, inert=trimmed) == []  # 3 > 2 moves it
