"""The magnitude rules (strategies.norms): absurd releases refused, honest noisy ones never.

Honest releases come from the real mechanisms (mechanisms.EuclideanLaplace, GaussianMechanism),
seeded; each statistical test states its size.
"""

from __future__ import annotations

import numpy as np
import pytest

from mechanisms import EuclideanLaplace, GaussianMechanism, StochasticSign
from strategies.norms import (
    ABSOLUTE_NORM_CAP,
    NormLimits,
    hypotheses_diameter,
    nearest_distances,
    screen_norms,
)

F32 = np.float32
HYPOTHESES = np.array([[5.0, 6.0], [4.0, -4.5]], F32)
LAPLACE = NormLimits(mechanism="laplace")
NO_SIGMA = np.full(8, np.nan)


def laplace_releases(rng: np.random.Generator, hypotheses: np.ndarray, m: int,
                     nu: float = 5.0, scale: tuple[float, float] = (0.01, 1.0)) -> np.ndarray:
    """m honest neighbourhood-Laplace releases: a random hypothesis plus an update δ whose norm
    is log-uniform over ``scale`` (clients far from and near their optimum), sanitized at ν."""
    mechanism = EuclideanLaplace(calibration="neighbourhood", noise_multiplier=nu)
    rows = []
    for _ in range(m):
        reference = hypotheses[rng.integers(len(hypotheses))]
        direction = rng.standard_normal(reference.size)
        norm = np.exp(rng.uniform(np.log(scale[0]), np.log(scale[1])))
        updated = (reference + norm * direction / np.linalg.norm(direction)).astype(F32)
        rows.append(mechanism.sanitize([reference], [updated], rng=rng)[0])
    return np.stack(rows)


def test_distances_are_to_the_nearest_hypothesis() -> None:
    released = np.array([[5.0, 7.0], [4.0, -1.5], [0.0, 0.0]], F32)

    d = nearest_distances(released, HYPOTHESES)

    np.testing.assert_allclose(d, [1.0, 3.0, np.hypot(4.0, 4.5)])
    assert hypotheses_diameter(HYPOTHESES) == pytest.approx(np.hypot(1.0, 10.5))
    assert hypotheses_diameter(HYPOTHESES[:1]) == 0.0


def test_a_1e12_release_among_honest_ones_is_refused() -> None:
    # Prepare: 6 honest releases at ν = 5 and one of norm 1e12 (the measured attack: the
    # mean of 4-5 replies moved a hypothesis to 2.4e11).
    rng = np.random.default_rng(1)
    released = np.vstack([laplace_releases(rng, HYPOTHESES, 6), [[1e12, 0.0]]]).astype(F32)

    # Execute
    reasons, _ = screen_norms(released, HYPOTHESES, NO_SIGMA[:7], np.zeros(0), LAPLACE)

    # Assert
    assert reasons[:6] == [None] * 6
    assert reasons[6] is not None and reasons[6].startswith("distance 1e+12 to the nearest")
    assert "1000 x the round's median" in reasons[6]


@pytest.mark.parametrize("value", [3.0e38, -3.4e38, 1e16])
def test_values_near_the_float32_maximum_are_refused_by_the_cap(value: float) -> None:
    released = np.array([[value, value], [5.0, 6.0]], F32)

    reasons, _ = screen_norms(released, HYPOTHESES, NO_SIGMA[:2], np.zeros(0), LAPLACE)

    assert reasons[0] is not None and "beyond the absolute cap 1e+15" in reasons[0]
    assert reasons[1] is None


def test_a_lone_absurd_release_is_judged_against_the_last_round() -> None:
    # Prepare: last round accepted honest releases; this round brings one reply only.
    rng = np.random.default_rng(2)
    _, honest = screen_norms(laplace_releases(rng, HYPOTHESES, 7), HYPOTHESES, NO_SIGMA[:7],
                             np.zeros(0), LAPLACE)
    lone = np.array([[1e9, -1e9]], F32)

    reasons, _ = screen_norms(lone, HYPOTHESES, NO_SIGMA[:1], honest, LAPLACE)

    assert reasons[0] is not None and "median" in reasons[0]


def test_a_lone_release_of_the_first_round_meets_the_cap_only() -> None:
    # No reference yet (documented): 1e12 passes, 1e16 does not.
    ok, _ = screen_norms(np.array([[1e12, 0.0]], F32), HYPOTHESES, NO_SIGMA[:1], np.zeros(0),
                         LAPLACE)
    capped, _ = screen_norms(np.array([[1e16, 0.0]], F32), HYPOTHESES, NO_SIGMA[:1],
                             np.zeros(0), LAPLACE)

    assert ok == [None] and capped[0] is not None


@pytest.mark.parametrize("n", [2, 83])
def test_honest_laplace_releases_at_nu_5_always_pass(n: int) -> None:
    # 400 rounds of 7 honest releases each (2,800 releases; seeded), updates spread over a
    # 100x range of norms, with the last round's distances as reference: none is refused. At
    # ν = 5 the distances vary ~10-50x within a round, far from the 1000x of the rule.
    rng = np.random.default_rng(3)
    hypotheses = rng.standard_normal((2, n)).astype(F32)
    previous = np.zeros(0)
    refused = 0
    for _ in range(400):
        released = laplace_releases(rng, hypotheses, 7)
        reasons, distances = screen_norms(released, hypotheses, NO_SIGMA[:7], previous, LAPLACE)
        refused += sum(r is not None for r in reasons)
        previous = distances

    assert refused == 0


@pytest.mark.parametrize("clip_mode", ["l2", "elementwise"])
def test_honest_gaussian_releases_pass_their_bound(clip_mode: str) -> None:
    # Prepare: devices with ε = 1, 5, 10 (personalized budgets), updates beyond the clip,
    # k = 2 hypotheses (σ covers their spread). 300 rounds × 6 releases, seeded.
    rng = np.random.default_rng(4)
    n = 50
    hypotheses = rng.standard_normal((2, n)).astype(F32)
    spread = hypotheses_diameter(hypotheses)
    devices = [GaussianMechanism(clip=1.0, clip_mode=clip_mode, epsilon=e, delta=1e-5,
                                 planned_releases=20) for e in (1.0, 5.0, 10.0)]
    limits = NormLimits(mechanism="gaussian", clip=1.0, clip_mode=clip_mode,
                        noise_multiplier=devices[0].noise_multiplier)
    refused = 0
    previous = np.zeros(0)
    for _ in range(300):
        rows, sigmas = [], []
        for mechanism in devices * 2:
            reference = [hypotheses[rng.integers(2)]]
            updated = [(reference[0] + 3.0 * rng.standard_normal(n)).astype(F32)]
            rows.append(mechanism.sanitize(reference, updated, rng=rng, spread=spread)[0])
            sigmas.append(mechanism.public_metrics(reference, updated, spread=spread)["sigma"])
        reasons, previous = screen_norms(np.stack(rows), hypotheses, np.array(sigmas),
                                         previous, limits)
        refused += sum(r is not None for r in reasons)

    assert refused == 0


def test_a_gaussian_release_beyond_what_its_sigma_allows_is_refused() -> None:
    # Prepare: n = 100, C = 1, σ = 0.5: the bound is 1 + 0.5·(10 + 10) = 11 (+ rounding).
    n = 100
    hypotheses = np.zeros((1, n), F32)
    limits = NormLimits(mechanism="gaussian", clip=1.0, noise_multiplier=0.1)
    inside = np.full((1, n), 10.9 / 10, F32)   # norm 10.9
    outside = np.full((1, n), 11.5 / 10, F32)  # norm 11.5

    ok, _ = screen_norms(inside, hypotheses, np.array([0.5]), np.zeros(0), limits)
    bad, _ = screen_norms(outside, hypotheses, np.array([0.5]), np.zeros(0), limits)

    assert ok == [None]
    assert bad[0] is not None and bad[0].startswith("distance 11.5 to the nearest hypothesis is "
                                                    "beyond the gaussian bound")


def test_a_gaussian_sigma_beyond_1000_times_the_request_is_refused() -> None:
    # z = 0.1, Δ = 2, D = 0: σ may reach 1000 · 0.1 · 2 = 200.
    hypotheses = np.zeros((1, 4), F32)
    limits = NormLimits(mechanism="gaussian", clip=1.0, noise_multiplier=0.1)
    released = np.ones((3, 4), F32)

    reasons, _ = screen_norms(released, hypotheses, np.array([199.0, 201.0, np.nan]),
                              np.zeros(0), limits)

    assert reasons[0] is None
    assert reasons[1] is not None and reasons[1].startswith("declared sigma 201 is beyond 1000")
    assert reasons[2] == "a gaussian release must declare its sigma"


def test_sign_releases_are_not_measured() -> None:
    rng = np.random.default_rng(5)
    mechanism = StochasticSign(clip=1.0, epsilon=1.0, delta=1e-5, planned_releases=10)
    reference = [np.zeros(6, F32)]
    released = np.stack([mechanism.sanitize(reference, [np.ones(6, F32)], rng=rng)[0]
                         for _ in range(3)])

    reasons, _ = screen_norms(released, np.full((1, 6), 1e3, F32), NO_SIGMA[:3], np.zeros(0),
                              NormLimits(mechanism="sign"))

    assert reasons == [None] * 3


def test_the_cap_keeps_float32_averaging_finite() -> None:
    # Releases just under the cap, of opposite signs and in every coordinate: squares,
    # distances and means in float32 stay finite (this is what k-means and the means compute).
    n = 64
    x = np.full((20, n), ABSOLUTE_NORM_CAP / np.sqrt(n) * 0.999, F32)
    x[::2] *= -1
    reasons, _ = screen_norms(x, np.zeros((1, n), F32), np.full(20, np.nan), np.zeros(0),
                              NormLimits(mechanism="none"))
    assert reasons == [None] * 20
    with np.errstate(over="raise", invalid="raise"):
        squares = np.einsum("ij,ij->i", x, x)
        mean = np.full(20, 1 / 20, F32) @ x
        spread = ((x - mean) ** 2).sum()
    assert np.isfinite(squares).all() and np.isfinite(mean).all() and np.isfinite(spread)
