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
