"""Small numeric helpers shared by the mechanisms."""

from __future__ import annotations

import numpy as np

# OpenBLAS splits a dot product longer than about 10^4 over threads. On a busy
# machine (two shared cores here; a phone in the field) waking those threads cost
# 3-7 ms per call where the arithmetic takes 10 µs, more than drawing the noise
# itself. Below this size BLAS runs on one thread and is fastest; above it
# einsum's single-threaded SIMD loop is predictable (~0.3 ms per 10^6 values).
_BLAS_SINGLE_THREAD_SIZE = 8192


def sum_of_squares(x: np.ndarray) -> float:
    """Return Σ x_i² of a float64 array, without temporaries or BLAS threads."""
    flat = x.ravel()
    if flat.size <= _BLAS_SINGLE_THREAD_SIZE:
        return float(flat.dot(flat))
    return float(np.einsum("i,i->", flat, flat))


#: Coordinates per block of the blocked passes below: a block's temporaries stay in cache, so
#: a pass over 10^7 values costs what the arithmetic costs, not the memory traffic of a full
#: temporary per step (about 7x faster measured on 10^7 float64 values).
BLOCK = 1 << 15


def sum_of_squared_differences(a: np.ndarray, *subtracted: np.ndarray) -> float:
    """Return Σ (a − s₁ − s₂ − …)² in float64, in cache-sized blocks (no full temporaries).

    The arrays must have one shape; any floating dtype (each is read as float64).
    """
    flat = a.ravel()
    others = [s.ravel() for s in subtracted]
    buffer = np.empty(min(BLOCK, flat.size), dtype=np.float64)
    total = 0.0
    for start in range(0, flat.size, BLOCK):
        stop = min(start + BLOCK, flat.size)
        block = buffer[:stop - start]
        block[:] = flat[start:stop]
        for s in others:
            block -= s[start:stop]
        total += sum_of_squares(block)  # no BLAS threads for a block (see above)
    return total
