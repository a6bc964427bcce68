"""Gaussian noise calibration and (ε, δ) accounting through dp-accounting."""

from __future__ import annotations

import math
import re

import dp_accounting
import numpy as np
import pytest
from dp_accounting.pld import PLDAccountant
from hypothesis import given, settings
from hypothesis import strategies as st

from mechanisms import calibrate_gaussian_noise_multiplier, gaussian_epsilon
from mechanisms.calibration import (
    composed_gaussian_epsilon,
    composed_gaussian_epsilon_pld,
    composed_gaussian_epsilon_rdp,
)


def rdp_epsilon(z: float, releases: int, delta: float) -> float:
    """The RDP ε the calibration targets (the ledger charges the smaller PLD one if it is)."""
    return composed_gaussian_epsilon_rdp({z: releases}, delta)


@settings(max_examples=25, deadline=None)
@given(
    epsilon=st.floats(min_value=0.5, max_value=20.0),
    delta=st.floats(min_value=1e-7, max_value=1e-3),
    releases=st.integers(min_value=1, max_value=200),
)
def test_calibrated_noise_composes_to_the_target_within_one_percent(
    epsilon: float, delta: float, releases: int
) -> None:
    # Execute
    z = calibrate_gaussian_noise_multiplier(epsilon, delta, releases)
    spent = rdp_epsilon(z, releases, delta)
    charged = gaussian_epsilon(z, releases, delta)
    exact = dp_accounting.get_epsilon_gaussian(z / math.sqrt(releases), delta)

    # Assert: never above the target, and not wastefully below it; the exact epsilon of
    # the composition (one Gaussian with z / sqrt(k)) is below RDP's bound, not far below;
    # the charge (PLD's, if smaller) is between the two.
    assert 0.99 * epsilon <= spent <= epsilon
    assert 0.8 * spent <= exact <= spent
    assert exact <= charged <= spent


@pytest.mark.parametrize(
    ("epsilon", "delta", "releases"),
    [(1.0, 1e-5, 40), (0.5, 1e-7, 200), (8.0, 1e-5, 1), (3.0, 1e-3, 10)],
)
def test_rdp_is_an_upper_bound_close_to_tighter_accountants(
    epsilon: float, delta: float, releases: int
) -> None:
    # Prepare: k Gaussian releases with noise multiplier z are exactly one Gaussian
    # release with z / sqrt(k), whose exact epsilon is known analytically (Balle & Wang
    # 2018, dp_accounting.get_epsilon_gaussian); the PLD accountant is a second,
    # independent numerical accountant.
    z = calibrate_gaussian_noise_multiplier(epsilon, delta, releases)
    event = dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(z), releases)

    # Execute
    rdp = rdp_epsilon(z, releases, delta)
    exact = dp_accounting.get_epsilon_gaussian(z / math.sqrt(releases), delta)
    pld = PLDAccountant(value_discretization_interval=1e-3).compose(event).get_epsilon(delta)
    charged = gaussian_epsilon(z, releases, delta)

    # Assert: RDP is an upper bound on the truth and not far from it; the ledger's PLD
    # figure (a coarser interval for larger compositions) too, and closer.
    assert exact <= rdp <= 1.2 * exact
    assert pld == pytest.approx(exact, rel=0.02)
    assert pld <= rdp
    assert exact <= charged == composed_gaussian_epsilon_pld({z: releases}, delta)
    assert charged == pytest.approx(exact, rel=1e-4)


def test_rdp_epsilon_is_no_worse_than_the_classical_conversion() -> None:
    # Prepare: RDP of k Gaussian releases at order a is k a / (2 z^2); the classical
    # conversion gives eps <= min_a k a/(2 z^2) + log(1/delta)/(a - 1) (Mironov 2017).
    # dp-accounting's conversion is tighter, so it must not exceed this.
    z, k, delta = 4.0, 20, 1e-5
    orders = np.arange(2, 257, dtype=float)

    # Execute
    classical = float(np.min(k * orders / (2 * z**2) + np.log(1 / delta) / (orders - 1)))
    rdp = rdp_epsilon(z, k, delta)

    # Assert
    assert rdp <= classical
    assert rdp >= 0.8 * classical


def test_known_values_are_pinned() -> None:
    # dp-accounting 0.6 (RdpAccountant, default orders). A change here means the
    # accountant changed: check it before updating the pins.
    assert calibrate_gaussian_noise_multiplier(1.0, 1e-5, 40) == pytest.approx(25.5853, rel=1e-4)
    assert calibrate_gaussian_noise_multiplier(8.0, 1e-5, 1) == pytest.approx(0.637670, rel=1e-4)
    assert rdp_epsilon(1.0, 1, 1e-5) == pytest.approx(4.72851, rel=1e-4)
    # dp-accounting 0.6 (PLDAccountant, pessimistic): the charge, against the exact 4.3771.
    assert gaussian_epsilon(1.0, 1, 1e-5) == pytest.approx(4.37718, rel=1e-5)
    assert gaussian_epsilon(1.0, 100, 1e-5) == pytest.approx(91.8173, rel=1e-5)
    assert rdp_epsilon(1.0, 100, 1e-5) == pytest.approx(96.1163, rel=1e-5)


def test_epsilon_grows_with_releases_and_shrinks_with_noise() -> None:
    # Execute
    by_releases = [gaussian_epsilon(5.0, k, 1e-5) for k in (1, 2, 10, 100)]
    by_noise = [gaussian_epsilon(z, 10, 1e-5) for z in (1.0, 2.0, 10.0)]

    # Assert
    assert by_releases == sorted(by_releases) and len(set(by_releases)) == 4
    assert by_noise == sorted(by_noise, reverse=True) and len(set(by_noise)) == 3


def test_grouped_composition_equals_the_accountant_over_all_events() -> None:
    # Prepare: 30 releases at z=3 and 5 at z=7, composed one by one.
    accountant = dp_accounting.rdp.RdpAccountant()
    for z in [3.0] * 30 + [7.0] * 5:
        accountant.compose(dp_accounting.GaussianDpEvent(z))
    # Composed exactly, they are one Gaussian of noise multiplier 1/√(30/9 + 5/49).
    exact = dp_accounting.get_epsilon_gaussian((30 / 9 + 5 / 49) ** -0.5, 1e-6)

    # Execute
    grouped = composed_gaussian_epsilon_rdp({3.0: 30, 7.0: 5}, 1e-6)
    pld = composed_gaussian_epsilon_pld({3.0: 30, 7.0: 5}, 1e-6)

    # Assert
    assert grouped == pytest.approx(accountant.get_epsilon(1e-6), rel=1e-9)
    assert exact <= pld <= exact * (1 + 1e-4) and pld < grouped
    assert composed_gaussian_epsilon({3.0: 30, 7.0: 5}, 1e-6) == pld
    assert composed_gaussian_epsilon({}, 1e-6) == 0.0


def test_a_repeated_calibration_does_not_search_again(monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare: count dp-accounting's searches (arguments no other test uses, so not yet seen).
    searches: list[float] = []
    search = dp_accounting.calibrate_dp_mechanism

    def counted(*args: object, **kwargs: object) -> float:
        searches.append(1.0)
        return search(*args, **kwargs)

    monkeypatch.setattr(dp_accounting, "calibrate_dp_mechanism", counted)

    # Execute
    first = calibrate_gaussian_noise_multiplier(2.4375, 1e-6, 19)
    again = calibrate_gaussian_noise_multiplier(2.4375, 1e-6, 19)

    # Assert: one search, the same answer.
    assert len(searches) == 1 and again == first


BAD_POSITIVE = st.one_of(st.floats(max_value=0.0), st.sampled_from([math.inf, math.nan]))
BAD_DELTA = st.one_of(
    st.floats(max_value=0.0), st.floats(min_value=1.0), st.sampled_from([math.nan])
)


@settings(max_examples=30, deadline=None)
@given(value=BAD_POSITIVE)
def test_calibration_rejects_bad_epsilon(value: float) -> None:
    with pytest.raises(ValueError, match=r"^epsilon must be positive and finite, got epsilon="):
        calibrate_gaussian_noise_multiplier(value, 1e-5, 10)


@settings(max_examples=30, deadline=None)
@given(value=BAD_DELTA)
def test_calibration_and_accounting_reject_bad_delta(value: float) -> None:
    message = r"^delta must be in the open interval \(0, 1\), got delta="
    with pytest.raises(ValueError, match=message):
        calibrate_gaussian_noise_multiplier(1.0, value, 10)
    with pytest.raises(ValueError, match=message):
        gaussian_epsilon(1.0, 10, value)


@settings(max_examples=20, deadline=None)
@given(value=st.integers(max_value=0))
def test_calibration_and_accounting_reject_bad_releases(value: int) -> None:
    message = re.escape(f"releases must be a positive integer, got releases={value}")
    with pytest.raises(ValueError, match=message):
        calibrate_gaussian_noise_multiplier(1.0, 1e-5, value)
    with pytest.raises(ValueError, match=message):
        gaussian_epsilon(1.0, value, 1e-5)


@pytest.mark.parametrize("value", [2.5, "3", True])
def test_releases_must_be_an_integer(value: object) -> None:
    with pytest.raises(TypeError, match=r"^releases must be an integer"):
        calibrate_gaussian_noise_multiplier(1.0, 1e-5, value)  # type: ignore[arg-type]


@settings(max_examples=30, deadline=None)
@given(value=BAD_POSITIVE)
def test_accounting_rejects_bad_noise_multiplier(value: float) -> None:
    with pytest.raises(
        ValueError, match=r"^noise_multiplier must be positive and finite, got noise_multiplier="
    ):
        gaussian_epsilon(value, 1, 1e-5)
