"""The release grid (`mechanisms.grid`): a public lattice, and the exact rounding of a real sum.

The property tests compare `on_grid` with the same rounding done in rational arithmetic on
values where float sums go wrong: half-steps, sums that cancel, subnormals, zeros, powers of
two, float32 terms beside float64 ones, magnitudes far apart. Derandomized: the same examples
on every run.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mechanisms.grid import (
    MAX_GRID_UNITS,
    STEPS_PER_SCALE,
    check_grid_fits,
    grid_spacing,
    on_grid,
    on_grid_exactly,
)


def exact(terms: list[np.ndarray], spacing: float) -> np.ndarray:
    """The nearest multiple of ``spacing`` to the real sum of the terms (ties to even)."""
    flat = [np.ravel(t) for t in terms]
    out = [float(round(sum((Fraction(float(t[i])) for t in flat), Fraction(0))
                       / Fraction(spacing))) * spacing for i in range(flat[0].size)]
    return np.asarray(out).reshape(np.shape(terms[0]))


SPACINGS = st.integers(min_value=-60, max_value=20).map(lambda e: math.ldexp(1.0, e))
FLOATS = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False,
                   allow_subnormal=True)


@st.composite
def hard_terms(draw: st.DrawFn) -> tuple[list[np.ndarray], float]:
    """Terms whose float sum lands on or near a half-step of the grid, or cancels."""
    spacing = draw(SPACINGS)
    size = draw(st.integers(min_value=1, max_value=12))
    count = draw(st.integers(min_value=1, max_value=4))
    terms = [np.asarray(draw(st.lists(FLOATS, min_size=size, max_size=size)), np.float64)
             for _ in range(count)]
    if count >= 2 and draw(st.booleans()):
        # The last term puts the float sum exactly on a half-step, plus or minus a few ulps of
        # the other terms: where rint of the float sum is wrong unless fixed.
        half = (np.floor(sum(terms[:-1]) / spacing) + 0.5) * spacing
        wiggle = draw(st.sampled_from([0.0, 1e-17, -1e-17, 2.0**-1074, 1e-300]))
        terms[-1] = half - sum(terms[:-1]) + wiggle
    if draw(st.booleans()):
        terms[0] = terms[0].astype(np.float32)  # a float32 model beside float64 noise
    return terms, spacing


@settings(max_examples=400, derandomize=True, deadline=None)
@given(hard_terms())
def test_on_grid_is_the_exact_rounding_of_the_real_sum(case: tuple[list[np.ndarray], float]
                                                       ) -> None:
    terms, spacing = case
    if not all(np.isfinite(t).all() for t in terms):
        return
    np.testing.assert_array_equal(on_grid(terms, spacing), exact(terms, spacing))


def test_a_sum_rint_of_floats_gets_wrong_is_rounded_exactly() -> None:
    # Prepare: 0.5 + 2^-60 in grid steps; the float sum rounds it to exactly 0.5 (ties: 0),
    # the real sum is above the half-step (1).
    terms = [np.array([0.5]), np.array([2.0**-60])]

    # Execute / Assert
    assert float(np.rint(terms[0] + terms[1])[0]) == 0.0
    assert on_grid(terms, 1.0)[0] == 1.0


def test_large_releases_use_the_blocked_path_and_agree_with_the_exact_rounding() -> None:
    # 3 blocks of coordinates, some put on half-steps, against the rational rounding.
    rng = np.random.default_rng(7)
    n, spacing = 200_003, 2.0**-9
    model = rng.standard_normal(n).astype(np.float32)
    noise = rng.standard_normal(n) * 0.05
    noise[::997] = (np.floor(model[::997] / spacing) + 0.5) * spacing - model[::997]
    picks = np.r_[0:n:997, 1:n:5003]
    got = on_grid([noise, model], spacing)
    np.testing.assert_array_equal(got[picks], exact([noise[picks], model[picks]], spacing))
    assert on_grid_exactly(got, spacing)


def test_inputs_are_not_modified() -> None:
    terms = [np.array([0.3, 0.7]), np.array([1e-3, 2e-3], np.float32)]
    copies = [t.copy() for t in terms]
    on_grid(terms, 2.0**-4)
    for t, c in zip(terms, copies, strict=True):
        np.testing.assert_array_equal(t, c)


@pytest.mark.parametrize("spacing", [0.3, 0.0, -1.0, 3.0])
def test_a_spacing_that_is_no_power_of_two_is_refused(spacing: float) -> None:
    with pytest.raises(ValueError, match="power of two"):
        on_grid([np.zeros(2)], spacing)


def test_a_huge_release_beyond_the_exact_range_is_refused_a_small_one_is_exact() -> None:
    spacing = 2.0**-40
    big = np.full(70_000, 1e6)
    with pytest.raises(ValueError, match="exact range"):
        on_grid([big], spacing)
    small = np.array([1e6 + 2.0**-41, -3e5])
    np.testing.assert_array_equal(on_grid([small], spacing), exact([small], spacing))


def test_non_finite_terms_are_refused() -> None:
    with pytest.raises(ValueError, match="not finite"):
        on_grid([np.array([np.inf, 0.0])], 1.0)


@given(st.floats(min_value=1e-250, max_value=1e250), st.integers(min_value=1, max_value=10**8))
@settings(max_examples=300, derandomize=True, deadline=None)
def test_the_grid_is_a_power_of_two_a_sixteenth_of_the_scale_or_finer(scale: float,
                                                                      size: int) -> None:
    spacing = grid_spacing(scale, size)
    assert math.frexp(spacing)[0] == 0.5
    assert spacing <= scale / STEPS_PER_SCALE
    # ... and, for a small model, fine enough that rounding cannot hide a missing noise from
    # the invariant: g·√n/2 below an eighth of the Chernoff bound of its 1e-9 tail.
    assert spacing * math.sqrt(size) / 2 <= (1e-9 ** (1 / size) / math.e) * scale * math.sqrt(
        size) / 8
    # the largest such power of two: twice it breaks one of the two bounds
    fraction = min(1 / STEPS_PER_SCALE, 1e-9 ** (1 / size) / (4 * math.e))
    assert 2 * spacing > scale * fraction * (1 - 1e-12)


@pytest.mark.parametrize("scale", [0.0, -1.0, math.inf, math.nan, 1e-300, 1e300, 5e-324])
def test_a_scale_without_a_grid_is_refused(scale: float) -> None:
    # 5e-324 once gave a grid of 0.5: its sixteenth underflows to 0, whose frexp exponent is 0.
    with pytest.raises(ValueError, match="noise scale"):
        grid_spacing(scale, 10)
    with pytest.raises(ValueError, match="noise scale"):
        grid_spacing(scale, 1)


def test_a_release_that_could_not_be_rounded_exactly_is_found_before_the_charge() -> None:
    # 10^6 parameters up to 1e6 with noise of scale 1e-6: 2^44+ steps, with 2^24 to spare: no.
    with pytest.raises(ValueError, match="grid steps"):
        check_grid_fits(1e-9, 1_000_000, 1e6)
    check_grid_fits(1e-3, 1_000_000, 1e6)  # 1e6 / 2^-14 = 2^34 steps: fits
    check_grid_fits(1e-9, 10, 1e6)  # small: rounded in rational arithmetic, whatever its range
    assert MAX_GRID_UNITS == 2.0**49


def test_on_grid_exactly_reads_the_last_bits() -> None:
    assert on_grid_exactly(np.array([0.0, -0.25, 1e6]), 0.25)
    assert not on_grid_exactly(np.array([0.0, 0.25 + 2.0**-40]), 0.25)
    assert not on_grid_exactly(np.array([np.nan]), 0.25)
