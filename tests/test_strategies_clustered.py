"""ClusteredStrategy driven by hand-built replies (fake ClientProxy / ClientManager).

Each test plays the part of Flower's ``Server.fit`` loop: ``configure_fit`` → ``aggregate_fit``
→ ``evaluate``. Expected hypotheses are computed by hand in the comments.
"""

import json
import logging
from collections.abc import Sequence

import numpy as np
import pytest
from flwr.common import (
    Code,
    FitRes,
    Parameters,
    Scalar,
    Status,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from scipy import stats

from experiments.core.in_process import NodeProxy
from strategies import ClusteredStrategy, RoundRecord

F32 = np.float32


#: Carries a node id only; the strategy never talks to a client itself.
FakeProxy = NodeProxy


class FakeManager(ClientManager):
    """A fixed set of connected clients."""

    def __init__(self, cids: Sequence[str]) -> None:
        self.clients = {cid: FakeProxy(cid) for cid in cids}
        self.waited_for: list[int] = []

    def num_available(self) -> int:
        return len(self.clients)

    def register(self, client: ClientProxy) -> bool:
        self.clients[client.cid] = client
        return True

    def unregister(self, client: ClientProxy) -> None:
        self.clients.pop(client.cid, None)

    def all(self) -> dict[str, ClientProxy]:
        return dict(self.clients)

    def wait_for(self, num_clients: int, timeout: int) -> bool:
        self.waited_for.append(num_clients)
        return len(self.clients) >= num_clients

    def sample(self, num_clients, min_num_clients=None, criterion=None):
        raise AssertionError("the strategy must sample with its own rng, not Flower's random")


def hyp(*values: Sequence[float]) -> list[list[np.ndarray]]:
    """K one-layer hypotheses from their coordinates."""
    return [[np.asarray(v, dtype=F32)] for v in values]


def reply(
    *layers: Sequence[float] | np.ndarray, sigma: float | None = 1.0, **metrics: Scalar
) -> FitRes:
    """A client's FitRes releasing ``layers`` (float32 unless already arrays)."""
    arrays = [a if isinstance(a, np.ndarray) else np.asarray(a, dtype=F32) for a in layers]
    all_metrics: dict[str, Scalar] = {"declined": 0, **metrics}
    if sigma is not None:
        all_metrics["sigma"] = sigma
    return FitRes(
        status=Status(code=Code.OK, message=""),
        parameters=ndarrays_to_parameters(arrays),
        num_examples=1,
        metrics=all_metrics,
    )


def declined_reply() -> FitRes:
    return FitRes(
        status=Status(code=Code.OK, message=""),
        parameters=Parameters(tensors=[], tensor_type="numpy.ndarray"),
        num_examples=1,
        metrics={"declined": 1, "declines": 1},
    )


def named(cid: str, res: FitRes) -> tuple[ClientProxy, FitRes]:
    """A reply of node ``cid`` speaking as ``client-name = cid`` (unless it names itself)."""
    metrics = {"client-name": cid, **res.metrics}
    return FakeProxy(cid), FitRes(res.status, res.parameters, res.num_examples, metrics)


def results_of(replies: Sequence[FitRes], prefix: str = "c") -> list[tuple[ClientProxy, FitRes]]:
    return [named(f"{prefix}{i}", res) for i, res in enumerate(replies)]


#: The papers' cluster mean (Algorithm 1), which these tests check, asked for explicitly (the
#: quickstart asks for clipped-mean with the persistence test; tests/test_strategies_robust.py).
PLAIN_MEAN: dict[str, object] = {"cluster_aggregator": "mean", "persistence_threshold": 0.0}


def make(hypotheses: list[list[np.ndarray]], **kwargs: object) -> ClusteredStrategy:
    settings: dict[str, object] = {"clients_per_round": 3, "rng": np.random.default_rng(0),
                                   **PLAIN_MEAN}
    settings.update(kwargs)
    return ClusteredStrategy(initial_hypotheses=hypotheses, **settings)  # type: ignore[arg-type]


def one_layer(strategy: ClusteredStrategy) -> np.ndarray:
    """The k one-layer hypotheses as a k × n matrix."""
    return np.stack([layers[0] for layers in strategy.hypotheses])


# ---------------------------------------------------------------------------- parameters layout


def test_initialize_parameters_lays_out_hypothesis_j_layer_l_at_j_times_l() -> None:
    # Prepare: k = 2 hypotheses of L = 2 layers.
    h0 = [np.array([[1, 2]], F32), np.array([3], F32)]
    h1 = [np.array([[4, 5]], F32), np.array([6], F32)]
    strategy = make([h0, h1])

    # Execute
    arrays = parameters_to_ndarrays(strategy.initialize_parameters(FakeManager([])))

    # Assert
    assert [a.tolist() for a in arrays] == [[[1, 2]], [3], [[4, 5]], [6]]
    assert all(a.dtype == F32 for a in arrays)


def test_hypotheses_are_copies() -> None:
    strategy = make(hyp([1, 2]))

    strategy.hypotheses[0][0][:] = 99

    np.testing.assert_array_equal(strategy.hypotheses[0][0], [1, 2])


def test_returned_parameters_hold_the_new_hypotheses() -> None:
    # Prepare: k = 1, two replies (2, 4) and (4, 8) → mean (3, 6).
    strategy = make(hyp([0, 0]))

    # Execute
    parameters, _ = strategy.aggregate_fit(1, results_of([reply([2, 4]), reply([4, 8])]), [])

    # Assert
    assert parameters is not None
    np.testing.assert_array_equal(parameters_to_ndarrays(parameters)[0], [3, 6])
    np.testing.assert_array_equal(strategy.hypotheses[0][0], [3, 6])


# ---------------------------------------------------------------------------- clustering


GROUP_A = [[10, 10], [11, 10], [12, 13]]  # mean (11, 11)
GROUP_B = [[-10, -10], [-12, -9], [-11, -14], [-11, -11]]  # mean (-11, -11)


@pytest.mark.parametrize("a_first", [True, False])
def test_two_separated_groups_are_recovered_and_centroid_j_stays_hypothesis_j(
    a_first: bool,
) -> None:
    # Prepare: hypothesis 0 starts near group A (or B), hypothesis 1 near the other group;
    # the replies are interleaved so that reply order says nothing about the groups.
    near_a, near_b = [5, 5], [-5, -5]
    strategy = make(hyp(near_a, near_b) if a_first else hyp(near_b, near_a))
    order = [GROUP_B[0], GROUP_A[0], GROUP_B[1], GROUP_A[1], GROUP_B[2], GROUP_A[2], GROUP_B[3]]
    replies = [reply(v) for v in order]

    # Execute
    _, metrics = strategy.aggregate_fit(1, results_of(replies), [])

    # Assert
    expected = [[11, 11], [-11, -11]] if a_first else [[-11, -11], [11, 11]]
    np.testing.assert_allclose(one_layer(strategy), expected, rtol=1e-6)
    sizes = [3, 4] if a_first else [4, 3]
    assert [metrics["cluster-size-0"], metrics["cluster-size-1"]] == sizes


def test_kmeans_moves_a_reply_away_from_its_nearest_initial_hypothesis() -> None:
    # Prepare: hypotheses at 0 and 4 on a line; replies at 1, 2.1 and 10. Nearest-hypothesis
    # assignment gives {1} and {2.1, 10} (centres 1 and 6.05); the next Lloyd step moves 2.1
    # to the first centre, and k-means converges to {1, 2.1} → 1.55 and {10} → 10.
    strategy = make(hyp([0.0], [4.0]))
    replies = [reply([1.0]), reply([2.1]), reply([10.0])]

    # Execute
    strategy.aggregate_fit(1, results_of(replies), [])

    # Assert
    np.testing.assert_allclose(one_layer(strategy)[:, 0], [1.55, 10.0], rtol=1e-6)


def test_fewer_replies_than_hypotheses_go_to_their_nearest_hypothesis() -> None:
    # Prepare: k = 3 hypotheses, 2 replies (KMeans needs m ≥ k): (1, 1) is nearest to
    # hypothesis 0, (19, 21) to hypothesis 2; hypothesis 1 gets none and keeps its value.
    strategy = make(hyp([0, 0], [10, 10], [20, 20]))

    # Execute
    _, metrics = strategy.aggregate_fit(1, results_of([reply([19, 21]), reply([1, 1])]), [])

    # Assert
    np.testing.assert_allclose(one_layer(strategy), [[1, 1], [10, 10], [19, 21]])
    assert [metrics[f"cluster-size-{j}"] for j in range(3)] == [1, 0, 1]


def test_empty_cluster_keeps_its_hypothesis() -> None:
    # Prepare: both replies are near hypothesis 0 → mean (2, 3); hypotheses 1, 2 keep theirs.
    strategy = make(hyp([0, 0], [50, 50], [-50, 50]))

    # Execute
    _, metrics = strategy.aggregate_fit(1, results_of([reply([1, 2]), reply([3, 4])]), [])

    # Assert
    np.testing.assert_allclose(one_layer(strategy), [[2, 3], [50, 50], [-50, 50]])
    assert [metrics[f"cluster-size-{j}"] for j in range(3)] == [2, 0, 0]


def test_hypothesis_far_from_every_reply_keeps_its_value_with_enough_replies() -> None:
    # Prepare: m = 5 ≥ k = 2 replies, all near hypothesis 0; hypothesis 1 at (40, 40) is
    # nearest to none. scikit-learn's KMeans would relocate that empty centroid onto the
    # farthest reply (15, 0); the design says an empty cluster keeps its hypothesis, so
    # hypothesis 0 becomes the mean of all five, (4, 0), and hypothesis 1 stays (40, 40).
    strategy = make(hyp([0, 0], [40, 40]))
    replies = [reply([x, 0.0]) for x in (0.0, 1.0, 2.0, 2.0, 15.0)]

    # Execute
    _, metrics = strategy.aggregate_fit(1, results_of(replies), [])

    # Assert
    np.testing.assert_allclose(one_layer(strategy), [[4, 0], [40, 40]])
    assert [metrics[f"cluster-size-{j}"] for j in range(2)] == [5, 0]


def test_identical_replies_do_not_raise_the_kmeans_convergence_warning() -> None:
    # Prepare: 3 identical replies, k = 2: sklearn warns "Number of distinct clusters (1) found
    # smaller than n_clusters (2)"; with filterwarnings=error that would fail this test.
    strategy = make(hyp([0, 0], [9, 9]))

    # Execute
    parameters, _ = strategy.aggregate_fit(1, results_of([reply([1, 1])] * 3), [])

    # Assert
    assert parameters is not None
    assert [1.0, 1.0] in one_layer(strategy).tolist()


def test_one_hypothesis_is_the_plain_mean() -> None:
    # Prepare: k = 1 (FedAvg, no k-means): mean of (0, 3), (3, 0), (6, 6), (3, 3) = (3, 3).
    strategy = make(hyp([100, 100]))

    # Execute
    strategy.aggregate_fit(1, results_of([reply(v) for v in ([0, 3], [3, 0], [6, 6], [3, 3])]), [])

    # Assert
    np.testing.assert_allclose(one_layer(strategy), [[3, 3]])


def test_one_hypothesis_weighted_mean() -> None:
    # Prepare: σ = (1, 2, 4) → α = (4/7, 2/7, 1/7); values (7, 0), (14, 7), (21, 14):
    # 4/7·7 + 2/7·14 + 1/7·21 = 4 + 4 + 3 = 11;  0 + 2 + 2 = 4.
    strategy = make(hyp([0, 0]), aggregation="weighted")
    replies = [reply([7, 0], sigma=1.0), reply([14, 7], sigma=2.0), reply([21, 14], sigma=4.0)]

    # Execute
    strategy.aggregate_fit(1, results_of(replies), [])

    # Assert
    np.testing.assert_allclose(one_layer(strategy), [[11, 4]], rtol=1e-6)


def test_budget_weights_apply_within_each_cluster() -> None:
    # Prepare: cluster 0 = the three releases above (σ = 1, 2, 4 → weighted mean (11, 4));
    # cluster 1 = (-100, -100) with σ = 1 and (-103, -100) with σ = 2 → α = (2/3, 1/3):
    # -100·2/3 - 103/3 = -101, -100. Inverse variance would give (-100.6, -100) instead.
    strategy = make(hyp([10, 5], [-90, -90]), aggregation="weighted")
    replies = [
        reply([-100, -100], sigma=1.0),
        reply([7, 0], sigma=1.0),
        reply([14, 7], sigma=2.0),
        reply([-103, -100], sigma=2.0),
        reply([21, 14], sigma=4.0),
    ]

    # Execute
    strategy.aggregate_fit(1, results_of(replies), [])

    # Assert
    np.testing.assert_allclose(one_layer(strategy), [[11, 4], [-101, -100]], rtol=1e-6)


def test_inverse_variance_within_a_cluster() -> None:
    # Prepare: σ = (1, 2) → weights ∝ (1, 1/4) = (4/5, 1/5): 0·4/5 + 10·1/5 = 2.
    strategy = make(hyp([0.0]), aggregation="inverse-variance")

    # Execute
    strategy.aggregate_fit(1, results_of([reply([0.0], sigma=1.0), reply([10.0], sigma=2.0)]), [])

    # Assert
    np.testing.assert_allclose(one_layer(strategy), [[2.0]], rtol=1e-6)


def test_multi_layer_hypotheses_are_clustered_on_all_layers_together() -> None:
    # Prepare: two layers (shape (2,) and (1, 1)); the groups differ only in the second layer.
    h0 = [np.array([0, 0], F32), np.array([[0]], F32)]
    h1 = [np.array([0, 0], F32), np.array([[10]], F32)]
    strategy = make([h0, h1])
    replies = [
        reply([1, 1], np.array([[1]], F32)),
        reply([3, 3], np.array([[9]], F32)),
        reply([3, 3], np.array([[-1]], F32)),
        reply([1, 1], np.array([[11]], F32)),
    ]

    # Execute
    strategy.aggregate_fit(1, results_of(replies), [])

    # Assert: cluster 0 = {(1,1,1), (3,3,-1)} → (2, 2, 0);
    # cluster 1 = {(3,3,9), (1,1,11)} → (2, 2, 10)
    new = strategy.hypotheses
    np.testing.assert_allclose(new[0][0], [2, 2])
    np.testing.assert_allclose(new[0][1], [[0]])
    np.testing.assert_allclose(new[1][0], [2, 2])
    np.testing.assert_allclose(new[1][1], [[10]])
    assert new[0][1].shape == (1, 1) and new[0][1].dtype == F32


# ---------------------------------------------------------------------------- bad replies


def test_bad_replies_are_dropped_and_logged_and_the_round_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Prepare: 3 good replies (mean (2, 4)) and one of each kind of bad reply.
    strategy = make(hyp([0, 0]))
    garbage = Parameters(tensors=[b"not an npy payload"], tensor_type="numpy.ndarray")
    bad = {
        "shape": reply([1, 2, 3]),
        "float64": reply(np.array([1, 2], dtype=np.float64)),
        "nan": reply([np.nan, 1]),
        "inf": reply([1, np.inf]),
        "count": reply([1, 2], [3]),
        "garbage": FitRes(Status(Code.OK, ""), garbage, 1, {"declined": 0}),
        "type": FitRes(Status(Code.OK, ""), Parameters([], tensor_type="torch"), 1, {}),
    }
    good = [reply([1, 3]), reply([2, 4]), reply([3, 5])]
    results = results_of(good, "good") + [named(cid, res) for cid, res in bad.items()]

    # Execute
    with caplog.at_level(logging.WARNING, logger="strategies"):
        parameters, metrics = strategy.aggregate_fit(7, results, [])
        strategy.evaluate(7, parameters)  # type: ignore[arg-type]

    # Assert: the good ones were aggregated ...
    assert parameters is not None
    np.testing.assert_allclose(one_layer(strategy), [[2, 4]])
    assert metrics["replies"] == 3 and metrics["dropped"] == 7
    # ... each bad one is in the record with its reason ...
    reasons = dict(strategy.history[-1].dropped)
    assert reasons == {
        "shape": "array 0 has shape (3,), expected (2,)",
        "float64": "array 0 has dtype <f8, expected <f4",
        "nan": "array 0 has non-finite values (NaN or inf)",
        "inf": "array 0 has non-finite values (NaN or inf)",
        "count": "expected 1 arrays, got 2",
        "garbage": reasons["garbage"],
        "type": "tensor_type is 'torch', expected 'numpy.ndarray'",
    }
    assert reasons["garbage"].startswith("unreadable array:")
    # ... logged as a WARNING naming the node id and the reason ...
    logged = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    for cid, reason in reasons.items():
        assert any(
            f"(node {cid}):" in line and reason in line and "round 7" in line for line in logged
        )
    # ... and counted per client.
    assert strategy.clients["nan"].dropped == 1 and strategy.clients["nan"].participations == 0
    assert strategy.clients["good0"].participations == 1 and strategy.clients["good0"].dropped == 0


@pytest.mark.parametrize("sigma", [None, -1.0, float("nan"), "high"])
def test_reply_without_a_valid_sigma_is_dropped_when_weighting(sigma: object) -> None:
    # Prepare: budget-aware weights need each reply's σ.
    strategy = make(hyp([0.0]), aggregation="weighted")
    results = results_of([reply([2.0], sigma=1.0), reply([50.0], sigma=sigma)])  # type: ignore[arg-type]

    # Execute
    _, metrics = strategy.aggregate_fit(1, results, [])

    # Assert
    assert metrics["dropped"] == 1
    np.testing.assert_allclose(one_layer(strategy), [[2.0]])


def test_sigma_is_not_needed_for_the_plain_mean() -> None:
    strategy = make(hyp([0.0]), aggregation="mean")

    _, metrics = strategy.aggregate_fit(1, results_of([reply([2.0], sigma=None), reply([4.0])]), [])

    assert metrics["dropped"] == 0
    np.testing.assert_allclose(one_layer(strategy), [[3.0]])


def test_declines_are_counted_apart_from_failures() -> None:
    # Prepare: 2 good replies, 2 declines, 1 exception, 1 error status.
    strategy = make(hyp([0.0]))
    error = FitRes(Status(Code.FIT_NOT_IMPLEMENTED, "no"), Parameters([], ""), 0, {})
    results = results_of([reply([1.0]), declined_reply(), reply([3.0]), declined_reply()])
    failures: list[tuple[ClientProxy, FitRes] | BaseException] = [
        TimeoutError("client c9 timed out"),
        (FakeProxy("broken"), error),
    ]

    # Execute
    parameters, metrics = strategy.aggregate_fit(1, results, failures)
    strategy.evaluate(1, parameters)  # type: ignore[arg-type]

    # Assert
    record = strategy.history[-1]
    assert (record.replies, record.declined, record.failures, record.dropped) == (2, 2, 2, [])
    assert (metrics["replies"], metrics["declined"], metrics["failures"]) == (2, 2, 2)
    np.testing.assert_allclose(one_layer(strategy), [[2.0]])  # declines are not zeros
    assert strategy.clients["c1"].declines == 1 and strategy.clients["c1"].participations == 0
    assert strategy.clients["c0"].declines == 0 and strategy.clients["c0"].participations == 1
    assert strategy.clients["broken"].failures == 1


def test_round_with_only_declines_keeps_the_hypotheses() -> None:
    # Prepare
    strategy = make(hyp([5.0]), evaluate_fn=lambda h: {"loss": 1.0})
    strategy.evaluate(0, strategy.initialize_parameters(FakeManager([])))  # type: ignore[arg-type]

    # Execute
    parameters, metrics = strategy.aggregate_fit(1, results_of([declined_reply()] * 2), [])
    strategy.evaluate(1, Parameters([], ""))

    # Assert
    assert parameters is None  # Flower then keeps the current parameters
    assert metrics["declined"] == 2 and metrics["replies"] == 0
    np.testing.assert_array_equal(one_layer(strategy), [[5.0]])
    assert strategy.rounds_completed == 0
    assert strategy.history[-1].round == 1 and strategy.history[-1].replies == 0


def test_client_record_keeps_the_last_reported_metrics() -> None:
    # Prepare
    strategy = make(hyp([0.0]))
    first = reply([1.0], sigma=2.0, **{"spend-epsilon": 0.5, "budget-epsilon": 3.0, "releases": 1})
    second = reply([1.0], sigma=2.0, **{"spend-epsilon": 0.9, "budget-epsilon": 3.0, "releases": 2})

    # Execute
    strategy.aggregate_fit(1, [named("42", first)], [])
    strategy.aggregate_fit(2, [named("42", second)], [])

    # Assert
    record = strategy.clients["42"]
    assert record.metrics["spend-epsilon"] == 0.9 and record.metrics["releases"] == 2
    assert (record.participations, record.last_round) == (2, 2)


# ---------------------------------------------------------------------------- sign release


def test_sign_release_steps_by_the_sign_of_the_mean_vote() -> None:
    # Prepare: θ = 0; votes (1,1,-1,-1), (1,-1,-1,1), (1,-1,1,-1): mean (1, -1/3, -1/3, -1/3),
    # sign (1, -1, -1, -1); η = 0.5 → θ = (0.5, -0.5, -0.5, -0.5).
    strategy = make(hyp([0, 0, 0, 0]), release="sign", server_learning_rate=0.5)
    votes = [[1, 1, -1, -1], [1, -1, -1, 1], [1, -1, 1, -1]]

    # Execute
    strategy.aggregate_fit(1, results_of([reply(v) for v in votes]), [])

    # Assert
    np.testing.assert_array_equal(one_layer(strategy), [[0.5, -0.5, -0.5, -0.5]])


def test_sign_release_weights_the_vote() -> None:
    # Prepare: σ = (1, 1, 1/4) → α ∝ (1, 1, 4) = (1/6, 1/6, 4/6); weighted votes:
    # (1, (1-1-4)/6, (-1-1+4)/6, (-1+1-4)/6) → signs (1, -1, 1, -1); θ = 1 + 0.25·sign.
    strategy = make(
        hyp([1, 1, 1, 1]), release="sign", server_learning_rate=0.25, aggregation="weighted"
    )
    votes = [([1, 1, -1, -1], 1.0), ([1, -1, -1, 1], 1.0), ([1, -1, 1, -1], 0.25)]

    # Execute
    strategy.aggregate_fit(1, results_of([reply(v, sigma=s) for v, s in votes]), [])

    # Assert
    np.testing.assert_array_equal(one_layer(strategy), [[1.25, 0.75, 1.25, 0.75]])


def test_sign_release_tie_leaves_the_coordinate_unchanged() -> None:
    # Votes (1, 1) and (-1, 1): mean (0, 1), sign(0) = 0 → θ = (0, 0.1).
    strategy = make(hyp([0, 0]), release="sign", server_learning_rate=0.1)

    strategy.aggregate_fit(1, results_of([reply([1, 1]), reply([-1, 1])]), [])

    np.testing.assert_allclose(one_layer(strategy), [[0, 0.1]])


def test_sign_release_drops_values_other_than_plus_minus_one() -> None:
    strategy = make(hyp([0, 0]), release="sign", server_learning_rate=1.0)

    _, metrics = strategy.aggregate_fit(1, results_of([reply([1, 1]), reply([-1e6, -1e6])]), [])

    assert metrics["dropped"] == 1
    np.testing.assert_array_equal(one_layer(strategy), [[1, 1]])


def test_sign_release_with_several_hypotheses_is_refused() -> None:
    with pytest.raises(ValueError, match="num-hypotheses"):
        make(hyp([0], [1]), release="sign")


# ---------------------------------------------------------------------------- sampling


def cids_of(instructions: list[tuple[ClientProxy, object]]) -> list[str]:
    return [proxy.cid for proxy, _ in instructions]


def test_sampling_is_reproducible_with_a_seed_and_ignores_connection_order() -> None:
    # Prepare: the same 20 clients, connected in two different orders.
    names = [f"{i}" for i in range(20)]
    strategies = [
        make(hyp([0.0]), clients_per_round=7, rng=np.random.default_rng(3)) for _ in range(2)
    ]
    managers = [FakeManager(names), FakeManager(names[::-1])]
    parameters = strategies[0].initialize_parameters(managers[0])

    # Execute
    samples = [
        [cids_of(s.configure_fit(t, parameters, m)) for t in (1, 2, 3)]  # type: ignore[arg-type]
        for s, m in zip(strategies, managers, strict=True)
    ]

    # Assert
    assert samples[0] == samples[1]
    for sample in samples[0]:
        assert len(sample) == 7 and len(set(sample)) == 7 and set(sample) <= set(names)
    assert samples[0][0] != samples[0][1]  # a new draw every round
    other = make(hyp([0.0]), clients_per_round=7, rng=np.random.default_rng(4))
    assert cids_of(other.configure_fit(1, parameters, managers[0])) != samples[0][0]  # type: ignore[arg-type]


def test_sampling_is_uniform() -> None:
    # Prepare: 1 000 rounds of 5 out of 20 → each client expected 250 times. Chi-square
    # goodness of fit at α = 0.001 (19 degrees of freedom); sampling without replacement
    # within a round only lowers the variance, so the false-positive rate is at most 0.001.
    manager = FakeManager([f"n{i}" for i in range(20)])
    strategy = make(hyp([0.0]), clients_per_round=5, rng=np.random.default_rng(11))
    parameters = strategy.initialize_parameters(manager)

    # Execute
    for t in range(1, 1001):
        strategy.configure_fit(t, parameters, manager)  # type: ignore[arg-type]

    # Assert
    counts = [strategy.clients[f"n{i}"].sampled for i in range(20)]
    assert sum(counts) == 5000
    assert stats.chisquare(counts).pvalue > 0.001


def test_fit_instructions_carry_the_hypotheses_and_the_config() -> None:
    # Prepare
    manager = FakeManager(["a", "b", "c", "d"])
    strategy = make(
        hyp([1.0], [2.0]), clients_per_round=2, fit_config={"local-epochs": 3, "lr": 0.1}
    )
    parameters = strategy.initialize_parameters(manager)

    # Execute
    instructions = strategy.configure_fit(5, parameters, manager)  # type: ignore[arg-type]

    # Assert
    assert len(instructions) == 2
    for _, fit_ins in instructions:
        assert fit_ins.config == {
            "num-hypotheses": 2,
            "server-round": 5,
            "local-epochs": 3,
            "lr": 0.1,
        }
        assert [a.tolist() for a in parameters_to_ndarrays(fit_ins.parameters)] == [[1.0], [2.0]]
    assert manager.waited_for == []  # 4 connected, 2 wanted: no wait


def test_sampling_takes_all_when_fewer_than_clients_per_round_but_enough_available() -> None:
    # Prepare: 3 connected, 5 per round, 3 replies needed. The first round waits (up to the
    # round timeout) for 5, then samples the 3 there are; later rounds do not wait again.
    manager = FakeManager(["a", "b", "c"])
    strategy = make(hyp([0.0]), clients_per_round=5, min_replies=3)

    first = strategy.configure_fit(1, Parameters([], ""), manager)
    second = strategy.configure_fit(2, Parameters([], ""), manager)

    assert sorted(cids_of(first)) == sorted(cids_of(second)) == ["a", "b", "c"]  # type: ignore[arg-type]
    assert manager.waited_for == [5]


def test_too_few_devices_stop_the_run_and_say_why() -> None:
    # Prepare: 2 connected, min-replies 3: the round cannot count, so the run stops.
    manager = FakeManager(["a", "b"])
    stops: list[str] = []
    strategy = make(hyp([0.0]), clients_per_round=3, min_replies=3, on_stop=stops.append)

    # Execute
    first = strategy.configure_fit(4, Parameters([], ""), manager)
    manager.register(FakeProxy("c"))
    later = strategy.configure_fit(5, Parameters([], ""), manager)

    # Assert: no clients, the reason names the numbers, and the run does not start again.
    assert first == [] and later == []
    assert strategy.incomplete_reason == ("round 4: too few devices: 2 connected, 2 answered "
                                          "their last round, min-replies=3")
    assert stops == [strategy.incomplete_reason]
    assert strategy.evaluate(4, Parameters([], "")) is None and strategy.history == []


def test_reserved_config_keys_cannot_be_overridden() -> None:
    with pytest.raises(ValueError, match="num-hypotheses"):
        make(hyp([0.0]), fit_config={"num-hypotheses": 3})


# ---------------------------------------------------------------------------- evaluation


def scripted(losses: list[float], calls: list[list[list[np.ndarray]]] | None = None):
    """An evaluate_fn returning the given losses in turn (and recording its inputs)."""
    remaining = list(losses)

    def evaluate_fn(hypotheses: list[list[np.ndarray]]) -> dict[str, float]:
        if calls is not None:
            calls.append(hypotheses)
        return {"loss": remaining.pop(0), "accuracy": 0.5}

    return evaluate_fn


def play_round(strategy: ClusteredStrategy, t: int, manager: FakeManager) -> object:
    """One round of Flower's loop; every sampled client releases (t, t)."""
    instructions = strategy.configure_fit(t, Parameters([], ""), manager)
    if instructions:
        results = [(proxy, named(proxy.cid, reply([float(t), float(t)]))[1])
                   for proxy, _ in instructions]
        strategy.aggregate_fit(t, results, [])
    return strategy.evaluate(t, Parameters([], ""))


def test_round_zero_is_evaluated_and_recorded() -> None:
    # Prepare
    calls: list[list[list[np.ndarray]]] = []
    records: list[RoundRecord] = []
    strategy = make(
        hyp([1, 2], [3, 4]), evaluate_fn=scripted([0.7], calls), on_round=records.append
    )

    # Execute
    result = strategy.evaluate(0, strategy.initialize_parameters(FakeManager([])))

    # Assert
    assert result == (0.7, {"accuracy": 0.5})
    assert len(calls) == 1 and [[a.tolist() for a in h] for h in calls[0]] == [[[1, 2]], [[3, 4]]]
    assert records == strategy.history
    assert records[0] == RoundRecord(
        round=0,
        val_loss=0.7,
        val_metrics={"accuracy": 0.5},
        cluster_sizes=[0, 0],
        replies=0,
        declined=0,
        dropped=[],
        failures=0,
    )
    assert strategy.best_loss == 0.7 and strategy.best_round == 0


def test_early_stop_after_patience_evaluations_without_improvement() -> None:
    # Prepare: losses 1.0 (round 0), 0.5 (better), 0.6, 0.5 (equal is not better) → with
    # patience 2 the strategy stops after round 3; round 4 samples nobody and is not recorded.
    manager = FakeManager(["a", "b", "c"])
    records: list[RoundRecord] = []
    strategy = make(
        hyp([0.0, 0.0]),
        evaluate_fn=scripted([1.0, 0.5, 0.6, 0.5]),
        patience=2,
        on_round=records.append,
    )
    strategy.evaluate(0, strategy.initialize_parameters(manager))

    # Execute
    results = [play_round(strategy, t, manager) for t in (1, 2, 3)]
    stopped_after_3 = strategy.stopped_early
    instructions = strategy.configure_fit(4, Parameters([], ""), manager)
    result_4 = strategy.evaluate(4, Parameters([], ""))

    # Assert
    assert results == [(0.5, {"accuracy": 0.5}), (0.6, {"accuracy": 0.5}), (0.5, {"accuracy": 0.5})]
    assert stopped_after_3 and strategy.stopped_early
    assert instructions == [] and result_4 is None
    assert [r.round for r in strategy.history] == [0, 1, 2, 3] and records == strategy.history
    assert [r.val_loss for r in strategy.history] == [1.0, 0.5, 0.6, 0.5]
    assert strategy.rounds_completed == 3
    assert strategy.best_loss == 0.5 and strategy.best_round == 1
    np.testing.assert_array_equal(strategy.best_hypotheses[0][0], [1.0, 1.0])  # after round 1
    np.testing.assert_array_equal(strategy.hypotheses[0][0], [3.0, 3.0])


def test_no_early_stop_before_patience_runs_out() -> None:
    # Prepare: patience 3 and only 2 evaluations without improvement.
    manager = FakeManager(["a", "b", "c"])
    strategy = make(hyp([0.0, 0.0]), evaluate_fn=scripted([1.0, 2.0, 3.0]), patience=3)
    strategy.evaluate(0, Parameters([], ""))

    # Execute
    for t in (1, 2):
        play_round(strategy, t, manager)

    # Assert
    assert not strategy.stopped_early
    assert len(strategy.configure_fit(3, Parameters([], ""), manager)) == 3


def test_patience_zero_never_stops() -> None:
    manager = FakeManager(["a", "b", "c"])
    strategy = make(hyp([0.0, 0.0]), evaluate_fn=scripted([1.0] + [2.0] * 6), patience=0)
    strategy.evaluate(0, Parameters([], ""))

    for t in range(1, 7):
        play_round(strategy, t, manager)

    assert not strategy.stopped_early and strategy.rounds_completed == 6


def test_nan_loss_is_never_an_improvement() -> None:
    manager = FakeManager(["a", "b", "c"])
    strategy = make(hyp([0.0, 0.0]), evaluate_fn=scripted([1.0, float("nan")]), patience=1)
    strategy.evaluate(0, Parameters([], ""))

    play_round(strategy, 1, manager)

    assert strategy.stopped_early and strategy.best_loss == 1.0


def test_eval_every_validates_every_nth_round_only() -> None:
    # Prepare
    manager = FakeManager(["a", "b", "c"])
    calls: list[list[list[np.ndarray]]] = []
    strategy = make(hyp([0.0, 0.0]), evaluate_fn=scripted([3.0, 2.0, 1.0], calls), eval_every=2)
    strategy.evaluate(0, Parameters([], ""))

    # Execute
    results = [play_round(strategy, t, manager) for t in (1, 2, 3, 4)]

    # Assert
    assert results == [None, (2.0, {"accuracy": 0.5}), None, (1.0, {"accuracy": 0.5})]
    assert len(calls) == 3
    assert [r.val_loss for r in strategy.history] == [3.0, None, 2.0, None, 1.0]


def test_evaluate_fn_without_loss_is_an_error() -> None:
    strategy = make(hyp([0.0]), evaluate_fn=lambda h: {"accuracy": 1.0})

    with pytest.raises(ValueError, match="'loss'"):
        strategy.evaluate(0, Parameters([], ""))


def test_without_evaluate_fn_rounds_are_still_recorded() -> None:
    manager = FakeManager(["a", "b", "c"])
    strategy = make(hyp([0.0, 0.0]))

    assert strategy.evaluate(0, Parameters([], "")) is None
    assert play_round(strategy, 1, manager) is None

    assert [(r.round, r.val_loss, r.replies) for r in strategy.history] == [
        (0, None, 0),
        (1, None, 3),
    ]


def test_kept_released_vectors_and_labels_are_in_the_record() -> None:
    # Prepare
    strategy = make(hyp([0, 0], [10, 10]), keep_released=True)
    replies = [reply([1, 0]), reply([9, 11]), reply([0, 1])]

    # Execute
    parameters, _ = strategy.aggregate_fit(1, results_of(replies), [])
    strategy.evaluate(1, parameters)  # type: ignore[arg-type]

    # Assert
    record = strategy.history[-1]
    assert record.released == [[1.0, 0.0], [9.0, 11.0], [0.0, 1.0]]
    assert record.labels == [0, 1, 0]
    assert json.loads(json.dumps(record.to_dict()))["released"] == record.released


def test_released_vectors_are_not_kept_by_default() -> None:
    strategy = make(hyp([0, 0]))

    parameters, _ = strategy.aggregate_fit(1, results_of([reply([1, 0])]), [])
    strategy.evaluate(1, parameters)  # type: ignore[arg-type]

    assert strategy.history[-1].released is None and strategy.history[-1].labels is None


def test_record_is_frozen() -> None:
    record = RoundRecord(0, None, {}, [0], 0, 0, [], 0)

    with pytest.raises(AttributeError):
        record.round = 1  # type: ignore[misc]


def test_configure_and_aggregate_evaluate_do_nothing() -> None:
    strategy = make(hyp([0.0]))

    assert strategy.configure_evaluate(1, Parameters([], ""), FakeManager(["a"])) == []
    assert strategy.aggregate_evaluate(1, [], []) == (None, {})


# ---------------------------------------------------------------------------- constructor


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"clients_per_round": 0}, "clients_per_round"),
        ({"clients_per_round": 2.5}, "clients_per_round"),
        ({"clients_per_round": True}, "clients_per_round"),
        ({"min_replies": 0}, "min_replies"),
        ({"round_timeout": 0.0}, "round_timeout"),
        ({"round_timeout": float("inf")}, "round_timeout"),
        ({"release": "gradient"}, "release.*'gradient'"),
        ({"aggregation": "median"}, "aggregation.*'median'"),
        ({"server_learning_rate": 0.0}, "server-learning-rate"),
        ({"server_learning_rate": float("nan")}, "server-learning-rate"),
        ({"eval_every": 0}, "eval-every"),
        ({"eval_every": 1.5}, "eval-every"),
        ({"persistence_threshold": -1.0}, "persistence-threshold"),
        ({"patience": -1}, "patience"),
    ],
)
def test_constructor_rejects_bad_settings(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make(hyp([0.0]), **kwargs)


@pytest.mark.parametrize(
    ("hypotheses", "match"),
    [
        ([], "at least one hypothesis"),
        ([[np.zeros(2, F32)], [np.zeros(3, F32)]], r"initial_hypotheses\[1\] has layer shapes"),
        ([[np.zeros(2, F32)], [np.zeros(2, F32), np.zeros(1, F32)]], r"initial_hypotheses\[1\]"),
        ([[np.array([0.0, np.nan], F32)]], "non-finite"),
    ],
)
def test_constructor_rejects_bad_hypotheses(hypotheses: list[list[np.ndarray]], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make(hypotheses)


def test_numpy_integers_are_accepted_as_settings() -> None:
    strategy = make(hyp([0.0]), clients_per_round=np.int64(4), patience=np.int32(2),
                    min_replies=np.int64(2))

    assert strategy.clients_per_round == 4 and type(strategy.clients_per_round) is int
    assert strategy.min_replies == 2 and strategy.patience == 2 and type(strategy.patience) is int


def test_float64_hypotheses_are_stored_as_float32() -> None:
    strategy = make([[np.array([0.1, 0.2])]])

    assert strategy.hypotheses[0][0].dtype == F32
    np.testing.assert_array_equal(strategy.hypotheses[0][0], np.array([0.1, 0.2], F32))


# ---------------------------------------------------------------------------- Flower's own loop


OPTIMA = {"A": [5.0, 6.0], "B": [4.0, -4.5]}  # the synthetic task's two optima (paper 001)


class GroupClient(FakeProxy):
    """Answers fit like a client of one of two groups: it releases its group's optimum
    (a fixed small offset per client stands for local training and noise)."""

    def __init__(self, cid: str, group: str, offset: float) -> None:
        super().__init__(cid)
        self.group, self.offset = group, offset
        self.configs: list[dict[str, Scalar]] = []

    def fit(self, ins, timeout, group_id):
        self.configs.append(dict(ins.config))
        released = np.asarray(OPTIMA[self.group], F32) + F32(self.offset)
        return reply(released, sigma=1.0, **{"client-name": f"client-{self.cid}"})


def test_flower_server_loop_runs_the_strategy_to_an_early_stop() -> None:
    # Prepare: 8 clients in two groups; every client is sampled every round; the validation
    # loss is the distance of the hypotheses to the two optima: it reaches 0 in round 1 and
    # stays there, so with patience 2 rounds 2 and 3 do not improve and round 4 is skipped.
    from flwr.server import Server, SimpleClientManager

    manager = SimpleClientManager()
    clients = [
        GroupClient(f"{i}", "AB"[i % 2], offset)
        for i, offset in enumerate([0.1, 0.1, -0.1, -0.1, 0.2, 0.2, -0.2, -0.2])
    ]
    for client in clients:
        manager.register(client)
    optima = np.array([OPTIMA["A"], OPTIMA["B"]], dtype=F32)

    def distance(hypotheses: list[list[np.ndarray]]) -> dict[str, float]:
        found = np.stack([layers[0] for layers in hypotheses])
        return {"loss": float(np.abs(found - optima).max().round(5))}

    strategy = ClusteredStrategy(
        initial_hypotheses=hyp([6.0, 5.0], [3.0, -3.0]),
        clients_per_round=8,
        evaluate_fn=distance,
        patience=2,
        rng=np.random.default_rng(5),
        **PLAIN_MEAN,  # type: ignore[arg-type]
    )
    server = Server(client_manager=manager, strategy=strategy)

    # Execute
    history, _ = server.fit(num_rounds=4, timeout=None)

    # Assert: group A → hypothesis 0, group B → hypothesis 1 (offsets average to 0).
    np.testing.assert_allclose(one_layer(strategy), optima, atol=1e-6)
    assert strategy.stopped_early and strategy.rounds_completed == 3
    assert [r.round for r in strategy.history] == [0, 1, 2, 3]
    assert [r.cluster_sizes for r in strategy.history[1:]] == [[4, 4]] * 3
    assert [t for t, _ in history.losses_centralized] == [0, 1, 2, 3]
    assert all(len(c.configs) == 3 for c in clients)  # not asked in round 4
    assert clients[0].configs[0] == {"num-hypotheses": 2, "server-round": 1}
