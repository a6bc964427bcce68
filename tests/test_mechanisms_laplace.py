"""The Euclidean Laplace sampler and mechanism: distribution, privacy, calibration, edge cases.

Statistical tests are seeded (so they are deterministic) and each states its
sample size and the false-positive rate it would have with fresh randomness.
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from mechanisms import (
    EuclideanLaplace,
    MetricPrivacyEvent,
    NeighbourhoodEvent,
    sample_euclidean_laplace,
)
from mechanisms.laplace import laplace_grid


def draws(n: int, epsilon: float, count: int, seed: int) -> np.ndarray:
    """`count` independent noise vectors, one per row."""
    rng = np.random.default_rng(seed)
    return np.stack([sample_euclidean_laplace(n, epsilon, rng) for _ in range(count)])


# -- the sampler: input validation -------------------------------------------------------------


def test_sampler_error_message_names_epsilon_and_value() -> None:
    message = "epsilon must be positive and finite, got epsilon=-1.0"
    with pytest.raises(ValueError, match=re.escape(message)):
        sample_euclidean_laplace(3, -1.0, np.random.default_rng(0))


@settings(max_examples=30, deadline=None)
@given(
    epsilon=st.one_of(
        st.floats(max_value=0.0, allow_nan=False),
        st.sampled_from([math.nan, math.inf, -math.inf]),
    )
)
def test_sampler_rejects_bad_epsilon(epsilon: float) -> None:
    with pytest.raises(ValueError, match=r"^epsilon must be positive and finite, got epsilon="):
        sample_euclidean_laplace(3, epsilon, np.random.default_rng(0))


@settings(max_examples=20, deadline=None)
@given(n=st.integers(max_value=0))
def test_sampler_rejects_non_positive_n(n: int) -> None:
    with pytest.raises(ValueError, match=rf"^n must be a positive integer, got n={n}$"):
        sample_euclidean_laplace(n, 1.0, np.random.default_rng(0))


@pytest.mark.parametrize("n", [2.0, "3", True, None])
def test_sampler_rejects_non_integer_n(n: object) -> None:
    with pytest.raises(TypeError, match=r"^n must be an integer"):
        sample_euclidean_laplace(n, 1.0, np.random.default_rng(0))  # type: ignore[arg-type]


@pytest.mark.parametrize("rng", [None, 42, np.random.RandomState(0)])
def test_sampler_rejects_anything_but_a_generator(rng: object) -> None:
    with pytest.raises(TypeError, match=r"^rng must be a numpy.random.Generator"):
        sample_euclidean_laplace(3, 1.0, rng)  # type: ignore[arg-type]


@pytest.mark.parametrize("n", [1, 2, 17])
def test_sampler_returns_float64_vector(n: int) -> None:
    # Execute
    noise = sample_euclidean_laplace(n, 0.5, np.random.default_rng(3))

    # Assert
    assert noise.dtype == np.float64
    assert noise.shape == (n,)
    assert np.isfinite(noise).all()


def test_sampler_accepts_numpy_integers_and_is_reproducible() -> None:
    # Execute
    a = sample_euclidean_laplace(np.int64(5), np.float32(2.0), np.random.default_rng(9))  # type: ignore[arg-type]
    b = sample_euclidean_laplace(5, 2.0, np.random.default_rng(9))

    # Assert
    np.testing.assert_array_equal(a, b)


def test_sampler_refuses_a_radius_that_overflows() -> None:
    with pytest.raises(ValueError, match=r"epsilon is too small"):
        sample_euclidean_laplace(10, 5e-324, np.random.default_rng(0))


# -- the sampler: distribution (Proposition 3.1, Lemma 2) ------------------------------------


@pytest.mark.parametrize(("n", "epsilon"), [(1, 1.0), (5, 2.0), (300, 0.1)])
def test_radius_follows_gamma_n_one_over_epsilon(n: int, epsilon: float) -> None:
    # Prepare: 3000 draws; KS at alpha = 0.001 (false-positive rate 0.1% per case).
    radii = np.linalg.norm(draws(n, epsilon, 3000, seed=11), axis=1)

    # Execute
    fit = stats.kstest(radii, stats.gamma(a=n, scale=1.0 / epsilon).cdf)
    off_by_one = stats.kstest(radii, stats.gamma(a=n + 1, scale=1.0 / epsilon).cdf)

    # Assert: accepted, while the neighbouring shape is rejected (the test has power).
    assert fit.pvalue > 1e-3
    assert off_by_one.pvalue < 1e-3


@pytest.mark.parametrize("n", [2, 5, 40])
def test_direction_projection_follows_beta(n: int) -> None:
    # Prepare: for a uniform direction u in R^n and a fixed unit vector v,
    # (1 + <u, v>)/2 ~ Beta((n-1)/2, (n-1)/2). 3000 draws; KS at alpha = 0.001.
    noise = draws(n, 1.5, 3000, seed=12)
    v = np.arange(1.0, n + 1.0)
    v /= np.linalg.norm(v)

    # Execute
    projection = noise @ v / np.linalg.norm(noise, axis=1)
    result = stats.kstest((1.0 + projection) / 2.0, stats.beta((n - 1) / 2, (n - 1) / 2).cdf)

    # Assert
    assert result.pvalue > 1e-3


def test_direction_in_3d_fills_octants_evenly() -> None:
    # Prepare: 8000 draws in R^3; chi-square on the 8 octants at alpha = 0.001.
    noise = draws(3, 1.0, 8000, seed=13)

    # Execute
    octant = (noise > 0).astype(int) @ np.array([1, 2, 4])
    counts = np.bincount(octant, minlength=8)
    result = stats.chisquare(counts)

    # Assert
    assert result.pvalue > 1e-3


@pytest.mark.parametrize(("n", "epsilon"), [(1, 1.0), (4, 2.0), (20, 0.5)])
def test_each_coordinate_has_variance_n_plus_one_over_epsilon_squared(
    n: int, epsilon: float
) -> None:
    # Prepare: 20000 draws. Var(x_i) = (n+1)/eps^2 (Lemma 2); the fourth moment is
    # E x_i^4 = E r^4 E u_i^4 = 3(n+1)(n+3)/eps^4, so the sample variance has standard
    # error sqrt((mu4 - var^2)/N). Bound: 4.5 standard errors per coordinate
    # (two-sided false-positive rate ~7e-6 each under the normal approximation).
    count = 20000
    noise = draws(n, epsilon, count, seed=14)
    expected = (n + 1) / epsilon**2
    mu4 = 3 * (n + 1) * (n + 3) / epsilon**4
    stderr = math.sqrt((mu4 - expected**2) / count)

    # Execute
    variances = noise.var(axis=0)
    means = noise.mean(axis=0)

    # Assert
    assert np.all(np.abs(variances - expected) < 4.5 * stderr)
    assert np.all(np.abs(means) < 4.5 * math.sqrt(expected / count))


def test_mean_norm_is_n_over_epsilon() -> None:
    # Prepare: 2000 draws in R^50 at eps = 0.5; ||rho|| ~ Gamma(50, 2) has sd sqrt(n)/eps,
    # bound 4.5 standard errors (false-positive rate ~7e-6).
    n, epsilon, count = 50, 0.5, 2000
    norms = np.linalg.norm(draws(n, epsilon, count, seed=15), axis=1)

    # Execute
    mean = norms.mean()

    # Assert
    assert abs(mean - n / epsilon) < 4.5 * math.sqrt(n) / epsilon / math.sqrt(count)


def test_neighbouring_inputs_are_indistinguishable_up_to_exp_epsilon_d() -> None:
    # Prepare: d-privacy says P[x + rho in S] <= exp(eps * d) P[x' + rho in S] for
    # ||x - x'|| = d. In R^2, x = 0 and x' = (d, 0); S = unit-width bins of the first
    # coordinate (post-processing keeps the bound). 50000 draws per input; bins with
    # >= 300 hits on both sides; each ratio may exceed the bound by 4.5 standard
    # errors of the log-ratio (false-positive rate ~4e-6 per bin, ~1e-4 overall).
    # A sampler whose noise is 1.5x too small fails this test.
    epsilon, d, count = 1.0, 1.0, 50000
    rng = np.random.default_rng(16)
    first = np.array([sample_euclidean_laplace(2, epsilon, rng)[0] for _ in range(count)])
    second = np.array([sample_euclidean_laplace(2, epsilon, rng)[0] for _ in range(count)]) + d
    edges = np.arange(-8.0, 9.0, 1.0)
    bound = math.exp(epsilon * d)

    # Execute
    hits_first, _ = np.histogram(first, edges)
    hits_second, _ = np.histogram(second, edges)

    # Assert
    keep = (hits_first >= 300) & (hits_second >= 300)
    assert keep.sum() >= 8
    for a, b in ((hits_first[keep], hits_second[keep]), (hits_second[keep], hits_first[keep])):
        tolerance = 4.5 * np.sqrt(1.0 / a + 1.0 / b)
        assert np.all(a / b <= bound * np.exp(tolerance))
    # The ratio does get close to the bound in the tails: the bound is not vacuous here.
    assert np.max(hits_first[keep] / hits_second[keep]) > 0.8 * bound


# -- the mechanism -------------------------------------------------------------------------


def model(*arrays: Any, dtype: type = np.float32) -> list[np.ndarray]:
    return [np.asarray(a, dtype=dtype) for a in arrays]


def test_neighbourhood_event_is_n_over_nu_from_public_numbers_only() -> None:
    # Prepare: delta = (1, 2, 2, 0) has norm 3; n = 4, nu = 2 -> cost n/nu = 2.
    reference = model([[0, 0], [0, 0]])
    updated = model([[1, 2], [2, 0]])
    mechanism = EuclideanLaplace(calibration="neighbourhood", noise_multiplier=2.0)

    # Execute
    event = mechanism.event(reference, updated)

    # Assert: the event holds the block size and nu, nothing computed from ||delta||.
    assert event == NeighbourhoodEvent((4,), 2.0)
    assert event.family == "d-privacy"
    assert event.cost == 2.0


def test_neighbourhood_cost_is_bit_identical_whatever_the_update_norm() -> None:
    # Prepare: n = 1000, nu = 7, updates whose norms range from 1e-3 to 1e3 (the two
    # extremes and 200 log-uniform ones). Recording eps * ||delta|| with
    # eps = n/(nu ||delta||) would miss n/nu in the last bits for some of these norms,
    # and which ones would depend on the private ||delta||.
    n, nu = 1000, 7.0
    rng = np.random.default_rng(21)
    direction = rng.standard_normal(n)
    direction /= np.linalg.norm(direction)
    norms = np.concatenate([[1e-3, 1e3], 10.0 ** rng.uniform(-3.0, 3.0, 200)])
    reference = [np.zeros(n)]
    mechanism = EuclideanLaplace(noise_multiplier=nu)

    # Execute
    events = [mechanism.event(reference, [direction * r]) for r in norms]

    # Assert: == on floats, on purpose; and the product would not have passed.
    assert all(e == NeighbourhoodEvent((n,), nu) for e in events)
    assert all(e.cost == n / nu for e in events)
    radii = [float(np.linalg.norm(direction * r)) for r in norms]
    assert any(n / (nu * r) * r != n / nu for r in radii)


def test_per_layer_costs_add_up_to_n_over_nu() -> None:
    # Prepare: layers of 3 and 5 parameters, nu = 4: costs 3/4 + 5/4 = 2.
    reference = model([0, 0, 0], [0, 0, 0, 0, 0])
    updated = model([1, 0, 0], [0, 3, 4, 0, 0])
    mechanism = EuclideanLaplace(noise_multiplier=4.0, per_layer=True)

    # Execute
    event = mechanism.event(reference, updated)

    # Assert
    assert event == NeighbourhoodEvent((3, 5), 4.0)
    assert event.cost == 2.0


def test_fixed_calibration_costs_epsilon_times_public_radius_per_layer() -> None:
    # Prepare
    reference = model([0, 0, 0], [0, 0], 0.0)
    updated = model([1, 0, 0], [0, 3], 2.0)

    # Execute
    whole = EuclideanLaplace(calibration="fixed", epsilon=0.5, public_radius=3.0)
    layered = EuclideanLaplace(calibration="fixed", epsilon=0.5, public_radius=3.0, per_layer=True)

    # Assert: the cost does not depend on the data; per layer, three layers cost 3x.
    assert whole.event(reference, updated) == MetricPrivacyEvent(((0.5, 3.0),))
    assert whole.event(reference, reference).cost == pytest.approx(1.5)
    assert layered.event(reference, updated).cost == pytest.approx(4.5)


def test_a_zero_update_without_a_least_radius_is_refused() -> None:
    # Prepare: reference == updated, so ||delta|| = 0: the heuristic's noise would be 0.
    reference = model([[0.5, -1.0], [2.0, 3.0]], [7.0])
    updated = [a.copy() for a in reference]
    mechanism = EuclideanLaplace(noise_multiplier=5.0)

    # Execute / Assert: the event is the same as for any update (charged first), but nothing
    # is released without noise.
    assert mechanism.event(reference, updated) == NeighbourhoodEvent((5,), 5.0)
    with pytest.raises(ValueError, match="refusing a release without noise"):
        mechanism.sanitize(reference, updated, rng=np.random.default_rng(0))


def test_a_zero_update_gets_the_noise_of_the_least_radius() -> None:
    # Prepare: ||delta|| = 0, least radius 0.5, nu = 4: E||noise|| = nu * 0.5 = 2 over n = 5.
    reference = model([[0.5, -1.0], [2.0, 3.0]], [7.0], dtype=np.float64)
    updated = [a.copy() for a in reference]
    mechanism = EuclideanLaplace(noise_multiplier=4.0, least_radius=0.5)
    rng = np.random.default_rng(0)
    draws = 2000

    # Execute
    norms = np.array([
        math.sqrt(sum(float(((o - u) ** 2).sum()) for o, u in zip(
            mechanism.sanitize(reference, updated, rng=rng), updated, strict=True)))
        for _ in range(draws)
    ])

    # Assert: the noise norm is Gamma(5, 2/5): KS test at alpha = 1e-3 over 2000 draws.
    assert stats.kstest(norms, stats.gamma(5, scale=2.0 / 5).cdf).pvalue > 1e-3
    assert mechanism.event(reference, updated).cost == pytest.approx(5 / 4.0)


def test_the_least_radius_binds_only_below_it() -> None:
    # Prepare: ||delta|| = 3 > least radius 0.01: the noise is nu * ||delta||, as the paper's.
    reference = model([0.0, 0.0], dtype=np.float64)
    updated = model([3.0, 0.0], dtype=np.float64)
    with_floor = EuclideanLaplace(noise_multiplier=2.0, least_radius=0.01)
    without = EuclideanLaplace(noise_multiplier=2.0)

    # Execute / Assert: the same draws give the same release.
    a = with_floor.sanitize(reference, updated, rng=np.random.default_rng(3))
    b = without.sanitize(reference, updated, rng=np.random.default_rng(3))
    np.testing.assert_array_equal(a[0], b[0])


def test_a_zero_layer_in_per_layer_mode_gets_the_least_radius_noise() -> None:
    # Prepare: the first layer did not move; the second did.
    reference = model([1.0, 2.0], [0.0, 0.0, 0.0])
    updated = model([1.0, 2.0], [0.1, 0.0, 0.0])
    mechanism = EuclideanLaplace(noise_multiplier=2.0, per_layer=True, least_radius=0.01)

    # Execute
    event = mechanism.event(reference, updated)
    released = mechanism.sanitize(reference, updated, rng=np.random.default_rng(1))

    # Assert: both layers are noisy; the cost is the same as before.
    assert not np.array_equal(released[0], updated[0])
    assert not np.array_equal(released[1], updated[1])
    assert event.cost == pytest.approx(5 / 2.0)


@pytest.mark.parametrize("nu", [1.0, 0.5])
def test_a_subnormal_update_norm_is_refused_without_a_floor_and_floored_with_one(
    nu: float,
) -> None:
    # Prepare: ||delta|| = 5e-324 makes n/(nu ||delta||) overflow to inf (nu = 1) or
    # nu ||delta|| underflow to 0 (nu = 0.5).
    reference = model([0.0, 0.0], dtype=np.float64)
    updated = model([5e-324, 0.0], dtype=np.float64)

    # Execute / Assert
    with pytest.raises(ValueError, match="refusing a release without noise"):
        EuclideanLaplace(noise_multiplier=nu).sanitize(
            reference, updated, rng=np.random.default_rng(2))
    floored = EuclideanLaplace(noise_multiplier=nu, least_radius=0.1).sanitize(
        reference, updated, rng=np.random.default_rng(2))
    assert float(np.abs(floored[0]).max()) > 1e-6


def test_an_overflowing_noise_scale_is_refused_not_released_raw() -> None:
    # Prepare: nu * ||delta|| overflows float64 (the attack: an enormous noise multiplier).
    reference = model([0.0, 0.0], dtype=np.float64)
    updated = model([10.0, 0.0], dtype=np.float64)
    mechanism = EuclideanLaplace(noise_multiplier=1e308, least_radius=0.01)

    # Execute / Assert
    with pytest.raises(ValueError, match="refusing a release without noise"):
        mechanism.sanitize(reference, updated, rng=np.random.default_rng(2))


def test_release_is_the_exact_sum_on_the_public_grid_cast_to_float32() -> None:
    # Prepare: a float32 and a float64 layer; the same seed drawn directly.
    reference: list[np.ndarray] = [np.zeros(3, np.float32), np.zeros((2, 2), np.float64)]
    updated: list[np.ndarray] = [np.array([0.1, 0.2, 0.3], np.float32), np.full((2, 2), 0.25)]
    mechanism = EuclideanLaplace(calibration="fixed", epsilon=2.0, public_radius=1.0)
    noise = sample_euclidean_laplace(7, 2.0, np.random.default_rng(5))
    spacing = laplace_grid(7, 2.0)

    # Execute
    exact = mechanism.sanitize_exact(reference, updated, rng=np.random.default_rng(5))
    released = mechanism.sanitize(reference, updated, rng=np.random.default_rng(5))

    # Assert: a power of two below the noise scale sqrt(7)/2 / 16; float32 whatever the
    # layers' dtypes; each value the nearest grid point to the real sum (here no sum lies
    # near a half step, so rint of the float sum is that point).
    assert math.frexp(spacing)[0] == 0.5 and spacing <= math.sqrt(7) / 2 / 16
    assert [a.dtype for a in released] == [np.float32, np.float32]
    flat = np.concatenate([updated[0].astype(np.float64), updated[1].ravel()])
    expected = np.rint((flat + noise) / spacing) * spacing
    np.testing.assert_array_equal(np.concatenate([a.ravel() for a in exact]), expected)
    np.testing.assert_array_equal(np.concatenate([a.ravel() for a in released]),
                                  expected.astype(np.float32))


def test_neighbourhood_noise_norm_averages_nu_times_update_norm() -> None:
    # Prepare: n = 10, nu = 2, ||delta|| = 1.5 -> E||rho|| = nu ||delta|| = 3 and
    # sd(||rho||) = sqrt(n)/eps. 2000 releases; bound 4.5 standard errors (FPR ~7e-6).
    reference = [np.zeros(10)]
    updated = [np.zeros(10)]
    updated[0][:2] = [0.9, 1.2]
    mechanism = EuclideanLaplace(noise_multiplier=2.0)
    rng = np.random.default_rng(17)
    count, epsilon = 2000, 10 / (2.0 * 1.5)

    # Execute
    norms = np.array(
        [np.linalg.norm(mechanism.sanitize(reference, updated, rng=rng)[0] - updated[0])
         for _ in range(count)]
    )

    # Assert
    assert abs(norms.mean() - 3.0) < 4.5 * math.sqrt(10) / epsilon / math.sqrt(count)


def test_sigma_is_the_per_coordinate_noise_std() -> None:
    # Prepare: fixed eps = 2 in R^6: sigma = sqrt(7)/2. Check it against the noise:
    # mean of ||rho||^2/n over 4000 releases estimates sigma^2; its standard error
    # follows from Var(r^2) = theta^4 [n(n+1)(n+2)(n+3) - n^2(n+1)^2]; 4.5 SE (FPR ~7e-6).
    n, epsilon, count = 6, 2.0, 4000
    reference, updated = [np.zeros(n)], [np.ones(n)]
    mechanism = EuclideanLaplace(calibration="fixed", epsilon=epsilon, public_radius=1.0)
    rng = np.random.default_rng(18)

    # Execute
    sigma = mechanism.public_metrics(reference, updated)["sigma"]
    energy = np.array(
        [np.sum((mechanism.sanitize(reference, updated, rng=rng)[0] - 1.0) ** 2) / n
         for _ in range(count)]
    )

    # Assert
    assert sigma == pytest.approx(math.sqrt(n + 1) / epsilon, rel=1e-12)
    var_r2 = (n * (n + 1) * (n + 2) * (n + 3) - n**2 * (n + 1) ** 2) / epsilon**4
    assert abs(energy.mean() - sigma**2) < 4.5 * math.sqrt(var_r2) / n / math.sqrt(count)


def test_per_layer_sigma_is_the_root_mean_square_over_coordinates() -> None:
    # Prepare: fixed eps = 2, layers of 1 and 3 coordinates:
    # sigma_1^2 = 2/4, sigma_2^2 = 4/4 -> RMS = sqrt((1 * 0.5 + 3 * 1.0) / 4).
    reference = model([0.0], [0.0, 0.0, 0.0])
    mechanism = EuclideanLaplace(
        calibration="fixed", epsilon=2.0, public_radius=1.0, per_layer=True
    )

    # Execute
    metrics = mechanism.public_metrics(reference, reference)

    # Assert
    assert metrics == {
        "sigma": pytest.approx(math.sqrt(3.5 / 4)),
        "budget-epsilon": 0.0,
        "budget-delta": 0.0,
    }


def test_neighbourhood_sigma_scales_with_the_update_norm() -> None:
    # Prepare: n = 4, nu = 2, ||delta|| = 3 -> eps = 2/3, sigma = sqrt(5) / (2/3).
    reference = model([[0, 0], [0, 0]])
    updated = model([[1, 2], [2, 0]])

    # Execute
    sigma = EuclideanLaplace(noise_multiplier=2.0).public_metrics(reference, updated)["sigma"]

    # Assert
    assert sigma == pytest.approx(math.sqrt(5) * 1.5, rel=1e-6)


@pytest.mark.parametrize(
    "mechanism",
    [
        EuclideanLaplace(noise_multiplier=2.0),
        EuclideanLaplace(calibration="fixed", epsilon=3.0, public_radius=1.0, per_layer=True),
    ],
    ids=repr,
)
def test_spread_does_not_change_the_release_or_sigma(mechanism: EuclideanLaplace) -> None:
    # Prepare: d-privacy is a guarantee on the released point itself; the hypotheses'
    # spread must not enter (neither the noise nor the declared sigma).
    reference = model([0.0, 0.0, 0.0], [1.0, 1.0])
    updated = model([0.5, -0.25, 0.0], [1.0, 2.0])

    # Execute
    plain = mechanism.sanitize(reference, updated, rng=np.random.default_rng(4))
    spread = mechanism.sanitize(reference, updated, rng=np.random.default_rng(4), spread=50.0)

    # Assert
    for a, b in zip(plain, spread, strict=True):
        np.testing.assert_array_equal(a, b)
    assert mechanism.public_metrics(reference, updated, spread=50.0) == (
        mechanism.public_metrics(reference, updated)
    )


def test_release_that_overflows_the_dtype_is_refused() -> None:
    # Prepare: the release dtype, float32, tops out at 3.4e38; noise of scale
    # nu * ||delta|| = 5 * 6e38 overflows it (the float64 release is finite).
    reference = [np.zeros(4, np.float64)]
    updated = [np.full(4, 3e38, np.float64)]

    # Execute / Assert
    with pytest.raises(ValueError, match=r"overflows float32"):
        EuclideanLaplace(noise_multiplier=5.0).sanitize(
            reference, updated, rng=np.random.default_rng(0)
        )


# -- construction --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "pattern"),
    [
        ({"calibration": "neighbourhood"}, ValueError, "noise_multiplier is required"),
        ({"calibration": "fixed", "epsilon": 1.0}, ValueError, "public_radius are required"),
        ({"noise_multiplier": 1.0, "epsilon": 1.0}, ValueError,
         "only used with calibration='fixed'"),
        (
            {"calibration": "fixed", "epsilon": 1.0, "public_radius": 1.0, "noise_multiplier": 2.0},
            ValueError,
            "only used with calibration='neighbourhood'",
        ),
        ({"calibration": "adaptive", "noise_multiplier": 1.0}, ValueError,
         "calibration must be one of"),
        ({"noise_multiplier": 1.0, "per_layer": 1}, TypeError, "per_layer must be True or False"),
        ({"noise_multiplier": "5"}, TypeError, "noise_multiplier must be a real number"),
    ],
)
def test_constructor_errors_name_the_setting(
    kwargs: dict[str, object], error: type[Exception], pattern: str
) -> None:
    with pytest.raises(error, match=re.escape(pattern)):
        EuclideanLaplace(**kwargs)  # type: ignore[arg-type]


@settings(max_examples=25, deadline=None)
@given(
    name=st.sampled_from(["noise_multiplier", "epsilon", "public_radius"]),
    value=st.one_of(st.floats(max_value=0.0), st.sampled_from([math.inf, math.nan])),
)
def test_constructor_rejects_bad_values_naming_them(name: str, value: float) -> None:
    # Prepare
    kwargs: dict[str, object] = (
        {"noise_multiplier": value}
        if name == "noise_multiplier"
        else {"calibration": "fixed", "epsilon": 1.0, "public_radius": 1.0, name: value}
    )

    # Execute / Assert
    with pytest.raises(ValueError, match=rf"^{name} must be positive and finite, got {name}="):
        EuclideanLaplace(**kwargs)  # type: ignore[arg-type]
