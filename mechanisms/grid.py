"""Floating-point-safe releases: exact rounding of a noisy sum onto a public power-of-two grid.

Why. A release computed as ``fl(x + ρ)`` in floating point lands on the floats near x + ρ,
and which floats those are depends on x: the set of values a release can take, and their
last bits, differ between two inputs (Mironov 2012, "On significance of the least
significant bits for differential privacy"). A test on the trailing zeros of the mantissa
then tells two inputs apart far beyond what the mechanism's law allows.

What this module does instead. Every release of a device-level mechanism is

    g · R( Σ_i t_i / g )

where the terms t_i are the float64 arrays of the release (the model, or the hypothesis and
its clipped update, and the noise vector), g = 2^j is a power of two fixed by *public*
values (:func:`grid_spacing` of the noise's per-coordinate scale), and R rounds the **exact
real** sum to the nearest integer (ties to even). Dividing a float by a power of two is
exact, the integer R(·) is exactly representable (the sum is bounded well below 2^53), and
so is g times it. Hence:

* every release lies on the lattice gℤ^n, which does not depend on the data;
* the release is a deterministic function of the real number Σ t_i, i.e. of the ideal
  (real-arithmetic) noisy value x + ρ: rounding it is post-processing of the continuous
  mechanism, so it keeps that mechanism's guarantee, and nothing the float arithmetic did
  with x's last bits survives into the output.

The exact rounding. The float sum s = fl(Σ t_i / g) differs from the real sum by at most
E = K·2^-51·Σ_i max|t_i/g| (K terms; the recursive-summation bound with room to spare).
Where s is farther than E from a half-integer, R(real sum) = rint(s); the few coordinates
within E of a half-integer are recomputed exactly with rational arithmetic
(:class:`fractions.Fraction`); so is every coordinate of a small release whose sum goes
beyond 2^49 grid steps. A large release with such a sum is refused: it would mean a noise
scale far too small for the values it is added to.

The grid is fine: g is at most the noise's per-coordinate standard deviation divided by
:data:`STEPS_PER_SCALE` (16), finer for models of fewer than about 50 parameters, so rounding
adds a uniform error of variance g²/12 ≤ σ²/3072 to each coordinate (a 0.016 % increase of
the noise's standard deviation at most).

What remains is the float sampler's law: the noise vector is a float64 draw of the ideal
continuous law. Its deviation is data-independent and is bounded in docs/PRIVACY.md
("Floating-point safety").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction

import numpy as np

from mechanisms._numeric import BLOCK

__all__ = [
    "MAX_GRID_UNITS",
    "RELEASE_DTYPE",
    "STEPS_PER_SCALE",
    "check_grid_fits",
    "grid_spacing",
    "on_grid",
    "on_grid_exactly",
]

#: Every release leaves the device in this dtype, whatever the server sent: the device, not
#: the server, fixes the precision of what it publishes (the cast is post-processing of the
#: grid value).
RELEASE_DTYPE = np.dtype(np.float32)

#: Grid steps per unit of the noise's per-coordinate standard deviation (at least).
STEPS_PER_SCALE = 16

#: The largest |sum| in grid steps: beyond it a float64 sum could not be rounded exactly
#: with the error bound used here (and the noise would be far below the values' scale).
MAX_GRID_UNITS = 2.0**49

#: The release invariant's refusal probability for an honest release (its lower-tail level).
_TAIL_PROBABILITY = 1e-9

#: Up to this many coordinates, a sum beyond MAX_GRID_UNITS is still rounded exactly, every
#: coordinate in rational arithmetic (small models get fine grids, see grid_spacing).
_EXACT_ONLY_SIZE = 1 << 16

#: Smallest and largest grid spacings: the values divided by g must stay normal floats and
#: g times an integer below MAX_GRID_UNITS must stay finite in float64.
_MIN_SPACING_EXPONENT = -960
_MAX_SPACING_EXPONENT = 960


def grid_spacing(scale: float, size: int = 1_000_000) -> float:
    """Return the grid of a release of ``size`` coordinates whose noise has scale ``scale``.

    g = 2^⌊log2(scale · f(n))⌋ with f(n) = min(1/16, p^{1/n}/(4e)), p = 1e-9: the largest
    power of two at most a sixteenth of the scale and, for small models, finer still. The
    release invariant refuses noise whose norm falls below the 1e-9 lower tail of its law, a
    fraction of at least p^{1/n}/e of its scale (the Chernoff bound of the Gamma law behind
    both the Euclidean Laplace radius and the Gaussian's energy); rounding onto the grid moves
    a release by at most g·√n/2, so with this g a release without noise stays far below
    that tail for every n (rounding does not hide a missing noise from the check).

    Computed from ``scale`` and ``size`` alone, so the lattice of a release is as public as
    the noise scale its charge names.

    Parameters
    ----------
    scale : float
        The noise's per-coordinate standard deviation (or a public lower bound of it), > 0
        and finite.
    size : int
        The number of coordinates the noise is drawn over, >= 1.

    Raises
    ------
    ValueError
        ``scale`` not positive and finite, or so extreme that the grid leaves float64's
        exact range (below about 1e-280 or above 1e289).
    """
    scale = float(scale)
    if not 0.0 < scale < math.inf:
        raise ValueError(f"the noise scale must be positive and finite, got {scale!r}")
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"the release size must be a positive integer, got {size!r}")
    fraction = min(1.0 / STEPS_PER_SCALE,
                   math.exp(math.log(_TAIL_PROBABILITY) / size) / (4.0 * math.e))
    target = scale * fraction
    # frexp(0.0) is (0.0, 0): a product that underflowed to zero must not read as 2^-1.
    _, exponent = math.frexp(target)  # target = m·2^e with m in [0.5, 1)
    power = exponent - 1
    if not (target > 0.0 and _MIN_SPACING_EXPONENT <= power <= _MAX_SPACING_EXPONENT):
        raise ValueError(f"the noise scale {scale:.3g} is outside the range of a release grid")
    return math.ldexp(1.0, power)


def check_grid_fits(least_scale: float, size: int, magnitude: float) -> None:
    """Check, from public values, that every release of this kind can be rounded exactly.

    A release of ``size`` coordinates whose noise scale is at least ``least_scale`` and whose
    noiseless values are at most ``magnitude`` in absolute value has a grid
    (:func:`grid_spacing`), and its sums stay within :data:`MAX_GRID_UNITS` grid steps with
    2^24 steps to spare for the noise (a coordinate of 2^24 steps is 2^20 noise scales: a
    Gaussian coordinate never gets there, a Euclidean Laplace one only if the whole noise
    norm of a model of 2^40 parameters fell on it), or the release is small enough to be
    rounded in rational arithmetic. The device asks this before it charges, so that no
    release it pays for can fail on the grid.

    Raises
    ------
    ValueError
        If some release of this kind could not be rounded exactly (the message holds only
        the public values).
    """
    spacing = grid_spacing(least_scale, size)
    if size > _EXACT_ONLY_SIZE and magnitude / spacing + 2.0**24 >= MAX_GRID_UNITS:
        raise ValueError(
            f"values up to {magnitude:.3g} with noise of scale {least_scale:.3g} span more "
            "grid steps than a release can be rounded exactly over")


def on_grid(terms: Sequence[np.ndarray], spacing: float) -> np.ndarray:
    """Return spacing·R(Σ terms / spacing): the release's values on the grid, float64 (exact).

    Parameters
    ----------
    terms : sequence of numpy.ndarray
        Floating-point arrays of one shape (float32 or float64), finite; their real sum is
        rounded. None is modified.
    spacing : float
        A power of two from :func:`grid_spacing`.

    Returns
    -------
    numpy.ndarray
        A new float64 array: each value the multiple of ``spacing`` nearest to the exact real
        sum of the terms (ties to even).

    Raises
    ------
    ValueError
        A term that is not finite, or a sum beyond MAX_GRID_UNITS grid steps in a release of
        more than 65,536 coordinates.
    """
    if not terms:
        raise ValueError("nothing to round")
    if math.frexp(spacing)[0] != 0.5:
        raise ValueError(f"the grid spacing must be a power of two, got {spacing!r}")
    inverse = 1.0 / spacing  # exact: a power of two
    flat = [np.ravel(t) for t in terms]
    size = flat[0].size
    # The float sum's error bound needs each term's largest magnitude (max and min: no |t|
    # temporary of the server-sized array), in grid steps.
    largest = math.fsum(max(float(t.max()), -float(t.min())) if t.size else 0.0
                        for t in flat) * inverse
    if not math.isfinite(largest):
        raise ValueError("a release sum is not finite in grid steps")
    out = np.empty(size, dtype=np.float64)
    if largest >= MAX_GRID_UNITS:
        if size > _EXACT_ONLY_SIZE:
            raise ValueError("a release sum is beyond the grid's exact range")
        close = np.arange(size)  # every coordinate, in rational arithmetic
    else:
        close = _round_in_blocks(flat, inverse, spacing, largest, out)
    if close.size:
        exact_spacing = Fraction(spacing)
        for index in close.tolist():
            real = sum((Fraction(float(t[index])) for t in flat), Fraction(0))
            out[index] = float(round(real / exact_spacing)) * spacing  # ties to even
    return out.reshape(np.shape(terms[0]))


def _round_in_blocks(flat: list[np.ndarray], inverse: float, spacing: float, largest: float,
                     out: np.ndarray) -> np.ndarray:
    """Write g·rint(float sum / g) into ``out``; return the coordinates to redo exactly.

    The float sum of the terms, scaled by the power of two ``inverse``, differs from the real
    sum in grid steps by at most K·largest·2^-51 (recursive summation) plus what subnormal
    terms lose (2^-1074 each, scaled): where the float sum is farther than that from a
    half-step, rint of it is R of the real sum.
    """
    slack = len(flat) * (largest * 2.0**-51 + 2.0**-1074 * inverse)
    limit = 0.5 - slack
    steps = np.empty(min(BLOCK, out.size), dtype=np.float64)
    close: list[np.ndarray] = []
    for start in range(0, out.size, BLOCK):
        stop = min(start + BLOCK, out.size)
        block = out[start:stop]
        if len(flat) == 1:
            block[:] = flat[0][start:stop]
        else:
            np.add(flat[0][start:stop], flat[1][start:stop], out=block, dtype=np.float64)
            for t in flat[2:]:
                block += t[start:stop]
        block *= inverse  # exact: scaling by a power of two commutes with the rounding
        rounded = steps[:stop - start]
        np.rint(block, out=rounded)
        np.subtract(block, rounded, out=block)  # the distance to the nearest step
        np.abs(block, out=block)
        near = np.flatnonzero(block >= limit)
        if near.size:
            close.append(near + start)
        np.multiply(rounded, spacing, out=block)  # exact: an integer below 2^49 times g
    return np.concatenate(close) if close else np.empty(0, dtype=np.intp)


def on_grid_exactly(values: np.ndarray, spacing: float) -> bool:
    """Return whether every value is an integer multiple of ``spacing`` (a power of two).

    In cache-sized blocks: this is the release invariant's check of every value a device
    sends, and runs on every release.
    """
    flat = np.ravel(values)
    inverse = 1.0 / spacing  # exact: a power of two
    scaled = np.empty(min(BLOCK, flat.size), dtype=np.float64)
    rounded = np.empty_like(scaled)
    for start in range(0, flat.size, BLOCK):
        stop = min(start + BLOCK, flat.size)
        block, steps = scaled[:stop - start], rounded[:stop - start]
        np.multiply(flat[start:stop], inverse, out=block, dtype=np.float64)
        np.rint(block, out=steps)
        if not np.array_equal(block, steps):  # a fraction of a step, or not finite
            return False
    return True
