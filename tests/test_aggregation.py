"""budget_weights: the aggregations A, B, C of Wu, Xu, Zhu (2023) section 4, and inverse variance.

Expected values are computed by hand for σ = (1, 2, 4):
ρ = 1/σ = (1, 1/2, 1/4), Σρ = 7/4, so α = P = (4/7, 2/7, 1/7);
1/σ² = (1, 1/4, 1/16), Σ = 21/16, so inverse-variance weights = (16/21, 4/21, 1/21).
"""

import logging

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from strategies import AGGREGATIONS, aggregation
from strategies.aggregation import budget_weights, cluster_means, sign_step

SIGMAS = np.array([1.0, 2.0, 4.0])


class FixedOmega:
    """Stands in for the Generator: ``uniform`` returns a chosen ω and counts the calls."""

    def __init__(self, omega: float) -> None:
        self.omega = omega
        self.calls = 0

    def uniform(self, low: float = 0.0, high: float = 1.0) -> float:
        self.calls += 1
        return self.omega


@pytest.fixture(autouse=True)
def _fresh_zero_sigma_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    # The σ = 0 warning is logged once per process and mode; each test starts afresh.
    monkeypatch.setattr(aggregation, "_ZERO_SIGMA_WARNED", set())


def test_aggregations_constant_lists_the_four_modes() -> None:
    assert AGGREGATIONS == ("mean", "weighted", "probability", "inverse-variance")


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("mean", [1 / 3, 1 / 3, 1 / 3]),
        ("weighted", [4 / 7, 2 / 7, 1 / 7]),
        ("inverse-variance", [16 / 21, 4 / 21, 1 / 21]),
    ],
)
def test_deterministic_modes_match_hand_computed_weights(mode: str, expected: list[float]) -> None:
    # Prepare
    rng = np.random.default_rng(0)
    state_before = rng.bit_generator.state

    # Execute
    weights = budget_weights(SIGMAS, mode, rng)

    # Assert
    np.testing.assert_allclose(weights, expected, rtol=1e-12)
    assert weights.dtype == np.float64
    assert rng.bit_generator.state == state_before  # only "probability" draws


@pytest.mark.parametrize(
    ("omega", "expected"),
    [
        # P = (4/7, 2/7, 1/7) ≈ (0.571, 0.286, 0.143); kept iff P_i > ω; kept ones averaged.
        (0.0, [1 / 3, 1 / 3, 1 / 3]),
        (0.1, [1 / 3, 1 / 3, 1 / 3]),
        (0.2, [1 / 2, 1 / 2, 0.0]),
        (0.5, [1.0, 0.0, 0.0]),
        # ω ≥ max P: nobody passes, the largest P is kept.
        (0.6, [1.0, 0.0, 0.0]),
        (0.999, [1.0, 0.0, 0.0]),
    ],
)
def test_probability_mode_keeps_p_above_omega_and_averages_them(
    omega: float, expected: list[float]
) -> None:
    # Prepare
    rng = FixedOmega(omega)

    # Execute
    weights = budget_weights(SIGMAS, "probability", rng)  # type: ignore[arg-type]

    # Assert
    np.testing.assert_allclose(weights, expected, rtol=1e-12)
    assert rng.calls == 1


def test_probability_mode_draws_one_uniform_per_call_from_the_generator() -> None:
    # Prepare: a twin generator tells which ω the call saw.
    for seed in range(20):
        omega = np.random.default_rng(seed).uniform(0.0, 1.0)
        expected = (
            [1 / 3, 1 / 3, 1 / 3]
            if omega < 1 / 7
            else [1 / 2, 1 / 2, 0.0]
            if omega < 2 / 7
            else [1.0, 0.0, 0.0]
        )
        rng = np.random.default_rng(seed)

        # Execute
        weights = budget_weights(SIGMAS, "probability", rng)

        # Assert
        np.testing.assert_allclose(weights, expected, rtol=1e-12)
        twin = np.random.default_rng(seed)
        twin.uniform(0.0, 1.0)
        assert rng.bit_generator.state == twin.bit_generator.state


def test_probability_mode_selection_frequencies_match_p() -> None:
    # Prepare: N = 20 000 seeded calls. Client 1 (largest P) is always kept (it is kept when
    # P_1 > ω and by the fallback otherwise); clients 2 and 3 are kept with probability
    # P_2 = 2/7 and P_3 = 1/7. Each frequency is checked to ±5 binomial standard errors:
    # false-positive rate ≈ 5.7e-7 per check (the seed makes the test deterministic anyway).
    n_calls = 20_000
    rng = np.random.default_rng(2024)

    # Execute
    kept = np.array([budget_weights(SIGMAS, "probability", rng) > 0 for _ in range(n_calls)])

    # Assert
    frequency = kept.mean(axis=0)
    assert frequency[0] == 1.0
    for index, p in ((1, 2 / 7), (2, 1 / 7)):
        tolerance = 5.0 * np.sqrt(p * (1 - p) / n_calls)
        assert abs(frequency[index] - p) < tolerance, (index, frequency[index], p)


def test_probability_mode_nobody_kept_keeps_all_tied_largest() -> None:
    # Prepare: σ = (2, 2, 4) → P = (2/5, 2/5, 1/5); ω = 0.5 keeps nobody.
    rng = FixedOmega(0.5)

    # Execute
    weights = budget_weights(np.array([2.0, 2.0, 4.0]), "probability", rng)  # type: ignore[arg-type]

    # Assert
    np.testing.assert_allclose(weights, [0.5, 0.5, 0.0], rtol=1e-12)


@pytest.mark.parametrize("omega", [0.0, 0.3, 0.99])
def test_probability_mode_equal_sigmas_give_the_mean_whatever_omega(omega: float) -> None:
    weights = budget_weights(np.full(4, 3.0), "probability", FixedOmega(omega))  # type: ignore[arg-type]

    np.testing.assert_allclose(weights, np.full(4, 0.25), rtol=1e-12)


@pytest.mark.parametrize("mode", AGGREGATIONS)
def test_one_client_gets_all_the_weight(mode: str) -> None:
    weights = budget_weights(np.array([3.5]), mode, np.random.default_rng(1))

    np.testing.assert_array_equal(weights, [1.0])


@pytest.mark.parametrize(
    ("mode", "sigmas", "expected"),
    [
        ("weighted", [0.0, 1.0, 2.0], [1.0, 0.0, 0.0]),
        ("inverse-variance", [0.0, 1.0, 2.0], [1.0, 0.0, 0.0]),
        ("weighted", [0.0, 3.0, 0.0], [0.5, 0.0, 0.5]),
        ("weighted", [0.0, 0.0], [0.5, 0.5]),
        ("mean", [0.0, 1.0, 2.0], [1 / 3, 1 / 3, 1 / 3]),
    ],
)
def test_zero_sigma_releases_share_the_weight(
    mode: str, sigmas: list[float], expected: list[float]
) -> None:
    weights = budget_weights(np.array(sigmas), mode, np.random.default_rng(0))

    np.testing.assert_allclose(weights, expected, rtol=1e-12)
    assert np.isfinite(weights).all()


@pytest.mark.parametrize("omega", [0.0, 0.4, 0.99])
def test_zero_sigma_probability_keeps_exactly_the_non_private_releases(omega: float) -> None:
    weights = budget_weights(np.array([1.0, 0.0, 0.0, 5.0]), "probability", FixedOmega(omega))  # type: ignore[arg-type]

    np.testing.assert_allclose(weights, [0.0, 0.5, 0.5, 0.0], rtol=1e-12)


def test_zero_sigma_warning_is_logged_once_per_mode(caplog: pytest.LogCaptureFixture) -> None:
    # Prepare
    sigmas = np.array([0.0, 1.0])
    rng = np.random.default_rng(0)

    # Execute
    with caplog.at_level(logging.WARNING, logger="strategies.aggregation"):
        for _ in range(3):
            budget_weights(sigmas, "weighted", rng)
        budget_weights(sigmas, "inverse-variance", rng)
        budget_weights(sigmas, "mean", rng)

    # Assert
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2
    assert "'weighted'" in messages[0] and "sigma=0" in messages[0]
    assert "'inverse-variance'" in messages[1]


def test_tiny_sigma_does_not_overflow() -> None:
    # 1/σ² = 1e400 overflows a float64; the weights must still be finite and sum to 1.
    weights = budget_weights(np.array([1e-200, 1.0]), "inverse-variance", np.random.default_rng(0))

    np.testing.assert_allclose(weights, [1.0, 0.0], atol=1e-300)
    assert weights.sum() == pytest.approx(1.0)


def test_unknown_mode_raises_naming_aggregation_and_value() -> None:
    with pytest.raises(ValueError, match=r"aggregation.*'median'"):
        budget_weights(SIGMAS, "median", np.random.default_rng(0))


@pytest.mark.parametrize(
    "sigmas",
    [
        np.array([]),
        np.array([1.0, -0.5]),
        np.array([1.0, np.nan]),
        np.array([np.inf]),
        np.ones((2, 2)),
    ],
)
def test_invalid_sigmas_raise(sigmas: np.ndarray) -> None:
    with pytest.raises(ValueError, match="sigmas"):
        budget_weights(sigmas, "weighted", np.random.default_rng(0))


@settings(max_examples=200, deadline=None)
@given(
    sigmas=st.lists(
        st.one_of(st.just(0.0), st.floats(min_value=1e-300, max_value=1e300)),
        min_size=1,
        max_size=12,
    ),
    mode=st.sampled_from(AGGREGATIONS),
    seed=st.integers(min_value=0, max_value=2**32 - 1),
)
def test_weights_are_a_probability_vector(sigmas: list[float], mode: str, seed: int) -> None:
    weights = budget_weights(np.array(sigmas), mode, np.random.default_rng(seed))

    assert weights.shape == (len(sigmas),)
    assert np.isfinite(weights).all()
    assert (weights >= 0).all()
    assert weights.sum() == pytest.approx(1.0, abs=1e-12)
    assert (weights > 0).any()


@pytest.mark.parametrize("mode", ["weighted", "inverse-variance"])
def test_noisier_release_never_weighs_more(mode: str) -> None:
    sigmas = np.array([0.3, 1.0, 1.0, 2.5, 7.0])

    weights = budget_weights(sigmas, mode, np.random.default_rng(0))

    assert (np.diff(weights) <= 0).all()
    assert weights[1] == weights[2]


# ----------------------------------------------------------------- cluster_means, sign_step


def test_cluster_means_weight_within_each_cluster_and_keep_empty_ones() -> None:
    # Prepare: cluster 0 = (7, 0), (14, 7), (21, 14) with σ = (1, 2, 4) → α = (4/7, 2/7, 1/7):
    # (4 + 4 + 3, 0 + 2 + 2) = (11, 4). Cluster 1 = (-100, -100) σ 1 and (-103, -100) σ 2
    # → α = (2/3, 1/3): (-101, -100). Cluster 2 is empty and keeps its hypothesis (5, 5).
    released = np.array([[-100, -100], [7, 0], [14, 7], [-103, -100], [21, 14]], np.float32)
    sigmas = np.array([1.0, 1.0, 2.0, 2.0, 4.0])
    labels = np.array([1, 0, 0, 1, 0])
    hypotheses = np.array([[0, 0], [0, 0], [5, 5]], np.float32)

    # Execute
    means = cluster_means(released, sigmas, labels, hypotheses, "weighted",
                          np.random.default_rng(0))

    # Assert
    np.testing.assert_allclose(means, [[11, 4], [-101, -100], [5, 5]], rtol=1e-6)
    assert means.dtype == np.float32
    np.testing.assert_array_equal(hypotheses, [[0, 0], [0, 0], [5, 5]])  # not modified


def test_cluster_means_draw_one_omega_per_non_empty_cluster_in_cluster_order() -> None:
    # Prepare: clusters 0 and 2 non-empty, 1 empty; with ω = 0.5 and equal σ every member
    # is kept (P = 1/2 each is not > 0.5, so the largest, all tied, are kept): plain means.
    released = np.array([[2, 0], [4, 0], [0, 6], [0, 8]], np.float32)
    labels = np.array([2, 2, 0, 0])
    hypotheses = np.array([[1, 1], [9, 9], [3, 3]], np.float32)
    omega = FixedOmega(0.5)

    # Execute
    means = cluster_means(released, np.ones(4), labels, hypotheses, "probability", omega)  # type: ignore[arg-type]

    # Assert
    np.testing.assert_array_equal(means, [[0, 7], [9, 9], [3, 0]])
    assert omega.calls == 2


def test_cluster_means_without_releases_keep_every_hypothesis() -> None:
    # Prepare
    hypotheses = np.array([[1, 2], [3, 4]], np.float32)
    rng = np.random.default_rng(0)
    state_before = rng.bit_generator.state

    # Execute
    means = cluster_means(np.zeros((0, 2), np.float32), np.zeros(0), np.zeros(0, np.intp),
                          hypotheses, "probability", rng)

    # Assert
    np.testing.assert_array_equal(means, hypotheses)
    assert rng.bit_generator.state == state_before


def test_sign_step_moves_each_coordinate_by_the_weighted_majority() -> None:
    # Prepare: σ = (1, 2, 4) → α = (4/7, 2/7, 1/7). Coordinate 0: +4/7 - 2/7 - 1/7 > 0 → +η;
    # coordinate 1: -4/7 + 2/7 + 1/7 < 0 → -η; coordinate 2: all +1 → +η. η = 0.5.
    theta = np.array([[1.0, 1.0, -1.0]], np.float32)
    signs = np.array([[1, -1, 1], [-1, 1, 1], [-1, 1, 1]], np.float32)

    # Execute
    new = sign_step(theta, signs, SIGMAS, "weighted", np.random.default_rng(0), 0.5)

    # Assert
    np.testing.assert_array_equal(new, [[1.5, 0.5, -0.5]])
    assert new.dtype == np.float32


def test_sign_step_leaves_a_tied_coordinate_in_place() -> None:
    # Prepare: two releases of equal weight disagree on coordinate 0 (vote 0 → sign 0).
    theta = np.array([[2.0, 2.0]], np.float32)
    signs = np.array([[1, 1], [-1, 1]], np.float32)

    # Execute
    new = sign_step(theta, signs, np.array([1.0, 1.0]), "mean", np.random.default_rng(0), 0.25)

    # Assert
    np.testing.assert_array_equal(new, [[2.0, 2.25]])
