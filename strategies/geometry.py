"""One pass over a round's releases: what the screening, persistence test and robust clusters share.

A round's matrix is large (100 releases of 10⁶ float32 parameters: 400 MB), and each step after
the form checks needs a few numbers per release that all come from the same products: the
screening (:mod:`strategies.norms`) needs ‖x‖ and the distance of x to each hypothesis, the
persistence test (:mod:`strategies.persistence`) each release's nearest hypothesis and its
offset from it, the robust clusters (:mod:`strategies.robust`) the same offsets' norms, the
round's median distance and, for Lloyd's iterations, the distance from each release to each
centroid. :func:`measure_round` computes all of them in one pass over column blocks of the
matrix (each block read once, converted to float64 once), and :class:`RoundGeometry` hands them
to each step; the steps keep it in step with the rows they drop (:meth:`RoundGeometry.subset`).

What is float64 and why:

* the distances ‖x − θ_j‖ are exact differences in float64 (not ‖x‖² − 2x·θ + ‖θ‖², whose
  cancellation would blur small distances next to large parameters): the screening's rules and
  the clipping radius compare them with each other;
* the Gram matrix of the releases and hypotheses is float64: Lloyd's iterations compare
  ‖x − c‖² between centroids through it, and in float32 the rounding of a product summed over
  10⁶ coordinates (≈ 10⁻⁴ of ‖x‖²) would exceed the differences it decides between;
* the sketch is float64: the persistence test subtracts the cluster's median offset in it and
  sums a device's residuals over many rounds.

The releases themselves stay float32; only one block (about 32 MiB of float64) exists at a time.

:class:`CountSketch` is the persistence test's fixed-size summary of a release: the identity for
models of at most :data:`SKETCH_WIDTH` parameters (the sums are then exact), otherwise a
CountSketch (Charikar, Chen, Farach-Colton 2002): coordinate i is added, with a random sign
s(i), to bucket b(i) of :data:`SKETCH_WIDTH`. It is linear, so the sketch of a residual is the
residual of the sketches, and it keeps norms in expectation (E‖Sv‖² = ‖v‖²).
"""

from __future__ import annotations

import functools
import secrets
from dataclasses import dataclass, field

import numpy as np

__all__ = ["SKETCH_WIDTH", "CountSketch", "RoundGeometry", "measure_round"]

#: Width of the persistence test's summary of a release: 4096 float64 (32 KiB) per device.
SKETCH_WIDTH = 4096
#: float64 values per block of the pass (~32 MiB): the round's matrix is converted a block at
#: a time, never whole.
_BLOCK = 1 << 22


@functools.lru_cache(maxsize=2)
def _hashes(seed: int, width: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Return (bucket, sign) of each of n coordinates, drawn from ``seed`` (cached: one a run)."""
    rng = np.random.default_rng(seed)
    bucket = rng.integers(0, width, size=n, dtype=np.intp)
    sign = rng.integers(0, 2, size=n).astype(np.float64) * 2.0 - 1.0
    bucket.flags.writeable = sign.flags.writeable = False
    return bucket, sign


def _secret_seed() -> int:
    return secrets.randbits(63)


@dataclass(frozen=True)
class CountSketch:
    """A linear map from R^n to R^min(n, width): the identity, or a CountSketch beyond ``width``.

    Attributes
    ----------
    width : int
        Buckets; a model of at most this many parameters is kept exactly.
    seed : int
        Draws the buckets and signs; by default from the OS's entropy. A device that knew the
        hashes could aim its push at the sketch's kernel (two coordinates of one bucket with
        opposite signs), which the persistence test cannot see: the strategy derives it from
        its rng's state (:func:`strategies.persistence.sketch_seed`) and keeps it in its
        checkpoint.
    """

    width: int = SKETCH_WIDTH
    seed: int = field(default_factory=_secret_seed)

    def __post_init__(self) -> None:
        if not 1 <= self.width:
            raise ValueError(f"width must be at least 1, got width={self.width}")

    def exact(self, n: int) -> bool:
        """Whether a vector of n coordinates is kept as it is (n ≤ ``width``)."""
        return n <= self.width

    def size(self, n: int) -> int:
        """Return the length of the summary of a vector of n coordinates."""
        return n if self.exact(n) else self.width

    def add_block(self, out: np.ndarray, block: np.ndarray, start: int, n: int) -> None:
        """Add the sketch of columns [start, start + block's width) of n-coordinate rows.

        ``out`` is (rows, :meth:`size` (n)) float64, ``block`` (rows, b) float64.
        """
        stop = start + block.shape[1]
        if self.exact(n):
            out[:, start:stop] = block
            return
        bucket, sign = _hashes(self.seed, self.width, n)
        bucket, sign = bucket[start:stop], sign[start:stop]
        for row, values in zip(out, block, strict=True):
            row += np.bincount(bucket, weights=values * sign, minlength=self.width)

    def apply(self, rows: np.ndarray) -> np.ndarray:
        """Return the (m, :meth:`size` (n)) float64 summaries of the rows of an (m, n) matrix."""
        rows = np.atleast_2d(rows)
        m, n = rows.shape
        out = np.zeros((m, self.size(n)))
        step = max(1, _BLOCK // max(m, 1))
        for start in range(0, n, step):
            self.add_block(out, rows[:, start:start + step].astype(np.float64), start, n)
        return out


@dataclass
class RoundGeometry:
    """One round's releases measured against its hypotheses (:func:`measure_round`).

    Attributes
    ----------
    norms : np.ndarray
        (m,) float64: ‖x_i‖.
    distances : np.ndarray
        (m, k) float64: ‖x_i − θ_j‖, exact differences.
    gram : np.ndarray or None
        (m + k, m + k) float64: the inner products of the rows of [X; Θ] (the releases, then
        the hypotheses); None when not asked for.
    sketched : np.ndarray or None
        (m + k, w) float64: :class:`CountSketch` of the rows of [X; Θ]; None when not asked for.
    sketch : CountSketch or None
        The map ``sketched`` was made with.
    """

    norms: np.ndarray
    distances: np.ndarray
    gram: np.ndarray | None = None
    sketched: np.ndarray | None = None
    sketch: CountSketch | None = None

    @property
    def releases(self) -> int:
        """Return m, the releases measured."""
        return int(self.distances.shape[0])

    def nearest(self) -> np.ndarray:
        """Return each release's nearest hypothesis, (m,) ``intp`` (a tie: the lowest index)."""
        if self.distances.shape[0] == 0:
            return np.zeros(0, dtype=np.intp)
        return np.argmin(self.distances, axis=1).astype(np.intp)

    def nearest_distances(self) -> np.ndarray:
        """Return d(x) = min_j ‖x − θ_j‖ of each release, (m,) float64."""
        if self.distances.shape[0] == 0:
            return np.zeros(0)
        return self.distances.min(axis=1)

    def subset(self, keep: np.ndarray | list[int]) -> RoundGeometry:
        """Return the geometry of the rows ``keep`` (a boolean mask or indices) only."""
        rows = np.arange(self.releases)[keep]
        k = self.distances.shape[1]
        both = np.concatenate([rows, self.releases + np.arange(k)])
        return RoundGeometry(
            norms=self.norms[rows], distances=self.distances[rows],
            gram=None if self.gram is None else self.gram[np.ix_(both, both)],
            sketched=None if self.sketched is None else self.sketched[both],
            sketch=self.sketch)


def measure_round(released: np.ndarray, hypotheses: np.ndarray, *, gram: bool = False,
                  sketch: CountSketch | None = None) -> RoundGeometry:
    """Measure a round's releases against its hypotheses in one pass over column blocks.

    Parameters
    ----------
    released : np.ndarray
        (m, n): one release per row (float32 in a round; read a block at a time).
    hypotheses : np.ndarray
        (k, n): the hypotheses the round sent.
    gram : bool
        Also the Gram matrix of [X; Θ] (robust clusters, :mod:`strategies.robust`).
    sketch : CountSketch, optional
        Also each row's summary (the persistence test, :mod:`strategies.persistence`).

    Returns
    -------
    RoundGeometry
        Everything in float64 (see the module notes for why).
    """
    m, n = released.shape
    k = hypotheses.shape[0]
    squares = np.zeros(m)
    distances = np.zeros((m, k))
    products = np.zeros((m + k, m + k)) if gram else None
    sketched = np.zeros((m + k, sketch.size(n))) if sketch is not None else None
    step = max(1, _BLOCK // max(m + k, 1))
    scratch = np.empty((m, min(step, n)))
    for start in range(0, n, step):
        stop = min(n, start + step)
        # One contiguous float64 block of [X; Θ]: every product below reads it, none converts.
        block = np.empty((m + k, stop - start))
        block[:m] = released[:, start:stop]
        block[m:] = hypotheses[:, start:stop]
        x = block[:m]
        diff = scratch[:, : stop - start]
        squares += np.einsum("ij,ij->i", x, x)
        for j in range(k):
            np.subtract(x, block[m + j], out=diff)
            distances[:, j] += np.einsum("ij,ij->i", diff, diff)
        if products is not None:
            products += block @ block.T
        if sketched is not None and sketch is not None:
            sketch.add_block(sketched, block, start, n)
    return RoundGeometry(norms=np.sqrt(squares), distances=np.sqrt(distances), gram=products,
                         sketched=sketched, sketch=sketch)
