"""Per-record clipping and the batch sum of DP-SGD on torch tensors, with a bound for the bits.

DP-SGD's noise is calibrated to one record moving the sum Σ_i ḡ_i by at most C. In real
arithmetic ḡ_i = g_i·min(1, C/‖g_i‖) has norm at most C; in float32, the computed norm and the
clipped coordinates are rounded, and a clipped record can come out a little longer than C
(or, for huge or tiny gradients, the float32 norm overflows or underflows). This module clips
so that the float32 vector each record contributes has a norm at most C in *exact* arithmetic,
for every finite float32 gradient, and sums those vectors in float64 (as the NumPy path it
replaces did), without a float64 copy of the per-record gradients:

1. :meth:`BatchClipping.squared_norms` returns N̂_i with ‖g_i‖² ≤ N̂_i·(1 + η), η = 2⁻¹⁷
   (proof there);
2. :func:`scale_factors` returns float32 factors f_i, rounded down, with ‖f_i·g_i‖ ≤ C
   exactly, and ‖fl32(f_i·g_i)‖ ≤ C too, should the product be rounded to float32 (proof
   there): the clipped record ḡ_i = f_i·g_i;
3. :meth:`BatchClipping.clipped_sum` returns Σ_i f_i·g_i, products and sum in float64.

What remains of the float arithmetic is step 3's float64 arithmetic: it is within γ_B·Σ_i‖ḡ_i‖
≤ B²·2⁻⁵³·C of the exact sum of the B clipped records (γ_k = k·2⁻⁵³/(1 − k·2⁻⁵³)), so two
neighbouring batches' float sums differ by at most C·(1 + B²·2⁻⁵²): 1 + 2⁻³² at B = 1024, the
relative margin docs/PRIVACY.md states for the noiseless part of a release. The release
itself is the exact real sum of that float64 vector and the noise, rounded onto the public grid
(:mod:`mechanisms.grid`).

Assumptions, about the arithmetic rather than the code: NumPy's (on the CPU) and PyTorch's
(elsewhere) float32 products and their sums along an axis are IEEE operations in float32 or a
wider format, correctly rounded, in whatever order their kernels choose (the bounds below hold
for every order); no flush-to-zero of subnormals. The tests check the bound in exact rational
arithmetic on adversarial gradients (huge, tiny, subnormal, exactly at C) and drawn ones.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

__all__ = ["CLIP_SLACK", "MAX_DIMENSION", "BatchClipping", "scale_factors"]

#: Relative margin under the clip bound (δ): covers the norm estimate's error η = 2⁻¹⁷, the
#: float64 arithmetic of the factor and the float32 rounding of the clipped coordinates
#: (proof in :func:`scale_factors`). Clipping at C·(1 − 2⁻¹⁶) instead of C changes a clipped
#: gradient by 0.0015 %.
CLIP_SLACK = 2.0**-16

#: Coordinates summed in float32 before the float64 accumulation of a squared norm: the
#: float32 part's relative error is then at most γ_64 ≈ 2⁻¹⁸ whatever the model's size.
NORM_BLOCK = 64

#: Below this estimate of ‖g‖² (a norm below about 3·10⁻¹⁴), or where it is not finite (a
#: float32 square overflowed), a record's squared norm is recomputed from exact float64
#: squares: above it, what float32 squares lose to underflow (at most 2⁻¹⁴⁹ each, in
#: absolute terms, 2⁻¹¹⁷ for 2³² of them) is a relative 2⁻²⁷ at most.
_FAST_LEAST = 2.0**-90

#: The largest model the error bounds are stated for (γ_d in float64 ≤ 2⁻²⁰ below it).
MAX_DIMENSION = 2**32

#: Clip bounds outside this range are refused: within it, C·(1 − δ) is a normal float64 and
#: the factor's arithmetic has relative errors only.
_BOUND_RANGE = (2.0**-900, 2.0**900)


class BatchClipping:
    """The norms and the clipped sum of a model's per-record gradients, batch after batch.

    One object serves one training run. On the CPU the arithmetic runs in NumPy on views of
    the torch tensors: no copy, no temporary of the batch's size (a fresh one per step costs
    as much as the arithmetic: page faults on first touch, about 1 ms per 10 MB here);
    elsewhere in torch. Both compute what the bounds assume, in any order.

    Parameters
    ----------
    sizes : sequence of int
        n_p, the number of coordinates of each parameter, in the order of the rows.
    """

    def __init__(self, sizes: Sequence[int]) -> None:
        self.sizes = [int(n) for n in sizes]
        self.dimension = sum(self.sizes)
        if not self.sizes or min(self.sizes) < 1:
            raise ValueError(f"every parameter needs a coordinate, got sizes {self.sizes}")
        if self.dimension > MAX_DIMENSION:
            raise ValueError(f"a model of {self.dimension} parameters is beyond the clipping "
                             f"bound's {MAX_DIMENSION}")

    def _check(self, rows: Sequence[torch.Tensor]) -> int:
        if [int(r.shape[1]) for r in rows] != self.sizes:
            raise ValueError(f"rows of sizes {[tuple(r.shape) for r in rows]} for parameters "
                             f"of sizes {self.sizes}")
        if any(r.dtype != torch.float32 for r in rows):
            raise TypeError("the clipping bound is proven for float32 per-record gradients, "
                            f"got {sorted({str(r.dtype) for r in rows})}")
        return int(rows[0].shape[0])

    def squared_norms(self, rows: Sequence[torch.Tensor]) -> np.ndarray:
        """Return an estimate N̂_i of each record's ‖g_i‖², with ‖g_i‖² ≤ N̂_i·(1 + 2⁻¹⁷).

        Parameters
        ----------
        rows : sequence of torch.Tensor
            The per-record gradient of each parameter, float32, shape (B, n_p); the record's
            gradient g_i is the concatenation of row i of each.

        Returns
        -------
        numpy.ndarray
            float64, shape (B,).

        Raises
        ------
        FloatingPointError
            A record's gradient is not finite.
        TypeError
            A row that is not float32.
        ValueError
            Rows that do not match the parameters' sizes.

        Notes
        -----
        Proof of the bound (u = 2⁻²⁴, v = 2⁻⁵³, γ_k(w) = kw/(1 − kw), s = ‖g‖² exact, d ≤ 2³²
        coordinates). The fast path squares each coordinate in float32 (fl(x²) ≥ x²(1 − u) −
        2⁻¹⁵⁰, the last term for underflow) and sums blocks of at most 64 squares in float32
        or wider (additions carry no underflow error); each block sum b̂ ≥ (1 − γ_64(u))·s_b
        − 64·2⁻¹⁴⁹, for any order of the additions. The blocks' values are summed in float64:
        N̂ ≥ (1 − γ_d(v))·Σ b̂ ≥ (1 − γ_d(v))·((1 − γ_64(u))·s − d·2⁻¹⁴⁹). Where N̂ ≥ 2⁻⁹⁰,
        d·2⁻¹⁴⁹ ≤ 2⁻²⁷·N̂, so s ≤ N̂·(1/(1 − γ_d(v)) + 2⁻²⁷)/(1 − γ_64(u)) ≤ N̂·(1 + 2⁻¹⁸ +
        2⁻²⁰ + 2⁻²⁷ + 2⁻³³) ≤ N̂·(1 + 2⁻¹⁷). A record below 2⁻⁹⁰ or not finite (a float32
        square overflowed) is recomputed from float64 squares of its float32 coordinates, which are
        exact (float32's range squared lies in float64's normal range): N̂ ≥ (1 − γ_d(v))·s,
        s ≤ N̂·(1 + 2⁻²⁰). A record still not finite holds an infinity or a NaN.
        """
        batch = self._check(rows)
        total = np.zeros(batch, dtype=np.float64)
        for r, size in zip(rows, self.sizes, strict=True):
            bulk = size // NORM_BLOCK * NORM_BLOCK
            if _in_numpy(r):
                values = r.detach().numpy()
                if bulk:
                    blocks = values[:, :bulk].reshape(batch, bulk // NORM_BLOCK, NORM_BLOCK)
                    # float32 sums of 64 squares each, then float64 across the blocks.
                    block_sums = np.einsum("bmk,bmk->bm", blocks, blocks)
                    total += block_sums.sum(axis=1, dtype=np.float64)
                if bulk < size:
                    tail = values[:, bulk:]
                    total += (tail * tail).sum(axis=1, dtype=np.float64)
            else:
                part = torch.zeros(batch, dtype=torch.float64, device=r.device)
                if bulk:
                    cells = r[:, :bulk].reshape(batch, bulk // NORM_BLOCK, NORM_BLOCK)
                    part += (cells * cells).sum(dim=-1).sum(dim=-1, dtype=torch.float64)
                if bulk < size:
                    rest = r[:, bulk:]
                    part += (rest * rest).sum(dim=-1, dtype=torch.float64)
                total += part.cpu().numpy()
        redo = np.flatnonzero(~(np.isfinite(total) & (total >= _FAST_LEAST)))
        if redo.size:
            exact = np.zeros(redo.size, dtype=np.float64)
            index = torch.as_tensor(redo, device=rows[0].device)
            for r in rows:
                wide = r[index].to("cpu", torch.float64).numpy()
                exact += np.einsum("bk,bk->b", wide, wide)
            if not np.isfinite(exact).all():
                raise FloatingPointError("a per-record gradient is not finite")
            total[redo] = exact
        return total

    def clipped_sum(self, rows: Sequence[torch.Tensor], factors: np.ndarray) -> np.ndarray:
        """Return Σ_i f_i·g_i in float64: one flat vector of d coordinates.

        The products f_i·g_ik (float32 times float32, formed in float64) and their sum over the
        batch are float64 operations: the result is within γ_B(2⁻⁵³)·Σ_i‖f_i·g_i‖ of the exact
        sum of the clipped records (any order; Higham's bound for a dot product of B terms),
        and each f_i·g_i has norm at most C exactly (:func:`scale_factors`).

        Parameters
        ----------
        rows : sequence of torch.Tensor
            Per-record gradients of each parameter, float32, shape (B, n_p).
        factors : numpy.ndarray
            float32, shape (B,) (from :func:`scale_factors`).

        Returns
        -------
        numpy.ndarray
            float64, shape (d,) (zeros for an empty batch).
        """
        batch = self._check(rows)
        out = np.zeros(self.dimension, dtype=np.float64)
        if batch == 0:
            return out
        # Widening float32 to float64 is exact: these are the factors scale_factors bounded.
        weights = np.asarray(factors, dtype=np.float32).astype(np.float64)
        offset = 0
        for r, size in zip(rows, self.sizes, strict=True):
            part = out[offset:offset + size]
            if _in_numpy(r):
                # einsum widens the float32 rows in cache-sized pieces: no float64 copy of
                # the batch (measured 35 % faster than a float32 product and a float64 sum).
                np.einsum("i,ij->j", weights, r.detach().numpy(), out=part)
            else:
                wide = torch.as_tensor(weights, device=r.device)
                part[:] = (wide @ r.to(torch.float64)).cpu().numpy()
            offset += size
        return out


def _in_numpy(tensor: torch.Tensor) -> bool:
    """Whether to compute on ``tensor`` in NumPy (a CPU tensor: a view, no copy)."""
    return tensor.device.type == "cpu"


def scale_factors(squared: np.ndarray, bound: float, *, cap: bool = True) -> np.ndarray:
    """Return float32 factors f_i with ‖f_i·g_i‖ ≤ ``bound`` and ‖fl32(f_i·g_i)‖ ≤ ``bound``.

    ``cap=True`` clips: f_i = min(1, C(1 − δ)/√N̂_i), rounded down to float32. ``cap=False``
    normalises (OSO's unit vectors, ``bound`` 1): f_i = C(1 − δ)/√N̂_i, and 0 for a zero
    gradient. δ is :data:`CLIP_SLACK`; a further absolute margin a ≥ √d·2⁻¹⁴⁹ covers float32
    products that underflow.

    Parameters
    ----------
    squared : numpy.ndarray
        float64 estimates from :meth:`BatchClipping.squared_norms` (‖g_i‖² ≤ N̂_i·(1 + 2⁻¹⁷)).
    bound : float
        C, in [2⁻⁹⁰⁰, 2⁹⁰⁰].
    cap : bool
        Whether to keep gradients shorter than the bound as they are (clipping).

    Returns
    -------
    numpy.ndarray
        float32, shape (B,).

    Raises
    ------
    ValueError
        ``bound`` outside its range (a public value: nothing private is in the message).

    Notes
    -----
    Proof (u = 2⁻²⁴, v = 2⁻⁵³, η = 2⁻¹⁷, s = ‖g‖²). In float64, t = fl(fl(C(1 − δ)) − a) ≤
    (C(1 − δ)(1 + v) − a)(1 + v) (1 − δ and a are exact, C(1 − δ) is normal); r = fl(√N̂) ≥
    √N̂(1 − v); q = fl(t/r) ≤ t(1 + v)/r unless q is below float32's least subnormal 2⁻¹⁴⁹,
    where the float32 factor rounded down is 0. The float32 factor f is rounded toward zero,
    so f ≤ min(1, q) and f·√s ≤ q·√(N̂(1 + η)) ≤ t·√(1 + η)(1 + v)/(1 − v) (if f = 1 then
    1 ≤ q, the same bound holds for √s): ‖f·g‖ < C(1 − δ)(1 + 2⁻¹⁷) < C. Each float32
    product fl(f·x) is at most |f·x|(1 + u), or |f·x| + 2⁻¹⁵⁰ where it underflows, so
    ‖fl32(f·g)‖ ≤ (1 + u)·f·√s + √d·2⁻¹⁵⁰ ≤ k·(C(1 − δ) − a) + a/2 with k = (1 + u)(1 + v)³
    ·√(1 + η)/(1 − v) ≤ 1 + 2⁻¹⁷; hence ‖fl32(f·g)‖ ≤ C(1 + 2⁻¹⁷)(1 − 2⁻¹⁶) < C. Where
    C(1 − δ) ≤ a (a bound below 2⁻¹³²) every factor is 0; for a gradient more than 2¹²⁶
    times longer than C the factor is a float32 subnormal, and rounding it down makes the
    clipping more conservative than δ (never less); a unit-vector factor beyond float32's
    range (a gradient shorter than 2⁻¹²⁸·C) stops at float32's
    largest value, and that record's vector comes out shorter than C.
    """
    low, high = _BOUND_RANGE
    if not low <= bound <= high:
        raise ValueError(f"the clip bound must lie in [2^-900, 2^900], got {bound!r}")
    squared = np.asarray(squared, dtype=np.float64)
    # a ≥ √d·2⁻¹⁴⁹ for every model the bounds hold for (d ≤ 2³²): a public constant.
    margin = math.ldexp(1.0, 16 - 149)
    target = bound * (1.0 - CLIP_SLACK) - margin
    if target <= 0.0:
        return np.zeros(squared.shape, dtype=np.float32)
    root = np.sqrt(squared)
    positive = root > 0.0
    with np.errstate(over="ignore"):  # t/r beyond float64's range reads as inf, then 1 or 0
        factors = np.divide(target, root, out=np.full(root.shape, 1.0 if cap else 0.0),
                            where=positive)
    if cap:
        np.minimum(factors, 1.0, out=factors)
    else:
        # t/r beyond float64's range (a huge bound over a tiny norm): 0 keeps it within bound.
        factors[~np.isfinite(factors)] = 0.0
    narrow = factors.astype(np.float32)
    # Round toward zero: the cast rounds to nearest, which may round up by half an ulp (and a
    # float32 overflow to inf is rounded down to float32's largest value).
    up = narrow.astype(np.float64) > factors
    narrow[up] = np.nextafter(narrow[up], np.float32(0.0))
    return narrow
