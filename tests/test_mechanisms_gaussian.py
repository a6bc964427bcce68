"""Clipping, the Gaussian mechanism and the stochastic-sign mechanism."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from mechanisms import (
    GaussianMechanism,
    GaussianReleaseEvent,
    SignReleaseEvent,
    StochasticSign,
    calibrate_gaussian_noise_multiplier,
    clip_elementwise,
    clip_l2,
    hypotheses_diameter,
    l2_sensitivity,
)
from mechanisms.grid import grid_spacing

SETTINGS = {"clip": 1.0, "epsilon": 2.0, "delta": 1e-5, "planned_releases": 10}

# -- clipping -----------------------------------------------------------------------------


def test_clip_l2_scales_the_whole_update_to_norm_c() -> None:
    # Prepare: two layers, joint vector (3, 4) with norm 5.
    arrays = [np.array([3.0], np.float32), np.array([[4.0]])]

    # Execute
    clipped = clip_l2(arrays, 1.0)

    # Assert
    np.testing.assert_allclose(clipped[0], [0.6], rtol=1e-6)
    np.testing.assert_allclose(clipped[1], [[0.8]], rtol=1e-12)
    assert [a.dtype for a in clipped] == [np.float32, np.float64]
    assert [a.shape for a in clipped] == [(1,), (1, 1)]


def test_clip_l2_leaves_short_updates_alone_but_copies_them() -> None:
    # Prepare
    arrays = [np.array([0.3, -0.4])]

    # Execute
    clipped = clip_l2(arrays, 1.0)

    # Assert
    np.testing.assert_array_equal(clipped[0], arrays[0])
    assert not np.shares_memory(clipped[0], arrays[0])


def test_clip_elementwise_bounds_each_coordinate() -> None:
    # Execute
    clipped = clip_elementwise([np.array([-3.0, -0.5, 0.2, 9.0], np.float32)], 1.0)

    # Assert
    np.testing.assert_array_equal(clipped[0], np.array([-1.0, -0.5, 0.2, 1.0], np.float32))
    assert clipped[0].dtype == np.float32


def test_sensitivity_is_2c_for_l2_and_2c_sqrt_n_elementwise() -> None:
    assert l2_sensitivity("l2", 1.5, 100) == 3.0
    assert l2_sensitivity("elementwise", 0.5, 16) == 4.0


@pytest.mark.parametrize(
    ("call", "pattern"),
    [
        (lambda: clip_l2([np.ones(2)], -1.0), "c must be positive and finite, got c=-1.0"),
        (lambda: clip_elementwise([np.ones(2)], math.nan),
         "c must be positive and finite, got c=nan"),
        (lambda: l2_sensitivity("l1", 1.0, 3),
         "mode must be one of 'l2' | 'elementwise', got mode='l1'"),
        (lambda: l2_sensitivity("l2", 0.0, 3), "clip must be positive and finite, got clip=0.0"),
        (lambda: l2_sensitivity("l2", 1.0, 0), "n must be a positive integer, got n=0"),
    ],
)
def test_clipping_errors_name_the_parameter(call: object, pattern: str) -> None:
    with pytest.raises(ValueError, match=re.escape(pattern)):
        call()  # type: ignore[operator]


# -- the hypotheses' diameter -------------------------------------------------------------


def test_hypotheses_diameter_is_the_largest_pairwise_distance() -> None:
    # Prepare: three two-layer models. Flattened: a = (0, 0, 0), b = (3, 0, 4),
    # c = (0, -6, 8): |a-b| = 5, |a-c| = 10, |b-c| = sqrt(9 + 36 + 16) = sqrt(61).
    a: list[np.ndarray] = [np.zeros(2, np.float32), np.zeros((1, 1))]
    b: list[np.ndarray] = [np.array([3.0, 0.0], np.float32), np.array([[4.0]])]
    c: list[np.ndarray] = [np.array([0.0, -6.0], np.float32), np.array([[8.0]])]

    # Execute / Assert
    assert hypotheses_diameter([a, b, c]) == 10.0
    assert hypotheses_diameter([b, c]) == pytest.approx(math.sqrt(61), rel=1e-15)
    assert hypotheses_diameter([c, b, a]) == 10.0  # order does not matter


def test_hypotheses_diameter_of_one_hypothesis_is_zero() -> None:
    assert hypotheses_diameter([[np.ones(3), np.ones((2, 2))]]) == 0.0


def test_hypotheses_diameter_is_computed_in_float64() -> None:
    # Prepare: 3e38 - (-3e38) overflows float32 (max ~3.4e38), not float64.
    a = [np.array([3e38], np.float32)]
    b = [np.array([-3e38], np.float32)]

    # Execute
    diameter = hypotheses_diameter([a, b])

    # Assert
    assert diameter == pytest.approx(6e38, rel=1e-7)
    assert type(diameter) is float


@pytest.mark.parametrize(
    ("hypotheses", "error", "pattern"),
    [
        ([], ValueError, "at least one model"),
        ([[np.zeros(2)], [np.zeros(3)]], ValueError, r"hypotheses\[1\] has layer shapes"),
        ([[np.zeros(2)], [np.zeros(2), np.zeros(1)]], ValueError, "layer shapes"),
        ([[np.zeros(2)], [np.array([0.0, np.nan])]], ValueError,
         r"hypotheses\[1\]\[0\] contains non-finite"),
        ([np.zeros(2)], TypeError, r"hypotheses\[0\] must be a sequence of arrays"),
        (np.zeros((2, 2)), TypeError, "hypotheses must be a sequence of models"),
        ([[np.array(["a"])]], TypeError, "real numeric array"),
    ],
)
def test_hypotheses_diameter_refuses_bad_input(
    hypotheses: object, error: type[Exception], pattern: str
) -> None:
    with pytest.raises(error, match=pattern):
        hypotheses_diameter(hypotheses)  # type: ignore[arg-type]


# -- Gaussian --------------------------------------------------------------------------------


def test_gaussian_event_and_sigma_follow_the_calibration() -> None:
    # Prepare
    z = calibrate_gaussian_noise_multiplier(2.0, 1e-5, 10)
    model = [np.zeros((2, 3), np.float32), np.zeros(4, np.float32)]

    # Execute
    l2 = GaussianMechanism(**SETTINGS)  # type: ignore[arg-type]
    elementwise = GaussianMechanism(**{**SETTINGS, "clip_mode": "elementwise"})  # type: ignore[arg-type]

    # Assert
    assert l2.event(model, model) == GaussianReleaseEvent(z)
    assert l2.public_metrics(model, model) == {
        "sigma": pytest.approx(z * 2.0),
        "budget-epsilon": 2.0,
        "budget-delta": 1e-5,
    }
    sigma = elementwise.public_metrics(model, model)["sigma"]
    assert sigma == pytest.approx(z * 2.0 * math.sqrt(10))


def test_gaussian_release_is_reference_plus_clipped_update_plus_noise() -> None:
    # Prepare: the update (3, 4) has norm 5 and is clipped to (0.6, 0.8); the noise is
    # the same seed's standard normals times sigma, in float64; the sum is rounded onto the
    # grid of sigma and cast to float32 at the end.
    mechanism = GaussianMechanism(**SETTINGS)  # type: ignore[arg-type]
    reference = [np.array([1.0, -1.0], np.float32)]
    updated = [np.array([4.0, 3.0], np.float32)]
    sigma = mechanism.sigma(2)
    noise = np.random.default_rng(7).standard_normal(2) * sigma
    spacing = grid_spacing(sigma, 2)

    # Execute
    released = mechanism.sanitize(reference, updated, rng=np.random.default_rng(7))

    # Assert: within half a grid step of the real sum, on the grid, float32.
    real = np.array([1.0, -1.0]) + np.array([0.6, 0.8]) + noise
    expected = (np.rint(real / spacing) * spacing).astype(np.float32)
    np.testing.assert_array_equal(released[0], expected)
    assert spacing <= sigma / 16
    assert released[0].dtype == np.float32


def test_gaussian_noise_is_normal_with_std_sigma() -> None:
    # Prepare: a zero update, so the release is pure noise; 20000 coordinates,
    # KS against N(0, sigma^2) at alpha = 0.001 (false-positive rate 0.1%).
    mechanism = GaussianMechanism(**SETTINGS)  # type: ignore[arg-type]
    model = [np.zeros((100, 100)), np.zeros(10000)]
    sigma = mechanism.public_metrics(model, model)["sigma"]

    # Execute
    released = mechanism.sanitize(model, model, rng=np.random.default_rng(8))
    values = np.concatenate([a.ravel() for a in released])

    # Assert
    assert stats.kstest(values, stats.norm(scale=sigma).cdf).pvalue > 1e-3
    assert stats.kstest(values, stats.norm(scale=1.05 * sigma).cdf).pvalue < 1e-3


def test_gaussian_noise_covers_the_hypotheses_spread() -> None:
    # Prepare: k = 2 hypotheses at distance D = 0.5, C = 1 (L2), so the release around the
    # chosen one must have sigma = z (2C + D). A zero update makes the release pure noise
    # around the reference. n = 10^5 coordinates: sum(x^2)/sigma^2 ~ chi-square(n);
    # two-sided acceptance at alpha = 1e-6 (false-positive rate 1e-6).
    mechanism = GaussianMechanism(**SETTINGS)  # type: ignore[arg-type]
    reference = [np.full(60_000, 0.3), np.full((200, 200), -0.1)]
    shift = np.zeros(60_000)
    shift[:2] = [0.3, 0.4]
    other = [reference[0] + shift, reference[1].copy()]
    spread = hypotheses_diameter([reference, other])
    updated = [a.copy() for a in reference]
    n, alpha = 100_000, 1e-6
    low, high = stats.chi2.ppf(alpha / 2, n), stats.chi2.ppf(1 - alpha / 2, n)

    # Execute
    released = mechanism.sanitize(
        reference, updated, rng=np.random.default_rng(31), spread=spread
    )
    noise = np.concatenate([(x - r).ravel() for x, r in zip(released, reference, strict=True)])
    energy = float(noise @ noise)

    # Assert: z (2C + D) fits; z 2C (the spread ignored) is rejected: the test has power.
    assert spread == pytest.approx(0.5, rel=1e-12)
    sigma = mechanism.noise_multiplier * (2.0 * SETTINGS["clip"] + spread)
    assert low < energy / sigma**2 < high
    assert not low < energy / (mechanism.noise_multiplier * 2.0) ** 2 < high
    assert mechanism.public_metrics(reference, updated, spread=spread)["sigma"] == (
        pytest.approx(sigma, rel=1e-12)
    )
    assert mechanism.sigma(n, spread) == pytest.approx(sigma, rel=1e-12)


def test_gaussian_event_does_not_depend_on_the_spread() -> None:
    # The RDP cost of noise multiplier z relative to the true sensitivity 2C + D is that
    # of GaussianDpEvent(z): the spread widens the noise, not the charge.
    mechanism = GaussianMechanism(**SETTINGS)  # type: ignore[arg-type]
    model = [np.zeros(3)]
    assert mechanism.event(model, model) == GaussianReleaseEvent(mechanism.noise_multiplier)


@pytest.mark.parametrize(
    ("kwargs", "error", "pattern"),
    [
        ({"clip": 0.0}, ValueError, "clip must be positive and finite, got clip=0.0"),
        ({"clip_mode": "l1"}, ValueError, "clip_mode must be one of 'l2' | 'elementwise'"),
        ({"epsilon": -2.0}, ValueError, "epsilon must be positive and finite, got epsilon=-2.0"),
        ({"delta": 1.0}, ValueError, "delta must be in the open interval (0, 1), got delta=1.0"),
        ({"planned_releases": 0}, ValueError, "planned_releases must be a positive integer"),
        ({"planned_releases": 2.0}, TypeError, "planned_releases must be an integer"),
    ],
)
@pytest.mark.parametrize("cls", [GaussianMechanism, StochasticSign])
def test_constructor_errors_name_the_setting(
    cls: type, kwargs: dict[str, object], error: type[Exception], pattern: str
) -> None:
    with pytest.raises(error, match=re.escape(pattern)):
        cls(**{**SETTINGS, **kwargs})


@settings(max_examples=25, deadline=None)
@given(
    name=st.sampled_from(["clip", "epsilon"]),
    value=st.one_of(st.floats(max_value=0.0), st.sampled_from([math.inf, math.nan])),
)
def test_constructor_rejects_bad_values_naming_them(name: str, value: float) -> None:
    with pytest.raises(ValueError, match=rf"^{name} must be positive and finite, got {name}="):
        GaussianMechanism(**{**SETTINGS, name: value})  # type: ignore[arg-type]


# -- stochastic sign ---------------------------------------------------------------------------


def test_sign_release_is_plus_or_minus_one_in_float32_whatever_the_dtype() -> None:
    # Prepare
    mechanism = StochasticSign(**SETTINGS)  # type: ignore[arg-type]
    reference: list[np.ndarray] = [np.zeros((3, 3), np.float32), np.zeros(5, np.float64)]
    updated: list[np.ndarray] = [np.full((3, 3), 0.1, np.float32), np.full(5, -0.1)]

    # Execute
    released = mechanism.sanitize(reference, updated, rng=np.random.default_rng(0))

    # Assert
    assert [a.dtype for a in released] == [np.float32, np.float32]
    assert [a.shape for a in released] == [(3, 3), (5,)]
    for a in released:
        assert set(np.unique(a)) <= {-1.0, 1.0}
    assert mechanism.event(reference, updated) == SignReleaseEvent(mechanism.noise_multiplier)


def test_sign_is_plus_one_with_probability_phi_p_over_sigma() -> None:
    # Prepare: generous budget (eps = 20, one release) so that sigma is small enough
    # for an unclipped update with p/sigma = (1, -1, 0, 0.5). 10000 releases; each
    # frequency within 4.5 standard errors of Phi(p/sigma) (FPR ~7e-6 per coordinate).
    mechanism = StochasticSign(clip=1.0, epsilon=20.0, delta=1e-3, planned_releases=1)
    sigma = mechanism.sigma(4)
    ratios = np.array([1.0, -1.0, 0.0, 0.5])
    assert np.linalg.norm(ratios * sigma) <= 1.0  # the update is not clipped
    reference = [np.zeros(4)]
    updated = [ratios * sigma]
    rng = np.random.default_rng(9)
    count = 10000

    # Execute
    plus = sum((mechanism.sanitize(reference, updated, rng=rng)[0] > 0).astype(int)
               for _ in range(count))

    # Assert
    expected = stats.norm.cdf(ratios)
    stderr = np.sqrt(expected * (1 - expected) / count)
    assert np.all(np.abs(plus / count - expected) < 4.5 * stderr)


def test_sign_uses_the_clipped_update() -> None:
    # Prepare: a huge update is clipped to norm C = 1 first, so its coordinates
    # (0.6, 0.8) / sigma give probabilities well inside (0, 1), not 1.
    mechanism = StochasticSign(clip=1.0, epsilon=20.0, delta=1e-3, planned_releases=1)
    sigma = mechanism.sigma(2)
    reference = [np.zeros(2)]
    updated = [np.array([600.0, 800.0])]
    rng = np.random.default_rng(10)
    count = 4000  # 4.5 standard errors, as above

    # Execute
    plus = sum((mechanism.sanitize(reference, updated, rng=rng)[0] > 0).astype(int)
               for _ in range(count))

    # Assert
    expected = stats.norm.cdf(np.array([0.6, 0.8]) / sigma)
    assert np.all(expected < 0.999)
    stderr = np.sqrt(expected * (1 - expected) / count)
    assert np.all(np.abs(plus / count - expected) < 4.5 * stderr)


def test_sign_ignores_the_spread() -> None:
    # Prepare: the sign release depends on the data only through clip(delta), within 2C
    # whatever hypothesis was chosen: the same seed gives the same release, and sigma is
    # z * 2C, with or without a spread. (Had sigma grown to z (2C + 3), 3 of these 50
    # signs would differ for this seed.)
    mechanism = StochasticSign(clip=1.0, epsilon=20.0, delta=1e-3, planned_releases=1)
    reference = [np.zeros(50)]
    updated = [np.linspace(-0.2, 0.2, 50)]  # norm 0.83: not clipped

    # Execute
    plain = mechanism.sanitize(reference, updated, rng=np.random.default_rng(12))
    spread = mechanism.sanitize(reference, updated, rng=np.random.default_rng(12), spread=3.0)

    # Assert
    np.testing.assert_array_equal(plain[0], spread[0])
    metrics = mechanism.public_metrics(reference, updated, spread=3.0)
    assert metrics["sigma"] == mechanism.noise_multiplier * 2.0


# -- the noise scale, written once ------------------------------------------------------------


@pytest.mark.parametrize("mode", ["l2", "elementwise"])
def test_the_noise_scale_covers_the_spread_only_for_a_release_centred_on_the_hypothesis(
    mode: str,
) -> None:
    # The formula each class owns, at any z (the release invariant passes the charged one).
    z, clip, n, spread = 1.7, 0.3, 1000, 0.25
    sensitivity = l2_sensitivity(mode, clip, n)

    assert GaussianMechanism.noise_scale(z, mode, clip, n, spread) == z * (sensitivity + spread)
    assert StochasticSign.noise_scale(z, mode, clip, n, spread) == z * sensitivity


@pytest.mark.parametrize("cls", [GaussianMechanism, StochasticSign])
@pytest.mark.parametrize("mode", ["l2", "elementwise"])
def test_sigma_and_the_metrics_are_the_noise_scale_at_the_calibrated_multiplier(
    cls: type[GaussianMechanism] | type[StochasticSign], mode: str,
) -> None:
    # Prepare: 13 coordinates over two layers, hypotheses 0.5 apart.
    mechanism = cls(clip_mode=mode, **SETTINGS)  # type: ignore[arg-type]
    model = [np.zeros(7), np.zeros((3, 2))]

    # Execute
    expected = cls.noise_scale(mechanism.noise_multiplier, mode, SETTINGS["clip"], 13, 0.5)

    # Assert: bit for bit, the same number everywhere the mechanism states its sigma.
    assert mechanism.sigma(13, 0.5) == expected
    assert mechanism.public_metrics(model, model, spread=0.5)["sigma"] == expected
