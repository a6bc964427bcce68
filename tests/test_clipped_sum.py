"""Per-record clipping on tensors: the bound holds for the bits, the sum matches the old path.

The bound is checked in exact rational arithmetic (fractions.Fraction of every coordinate):
each record's contribution to the batch sum as the code forms it (f·g, in float64), the real
product f·g and the float32 product fl32(f·g) have ‖·‖² ≤ C² exactly, on adversarial
gradients (huge: float32 squares overflow; tiny and subnormal: they underflow; exactly at C;
one ulp around C; mixed magnitudes) and on
hypothesis-drawn float32 vectors over the whole exponent range. The same check fails for the
naive float32 clipping (``test_the_naive_float32_clipping_fails_the_same_check``), so it can
fail.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tasks import clipped_sum
from tasks.clipped_sum import CLIP_SLACK, BatchClipping, scale_factors

#: Parameter sizes: blocks of 64 with tails, a tail alone, a parameter of one coordinate.
SIZES = [70, 3, 128, 1]
DIMS = sum(SIZES)
F32_MAX = float(np.finfo(np.float32).max)


def split(records: np.ndarray) -> list[torch.Tensor]:
    """Rows (B, n_p) of each parameter from a (B, d) float32 matrix, as Opacus hands them."""
    out, offset = [], 0
    for n in SIZES:
        out.append(torch.from_numpy(np.ascontiguousarray(records[:, offset:offset + n])))
        offset += n
    return out


def exact_squared_norm(values: np.ndarray) -> Fraction:
    return sum((Fraction(float(x)) ** 2 for x in values.ravel()), Fraction(0))


def contributions(records: np.ndarray, bound: float, *, cap: bool = True
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Each record's contribution to the batch sum as the code forms it, and the factors.

    The contribution of record i is the clipped sum with every other factor set to zero:
    adding zeros in float64 is exact, so that is the float64 product f_i·g_i itself.
    """
    clipping = BatchClipping(SIZES)
    rows = split(records)
    factors = scale_factors(clipping.squared_norms(rows), bound, cap=cap)
    assert factors.dtype == np.float32
    out = np.empty((len(records), DIMS))
    for i in range(len(records)):
        alone = np.zeros_like(factors)
        alone[i] = factors[i]
        out[i] = clipping.clipped_sum(rows, alone)
    return out, factors


def adversarial(bound: float) -> np.ndarray:
    """float32 gradients around and far from ``bound``, one per row."""
    rng = np.random.default_rng(7)
    rows = []
    gauss = rng.standard_normal((43, DIMS))
    for i, scale in enumerate([1e-30, 1e-20, 1e-3, 1.0, 1e3, 1e18, 1e30, 1e37]):
        rows.append(gauss[i] * scale)
    rows.append(np.full(DIMS, F32_MAX))  # every float32 square overflows
    rows.append(np.full(DIMS, -F32_MAX / 3))
    rows.append(np.full(DIMS, 1e-44))  # subnormal: every float32 square underflows to 0
    rows.append(np.where(rng.random(DIMS) < 0.5, 1.4e-45, -3e-42))
    mixed = gauss[10] * 1e-30
    mixed[5] = 1e30
    rows.append(mixed)
    mixed = gauss[11] * 1e-23
    mixed[100] = 3e-14  # just above the fast path's floor, the rest underflowing in float32
    rows.append(mixed)
    rows.append(gauss[41] * 2e-15)  # the fast path's floor: either side of it
    rows.append(gauss[42] * 1e-13)
    rows.append(np.zeros(DIMS))
    at_c = np.zeros(DIMS)
    at_c[3] = bound  # exactly C in float32 where C is a float32 value
    rows.append(at_c)
    # Vectors scaled to C in float32: their exact norms fall an ulp or two either side of C.
    for i in range(12, 40):
        g = gauss[i].astype(np.float32)
        norm = np.linalg.norm(g.astype(np.float64))
        rows.append((g * np.float32(bound / norm)) * np.float32(1.0 + (i - 26) * 2.0**-23))
    return np.asarray(rows, dtype=np.float32)


@pytest.mark.parametrize("bound", [1.0, 0.1, 3.0, 0.75, 1e-20, 1e20])
def test_every_clipped_record_is_within_the_bound_exactly(bound: float) -> None:
    records = adversarial(bound)
    with np.errstate(over="ignore", under="ignore"):
        out, factors = contributions(records, bound)
    limit = Fraction(bound) ** 2
    for i, g in enumerate(records):
        assert exact_squared_norm(out[i]) <= limit, i
        # The real product f·g, and the float32 product (the proof covers both).
        assert Fraction(float(factors[i])) ** 2 * exact_squared_norm(g) <= limit, i
        assert exact_squared_norm(g * factors[i]) <= limit, i


@pytest.mark.parametrize("bound", [1.0, 0.1, 1e-20])
def test_clipping_is_tight_and_leaves_short_gradients_alone(bound: float) -> None:
    records = adversarial(bound)
    with np.errstate(over="ignore", under="ignore"):
        out, factors = contributions(records, bound)
    for i, g in enumerate(records):
        norm = float(np.sqrt(float(exact_squared_norm(g))))
        clipped = float(np.sqrt(float(exact_squared_norm(out[i]))))
        if norm <= bound * (1 - 2 * CLIP_SLACK):
            assert factors[i] == 1.0 and np.array_equal(out[i], g.astype(np.float64)), i
        elif bound <= norm <= bound * 2.0**100:
            # Conservative by the slack, not more (C·(1 − 2⁻¹⁶) up to float32 rounding). Beyond
            # 2¹²⁶·C the float32 factor is subnormal, and coarser: still within the bound.
            assert clipped >= bound * (1 - 2 * CLIP_SLACK), (i, clipped / bound)


def test_unit_vectors_for_oso_are_within_one_exactly() -> None:
    records = adversarial(1.0)
    with np.errstate(over="ignore", under="ignore"):
        out, factors = contributions(records, 1.0, cap=False)
    for i, g in enumerate(records):
        assert exact_squared_norm(out[i]) <= 1, i
        norm = float(np.sqrt(float(exact_squared_norm(g))))
        if norm >= 2.0**-100:
            assert float(exact_squared_norm(out[i])) >= (1 - 4 * CLIP_SLACK), i
        elif norm == 0.0:
            assert factors[i] == 0.0
        # Shorter than 2⁻¹²⁸, 1/‖g‖ is beyond float32: the factor stops at float32's largest
        # value and the "unit" vector comes out shorter (within the bound all the same).


def test_the_naive_float32_clipping_fails_the_same_check() -> None:
    # What a float32 path without the slack does (Opacus's arithmetic): the same exact check
    # finds records above C, so the check above is not vacuous.
    records = adversarial(1.0)[18:]  # the vectors scaled to C in float32
    over = 0
    for g in records:
        norm = np.sqrt(np.sum(g * g, dtype=np.float32), dtype=np.float32)
        clipped = g * np.minimum(np.float32(1.0), np.float32(1.0) / norm)
        over += exact_squared_norm(clipped) > 1
    assert over > 0


@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(values=hnp.arrays(np.float32, DIMS, elements=st.floats(
           width=32, allow_nan=False, allow_infinity=False, allow_subnormal=True)),
       exponent=st.integers(-150, 127),
       bound=st.sampled_from([1.0, 0.3, 1e-10, 7e12]))
def test_any_finite_float32_gradient_is_clipped_within_the_bound(
    values: np.ndarray, exponent: int, bound: float,
) -> None:
    with np.errstate(over="ignore", under="ignore"):
        scaled = np.ldexp(values.astype(np.float64), exponent)
        g = np.clip(scaled, -F32_MAX, F32_MAX).astype(np.float32)
        out, _ = contributions(g[None, :], bound)
    assert exact_squared_norm(out[0]) <= Fraction(bound) ** 2


def test_the_norm_estimate_bounds_the_exact_norm() -> None:
    records = adversarial(1.0)
    with np.errstate(over="ignore", under="ignore"):
        estimate = BatchClipping(SIZES).squared_norms(split(records))
    for g, n in zip(records, estimate, strict=True):
        exact = exact_squared_norm(g)
        assert exact <= Fraction(float(n)) * (1 + Fraction(1, 2**17))
        assert float(n) <= float(exact) * (1 + 2.0**-17) + 1e-300


def test_the_sum_is_the_old_float64_path_up_to_the_slack() -> None:
    # The old path: the float64 copy of the gradients, their float64 norms, min(1, C/‖g‖),
    # the float64 sum. The new one clips at C·(1 − 2⁻¹⁶) in float32: within 2⁻¹⁶ of the old
    # per clipped record, and within float32 rounding (2⁻²³ relative) of the old path run at
    # C·(1 − 2⁻¹⁶).
    rng = np.random.default_rng(3)
    records = (rng.standard_normal((37, DIMS)) * rng.uniform(0.001, 0.2, (37, 1))
               ).astype(np.float32)
    bound = 1.0
    clipping = BatchClipping(SIZES)
    rows = split(records)
    new = clipping.clipped_sum(rows, scale_factors(clipping.squared_norms(rows), bound))
    wide = records.astype(np.float64)
    norms = np.linalg.norm(wide, axis=1)
    old = (wide * np.minimum(1.0, bound / norms)[:, None]).sum(axis=0)
    clipped = int((norms > bound).sum())
    assert 5 < clipped < 37
    assert np.linalg.norm(new - old) <= 2.0**-16 * bound * clipped * (1 + 1e-6)
    slack = bound * (1 - CLIP_SLACK)
    old_at_slack = (wide * np.minimum(1.0, slack / norms)[:, None]).sum(axis=0)
    assert np.abs(new - old_at_slack).max() <= 2.0**-22 * np.abs(wide).sum(axis=0).max()


def test_an_empty_batch_sums_to_zero() -> None:
    clipping = BatchClipping(SIZES)
    rows = [torch.zeros(0, n) for n in SIZES]
    squared = clipping.squared_norms(rows)
    assert squared.shape == (0,)
    assert np.array_equal(clipping.clipped_sum(rows, scale_factors(squared, 1.0)),
                          np.zeros(DIMS))


def test_a_non_finite_gradient_is_refused() -> None:
    records = np.ones((3, DIMS), dtype=np.float32)
    records[1, 5] = np.inf
    with pytest.raises(FloatingPointError, match="not finite"):
        BatchClipping(SIZES).squared_norms(split(records))
    records[1, 5] = np.nan
    with pytest.raises(FloatingPointError, match="not finite"):
        BatchClipping(SIZES).squared_norms(split(records))


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(TypeError, match="float32"):
        BatchClipping(SIZES).squared_norms([torch.zeros(2, n, dtype=torch.float64)
                                            for n in SIZES])
    with pytest.raises(ValueError, match="sizes"):
        BatchClipping(SIZES).squared_norms([torch.zeros(2, 5)])
    with pytest.raises(ValueError, match="clip bound"):
        scale_factors(np.ones(2), 0.0)
    with pytest.raises(ValueError, match="clip bound"):
        scale_factors(np.ones(2), float("inf"))


def test_the_torch_kernels_match_the_numpy_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    # Off the CPU the same arithmetic runs in torch; run that branch on the CPU here.
    records = adversarial(1.0)
    with np.errstate(over="ignore", under="ignore"):
        reference, _ = contributions(records, 1.0)
        clipping = BatchClipping(SIZES)
        expected = clipping.squared_norms(split(records))
        monkeypatch.setattr(clipped_sum, "_in_numpy", lambda tensor: False)
        torch_out, _ = contributions(records, 1.0)
        squared = clipping.squared_norms(split(records))
    np.testing.assert_allclose(squared, expected, rtol=2.0**-17)
    np.testing.assert_allclose(torch_out, reference, rtol=2.0**-20, atol=0)
    for row in torch_out:
        assert exact_squared_norm(row) <= 1
