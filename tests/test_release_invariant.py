"""The release invariant (:func:`mechanisms.invariant.verify_release`): the last line of defence.

It must pass every honest release (at most one refusal in 10^9, by construction: checked here on
thousands of releases of every mechanism) and refuse every release that does not carry the
noise its charge paid for: none at all, half of it, a choice left unpaid, a forged event,
non-finite or mis-shaped arrays.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from mechanisms import (
    EuclideanLaplace,
    GaussianMechanism,
    GaussianReleaseEvent,
    NeighbourhoodEvent,
    NoMechanism,
    NonPrivateEvent,
    StochasticSign,
    cast_release,
)
from mechanisms.invariant import ReleaseRefused, lower_tail_factor, verify_release

RNG_SEED = 20261124


def model(*layers: list[float], dtype: type = np.float32) -> list[np.ndarray]:
    return [np.asarray(layer, dtype=dtype) for layer in layers]


REFERENCE = model([5.0, 6.0], [0.5, -0.5, 0.25])
UPDATED = model([5.5, 5.0], [0.4, -0.2, 0.0])
MECHANISMS = {
    "laplace": EuclideanLaplace(noise_multiplier=5.0, least_radius=0.01),
    "laplace-per-layer": EuclideanLaplace(noise_multiplier=5.0, least_radius=0.01,
                                          per_layer=True),
    "laplace-fixed": EuclideanLaplace(calibration="fixed", epsilon=2.0, public_radius=1.0),
    "gaussian": GaussianMechanism(clip=1.0, epsilon=1.0, delta=1e-5, planned_releases=10),
    "sign": StochasticSign(clip=1.0, epsilon=1.0, delta=1e-5, planned_releases=10),
}


@pytest.mark.parametrize("shape", [0.5, 1.0, 2.0, 10.0, 1000.0, 1e6])
def test_the_lower_tail_factor_bounds_the_gamma_tail(shape: float) -> None:
    x = lower_tail_factor(shape, 1e-9)
    assert 0.0 < x < 1.0
    assert stats.gamma(shape).cdf(x * shape) <= 1e-9
    # ... and is not needlessly loose: within a factor 1e3 of the exact tail for large shapes.
    if shape >= 10:
        assert stats.gamma(shape).cdf(x * shape) >= 1e-12


@pytest.mark.parametrize("name", sorted(MECHANISMS))
def test_honest_releases_pass(name: str) -> None:
    # 3000 honest releases per mechanism, two hypotheses 1.0 apart as spread: with a refusal
    # probability of at most 1e-9 each, a refusal here means a bug (false-positive rate 3e-6).
    mechanism = MECHANISMS[name]
    rng = np.random.default_rng(RNG_SEED)
    event = mechanism.event(REFERENCE, UPDATED)
    for _ in range(3000):
        released = mechanism.sanitize(REFERENCE, UPDATED, rng=rng, spread=1.0)
        verify_release(mechanism, event, reference=REFERENCE, updated=UPDATED,
                       released=released, spread=1.0)


def test_a_zero_update_with_a_least_radius_passes() -> None:
    mechanism = MECHANISMS["laplace"]
    rng = np.random.default_rng(RNG_SEED)
    event = mechanism.event(REFERENCE, REFERENCE)
    for _ in range(1000):
        released = mechanism.sanitize(REFERENCE, REFERENCE, rng=rng)
        verify_release(mechanism, event, reference=REFERENCE, updated=REFERENCE,
                       released=released, spread=0.0)


@pytest.mark.parametrize("name", ["laplace", "laplace-per-layer", "laplace-fixed", "gaussian"])
def test_a_release_without_noise_is_refused(name: str) -> None:
    mechanism = MECHANISMS[name]
    event = mechanism.event(REFERENCE, UPDATED)
    raw = [u.copy() for u in UPDATED]
    if name == "gaussian":  # the noiseless Gaussian output is reference + clip(delta)
        raw = [np.asarray(r, np.float64) + (u - r) / max(1.0, _norm(UPDATED, REFERENCE))
               for r, u in zip(REFERENCE, UPDATED, strict=True)]
        raw = [a.astype(np.float32) for a in raw]
    with pytest.raises(ReleaseRefused, match="below what its charge pays for"):
        verify_release(mechanism, event, reference=REFERENCE, updated=UPDATED, released=raw,
                       spread=1.0)


@pytest.mark.parametrize("name", ["laplace", "laplace-per-layer", "gaussian"])
def test_noise_the_cast_rounds_away_is_checked_on_the_float64_release(name: str) -> None:
    # Prepare: a float32 model at 1e6 (a device's max-parameter), where float32's spacing is
    # 0.0625 and the least-radius noise nu * 0.01 = 0.05: the cast to float32 often rounds the
    # noise away (post-processing of the float64 release, which keeps its guarantee).
    mechanism = MECHANISMS[name]
    if name == "gaussian":  # sigma = z * 2C of about 0.05 (C = 0.002, z = 12.8)
        mechanism = GaussianMechanism(clip=0.002, epsilon=1.0, delta=1e-5, planned_releases=10)
    reference = model([1e6, -1e6], [1e6])
    event = mechanism.event(reference, reference)
    rng = np.random.default_rng(RNG_SEED)
    rounded = 0

    # Execute: 500 honest releases, checked on the float64 release they are the cast of.
    for _ in range(500):
        exact = mechanism.sanitize_exact(reference, reference, rng=rng)
        released = cast_release(exact, reference)
        verify_release(mechanism, event, reference=reference, updated=reference,
                       released=released, exact=exact, spread=0.0)
        if all(np.array_equal(r, u) for r, u in zip(released, reference, strict=True)):
            rounded += 1
            # Measured on the float32 arrays alone, such a release looks unnoised.
            with pytest.raises(ReleaseRefused):
                verify_release(mechanism, event, reference=reference, updated=reference,
                               released=released, spread=0.0)

    # Assert: none refused, although the cast erased the noise of some (with this seed 212,
    # 97 and 59 of 500; the client refused each of them, charged, before the check looked at
    # the float64 release).
    assert rounded > 10


def test_a_release_that_is_not_the_cast_of_its_float64_release_is_refused() -> None:
    mechanism = MECHANISMS["laplace"]
    event = mechanism.event(REFERENCE, UPDATED)
    exact = mechanism.sanitize_exact(REFERENCE, UPDATED, rng=np.random.default_rng(RNG_SEED))

    # The noisy float64 release shown to the check, the raw model sent.
    with pytest.raises(ReleaseRefused, match="not the cast of its float64 release"):
        verify_release(mechanism, event, reference=REFERENCE, updated=UPDATED,
                       released=[u.copy() for u in UPDATED], exact=exact, spread=0.0)
    # A float64 release of another shape or dtype.
    with pytest.raises(ReleaseRefused, match="not a finite float64 array"):
        verify_release(mechanism, event, reference=REFERENCE, updated=UPDATED,
                       released=cast_release(exact, UPDATED),
                       exact=[a.astype(np.float32) for a in exact], spread=0.0)


def _norm(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    return math.sqrt(sum(float(((x.astype(np.float64) - y) ** 2).sum())
                         for x, y in zip(a, b, strict=True)))


def test_half_the_laplace_noise_is_refused_in_a_large_model() -> None:
    # Prepare: n = 10^4 parameters; the noise norm concentrates (Gamma(10^4)), so half of it
    # falls far below the 1e-9 tail (factor 0.936 here).
    n = 10_000
    reference = [np.zeros(n, np.float64)]
    updated = [np.full(n, 0.01)]  # ||delta|| = 1
    mechanism = EuclideanLaplace(noise_multiplier=2.0, least_radius=0.01)
    event = mechanism.event(reference, updated)
    rng = np.random.default_rng(RNG_SEED)

    # Execute / Assert: the honest release passes, the same with half its noise does not.
    released = mechanism.sanitize(reference, updated, rng=rng)
    verify_release(mechanism, event, reference=reference, updated=updated, released=released,
                   spread=0.0)
    halved = [updated[0] + 0.5 * (released[0] - updated[0])]
    with pytest.raises(ReleaseRefused):
        verify_release(mechanism, event, reference=reference, updated=updated, released=halved,
                       spread=0.0)


def test_a_gaussian_release_that_left_the_choice_unpaid_is_refused() -> None:
    # Prepare: hypotheses 50 apart (D = 50); the release drew sigma = z * 2C, leaving D out.
    n = 1000
    reference = [np.zeros(n, np.float32)]
    updated = [np.full(n, 0.001, np.float32)]
    mechanism = GaussianMechanism(clip=1.0, epsilon=1.0, delta=1e-5, planned_releases=10)
    event = mechanism.event(reference, updated)
    unpaid = mechanism.sanitize(reference, updated, rng=np.random.default_rng(RNG_SEED),
                                spread=0.0)

    # Execute / Assert
    with pytest.raises(ReleaseRefused):
        verify_release(mechanism, event, reference=reference, updated=updated, released=unpaid,
                       spread=50.0)


def test_a_sign_release_with_other_values_or_too_little_noise_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mechanism = MECHANISMS["sign"]
    event = mechanism.event(REFERENCE, UPDATED)
    not_signs = [np.array([1.0, 0.5], np.float32), np.array([1.0, -1.0, 1.0], np.float32)]
    with pytest.raises(ReleaseRefused, match="other than"):
        verify_release(mechanism, event, reference=REFERENCE, updated=UPDATED,
                       released=not_signs, spread=0.0)
    signs = [np.sign(u - r) + (u == r) for r, u in zip(REFERENCE, UPDATED, strict=True)]
    monkeypatch.setattr(mechanism, "sigma", lambda n, spread=0.0: 1e-3)
    with pytest.raises(ReleaseRefused, match="sigma"):
        verify_release(mechanism, event, reference=REFERENCE, updated=UPDATED, released=signs,
                       spread=0.0)


def test_a_forged_or_absent_charge_is_refused() -> None:
    mechanism = MECHANISMS["laplace"]
    released = mechanism.sanitize(REFERENCE, UPDATED, rng=np.random.default_rng(RNG_SEED))
    for forged in (NeighbourhoodEvent((5,), 50.0), GaussianReleaseEvent(1.0)):
        with pytest.raises(ReleaseRefused, match="is not this release's"):
            verify_release(mechanism, forged, reference=REFERENCE, updated=UPDATED,
                           released=released, spread=0.0)
    with pytest.raises(ReleaseRefused, match="without noise is not allowed"):
        verify_release(NoMechanism(), NonPrivateEvent(), reference=REFERENCE, updated=UPDATED,
                       released=UPDATED, spread=0.0)
    # A device that explicitly allows the non-private baseline may send it.
    verify_release(NoMechanism(), NonPrivateEvent(), reference=REFERENCE, updated=UPDATED,
                   released=UPDATED, spread=0.0, allow_unsanitized=True)


@pytest.mark.parametrize("bad", ["nan", "inf", "shape", "dtype", "layers"])
def test_a_malformed_release_is_refused(bad: str) -> None:
    mechanism = MECHANISMS["laplace-fixed"]
    event = mechanism.event(REFERENCE, UPDATED)
    released = mechanism.sanitize(REFERENCE, UPDATED, rng=np.random.default_rng(RNG_SEED))
    if bad == "nan":
        released[0][0] = np.nan
    elif bad == "inf":
        released[1][2] = np.inf
    elif bad == "shape":
        released[1] = released[1][:2]
    elif bad == "dtype":
        released[0] = released[0].astype(np.float64)
    else:
        released = released[:1]
    with pytest.raises(ReleaseRefused):
        verify_release(mechanism, event, reference=REFERENCE, updated=UPDATED,
                       released=released, spread=0.0)


def test_a_gaussian_release_below_its_charged_scale_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Prepare: the mechanism draws half its sigma; the charge (its event) is unchanged. The
    # check computes the scale from the charged z with the mechanism's formula, not from the
    # sigma the mechanism used.
    n = 10_000
    reference = [np.zeros(n, np.float32)]
    mechanism = GaussianMechanism(clip=1.0, epsilon=1.0, delta=1e-5, planned_releases=10)
    event = mechanism.event(reference, reference)
    drawn = mechanism._noise_sigma
    monkeypatch.setattr(mechanism, "_noise_sigma", lambda size, spread: drawn(size, spread) / 2)
    exact = mechanism.sanitize_exact(reference, reference, rng=np.random.default_rng(RNG_SEED))

    # Execute / Assert
    with pytest.raises(ReleaseRefused):
        verify_release(mechanism, event, reference=reference, updated=reference,
                       released=cast_release(exact, reference), exact=exact, spread=0.0)
