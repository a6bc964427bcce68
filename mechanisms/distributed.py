"""Distributed discrete Gaussian noise for per-cluster sums under secure aggregation.

In the ``secure-clusters`` mode a device does not send its model. It writes its clipped update
into slot j of a k-slot vector (j: the hypothesis it picked), a one-hot count beside it, turns
the vector into integers, adds its share of integer noise, and hands the result to Flower's
SecAgg+, which lets the server learn only the sum over the devices of a round. This module is
that device-side arithmetic, the server's decoding of the sum, and the accounting of both
guarantees. It imports neither Flower nor torch: the numbers of Flower's protocol it needs (the
quantization range and clipping range the server announces) arrive as plain values.

The integer vector. Let T be SecAgg+'s quantization range (a power of two) and
B = T / 2^:data:`HEADROOM_BITS` the *bound*. The update δ, already clipped to ‖δ‖₂ ≤ C, is
scaled by B/C and rounded to integers q with randomized rounding, redrawn until the exact
integer norm satisfies ‖q‖₂ ≤ B (Kairouz et al. 2021, conditional randomized rounding; after
:data:`ROUNDING_TRIES` tries it is rounded toward zero, which never grows a coordinate). The
device's signal is s = (0, …, q in slot j, …, 0 | B·e_j): k·n update coordinates and k count
coordinates. Every s has ‖s‖₂ ≤ √2·B, and two of them differ by at most 2B (the same slot:
‖q − q'‖ ≤ 2B; two slots: ‖q‖² + ‖q'‖² + 2B² ≤ 4B²).

The noise. Each device adds X ~ N_Z(0, σ²)^d, the discrete Gaussian, drawn exactly by OpenDP
(``make_gaussian`` on integers: rejection sampling in exact arithmetic from the OS's entropy),
and sends a = s + X reduced modulo T. Reducing modulo T, and SecAgg+'s sum modulo its modulus
(a multiple of T), are post-processing of s + X and of Σ(s_i + X_i).

The two guarantees (:func:`local_noise_multiplier`, :func:`central_noise_multiplier`):

* **Local floor.** One device's a is the discrete Gaussian mechanism with L2 sensitivity 2B
  over its whole data set: ½(2B/σ)²-zCDP (Canonne, Kamath, Steinke 2020), the RDP curve of a
  Gaussian release with noise multiplier z = σ/(2B). It holds whatever the server does,
  including unmasking this device's vector.
* **Central.** The sum over m ≥ ``min-cohort`` honest devices, each adding N_Z(0, σ²)^d, with
  one device added or removed (L2 sensitivity √2·B): Kairouz, Liu and Steinke 2021, Theorem 1,
  gives ½ε²-zCDP with ε² = 2B²/(mσ²) + τd/2, τ = 10·Σ_{k=1}^{m-1} exp(−2π²σ²·k/(k+1)); the
  RDP curve of a Gaussian release with z = 1/ε. At gpfl's scales (σ ≥ 2^11) τ underflows to 0.

Both are composed by dp-accounting's RDP accountant as Gaussian events of these multipliers
(:mod:`mechanisms.accountant`); the PLD accountant, exact for the continuous Gaussian, is not
applied to them.

Encoding for SecAgg+. Flower's ``secaggplus_mod`` takes float arrays, clips them to [−c, c] and
quantizes (x + c)·T/(2c) by stochastic rounding. The device sends x = m·2c/T − c for its
integer m = a mod T, with c and T powers of two: every step of that quantization is then exact
in float64 and returns m itself (:func:`encode`, which checks it). The server's average of the
dequantized sum gives back Σm exactly after rounding (:func:`decode_sum`), and Σm mod T,
centred, is Σ(s_i + X_i) as long as its coordinates stay within ±T/2: the headroom of
2^:data:`HEADROOM_BITS` bounds per coordinate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from mechanisms._validation import check_positive_finite, check_positive_int

__all__ = [
    "HEADROOM_BITS",
    "MAX_QUANTIZATION_BITS",
    "MIN_QUANTIZATION_BITS",
    "ROUNDING_TRIES",
    "SecureTerms",
    "SecureTermsError",
    "SlotLayout",
    "bounded_rounding",
    "central_noise_multiplier",
    "decode_sum",
    "discrete_gaussian",
    "encode",
    "local_noise_multiplier",
    "slot_signal",
    "split_sum",
]

#: log2 of T / B: each coordinate of the sum has room for 2^9 devices' bound on either side.
HEADROOM_BITS = 10
#: The quantization ranges a device accepts: 2^16 (B = 64) to 2^24 (B = 16384).
MIN_QUANTIZATION_BITS = 16
MAX_QUANTIZATION_BITS = 24
#: Randomized roundings tried before rounding toward zero.
ROUNDING_TRIES = 20


class SecureTermsError(ValueError):
    """SecAgg+'s announced parameters are not ones a device can encode exactly."""


def _power_of_two(value: float) -> bool:
    mantissa, _ = math.frexp(value)
    return value > 0 and math.isfinite(value) and mantissa == 0.5


@dataclass(frozen=True)
class SecureTerms:
    """The SecAgg+ parameters of a round, as its setup stage announced them.

    Parameters
    ----------
    quantization_range : int
        T, a power of two between 2^:data:`MIN_QUANTIZATION_BITS` and
        2^:data:`MAX_QUANTIZATION_BITS`.
    clipping_range : float
        c, a power of two in [2^-8, 2^8]: the float encoding's offset.
    modulus_range : int
        SecAgg+'s modulus, a power of two above T (so a multiple of it).
    """

    quantization_range: int
    clipping_range: float
    modulus_range: int

    def __post_init__(self) -> None:
        t, c, mod = self.quantization_range, self.clipping_range, self.modulus_range
        if (isinstance(t, bool) or not isinstance(t, int) or not _power_of_two(t)
                or not MIN_QUANTIZATION_BITS <= t.bit_length() - 1 <= MAX_QUANTIZATION_BITS):
            raise SecureTermsError(
                f"SecAgg+ quantization range must be a power of two from "
                f"2^{MIN_QUANTIZATION_BITS} to 2^{MAX_QUANTIZATION_BITS}, got {t!r}")
        if (isinstance(c, bool) or not isinstance(c, (int, float)) or not _power_of_two(float(c))
                or not 2.0 ** -8 <= c <= 2.0 ** 8):
            raise SecureTermsError(
                f"SecAgg+ clipping range must be a power of two in [2^-8, 2^8], got {c!r}")
        if (isinstance(mod, bool) or not isinstance(mod, int) or not _power_of_two(mod)
                or mod <= t):
            raise SecureTermsError(
                f"SecAgg+ modulus range must be a power of two above {t}, got {mod!r}")

    @property
    def bound(self) -> int:
        """B: the integer L2 bound of an update, T / 2^HEADROOM_BITS."""
        return self.quantization_range >> HEADROOM_BITS

    @property
    def unit(self) -> float:
        """The float step 2c/T between two encoded integers (a power of two)."""
        return 2.0 * float(self.clipping_range) / self.quantization_range


@dataclass(frozen=True)
class SlotLayout:
    """k slots of one hypothesis's n values, then k counts: d = k·n + k coordinates."""

    num_hypotheses: int
    size: int

    def __post_init__(self) -> None:
        check_positive_int("num_hypotheses", self.num_hypotheses)
        check_positive_int("size", self.size)

    @property
    def dimension(self) -> int:
        """d, the length of the vector a device sends."""
        return self.num_hypotheses * (self.size + 1)


def local_noise_multiplier(sigma: float, bound: int) -> float:
    """Return σ/(2B): one device's vector, its whole data set replaced (sensitivity 2B)."""
    return check_positive_finite("sigma", sigma) / (2.0 * check_positive_int("bound", bound))


def central_noise_multiplier(sigma: float, bound: int, cohort: int, dimension: int) -> float:
    """Return the Gaussian-equivalent multiplier of a sum of ``cohort`` devices' shares.

    Kairouz, Liu, Steinke 2021, Theorem 1, for one device added or removed (L2 sensitivity
    √2·B): ε² = 2B²/(mσ²) + τd/2 with τ = 10·Σ_{k=1}^{m-1} exp(−2π²σ²k/(k+1)); the sum is
    ½ε²-zCDP, whose RDP curve is a Gaussian release's with z = 1/ε.

    Parameters
    ----------
    sigma : float
        σ of each device's discrete Gaussian share, in integer units.
    bound : int
        B; a device's signal has norm at most √2·B.
    cohort : int
        m, the honest devices whose shares are in the sum.
    dimension : int
        d, the vector's length.
    """
    s = check_positive_finite("sigma", sigma)
    b = check_positive_int("bound", bound)
    m = check_positive_int("cohort", cohort)
    d = check_positive_int("dimension", dimension)
    tau = 10.0 * math.fsum(math.exp(-2.0 * math.pi ** 2 * s * s * k / (k + 1))
                           for k in range(1, m))
    epsilon_squared = 2.0 * b * b / (m * s * s) + tau * d / 2.0
    return 1.0 / math.sqrt(epsilon_squared)


def bounded_rounding(update: np.ndarray, clip: float, bound: int,
                     rng: np.random.Generator) -> np.ndarray:
    """Return integers q ≈ update·B/C with the exact bound Σq² ≤ B².

    ``update`` must already be clipped to L2 norm ``clip`` (float64). Randomized rounding
    (unbiased) is redrawn up to :data:`ROUNDING_TRIES` times until the exact integer norm
    holds; then the scaled update, shrunk by 2^-20, is rounded toward zero; a vector that still
    passes the bound (only if the clipping failed) is replaced by zeros.
    """
    b = check_positive_int("bound", bound)
    scaled = np.asarray(update, dtype=np.float64).ravel() * (b / check_positive_finite(
        "clip", clip))
    if not np.isfinite(scaled).all():
        raise ValueError("the update to round is not finite")
    limit = b * b
    floor = np.floor(scaled)
    fraction = scaled - floor
    for _ in range(ROUNDING_TRIES):
        q = (floor + (rng.random(scaled.shape) < fraction)).astype(np.int64)
        if _squared_norm(q) <= limit:
            return q
    q = np.trunc(scaled * (1.0 - 2.0 ** -20)).astype(np.int64)
    return q if _squared_norm(q) <= limit else np.zeros_like(q)


def _squared_norm(q: np.ndarray) -> int:
    # Exact: Python integers (an int64 sum could overflow only far beyond gpfl's sizes, but the
    # bound must hold for every vector, so it is computed without a limit).
    return sum(int(v) * int(v) for v in q.tolist())


def slot_signal(q: np.ndarray, slot: int, layout: SlotLayout, bound: int) -> np.ndarray:
    """Return s: ``q`` in slot ``slot``, ``bound`` at that slot's count, zeros elsewhere."""
    if not 0 <= slot < layout.num_hypotheses:
        raise ValueError(f"slot must be in [0, {layout.num_hypotheses}), got {slot!r}")
    if q.shape != (layout.size,):
        raise ValueError(f"the update has shape {q.shape}, the layout needs ({layout.size},)")
    s = np.zeros(layout.dimension, dtype=np.int64)
    s[slot * layout.size:(slot + 1) * layout.size] = q
    s[layout.num_hypotheses * layout.size + slot] = bound
    return s


@lru_cache(maxsize=16)
def _opendp_sampler(sigma: float) -> Any:
    import opendp.prelude as dp

    dp.enable_features("contrib")
    return dp.m.make_gaussian(dp.vector_domain(dp.atom_domain(T=int)), dp.l2_distance(T=int),
                              scale=sigma)


#: The largest σ the sampler is asked for: its integers are 32-bit, and 2^26 leaves room for
#: tails of 30 σ.
MAX_SIGMA = float(2 ** 26)


def discrete_gaussian(sigma: float, size: int) -> np.ndarray:
    """Draw ``size`` independent N_Z(0, σ²) integers with OpenDP's exact sampler (OS entropy).

    Raises
    ------
    ValueError
        For σ not in (0, :data:`MAX_SIGMA`] or a size below 1.
    """
    s = check_positive_finite("sigma", sigma)
    n = check_positive_int("size", size)
    if s > MAX_SIGMA:
        raise ValueError(f"sigma must be at most {MAX_SIGMA:g} integer units, got {s!r}")
    out = _opendp_sampler(s)([0] * n)
    return np.asarray(out, dtype=np.int64)


def encode(a: np.ndarray, terms: SecureTerms) -> np.ndarray:
    """Return the float64 vector whose SecAgg+ quantization is exactly ``a`` mod T.

    Checks, with the quantizer's own float operations, that every value maps back to its
    integer: a value that would not (it cannot, for the terms :class:`SecureTerms` accepts)
    raises ``ValueError`` rather than leave the device as a rounded float.
    """
    t = terms.quantization_range
    c = float(terms.clipping_range)
    m = np.mod(np.asarray(a, dtype=np.int64), t)
    x = m.astype(np.float64) * terms.unit - c
    # What flwr.common.secure_aggregation.quantization.quantize computes (before its rounding,
    # which leaves an integer unchanged).
    back = (np.clip(x, -c, c) + c) * (t / (2.0 * c))
    if not np.array_equal(back, m.astype(np.float64)):
        raise ValueError("the encoding for SecAgg+ is not exact")
    return x


def decode_sum(average: np.ndarray, participants: int, terms: SecureTerms) -> np.ndarray:
    """Return Σ a_i, centred in [−T/2, T/2), from SecAgg+'s average of the dequantized vectors.

    Flower's ``SecAggPlusWorkflow`` hands the strategy (Σm·2c/T − n·c)/n for n participants of
    weight 1; multiplying back and rounding recovers the integer Σm (the float error is far
    below one unit), and Σm mod T is Σa_i mod T.
    """
    n = check_positive_int("participants", participants)
    values = np.asarray(average, dtype=np.float64).ravel()
    if not np.isfinite(values).all():
        raise ValueError("the aggregate is not finite")
    total = np.rint((values * n + n * float(terms.clipping_range)) / terms.unit)
    t = terms.quantization_range
    wrapped = np.mod(total.astype(np.int64), t)
    return np.where(wrapped >= t // 2, wrapped - t, wrapped)


def split_sum(total: np.ndarray, layout: SlotLayout, clip: float,
              bound: int) -> tuple[np.ndarray, np.ndarray]:
    """Return the per-slot sums of updates (k, n) in model units and the k noisy counts."""
    if total.shape != (layout.dimension,):
        raise ValueError(f"the sum has shape {total.shape}, the layout needs "
                         f"({layout.dimension},)")
    k, n = layout.num_hypotheses, layout.size
    sums = total[:k * n].reshape(k, n).astype(np.float64) * (clip / bound)
    counts = total[k * n:].astype(np.float64) / bound
    return sums, counts


def verify_share(event: object, signal: np.ndarray, share: np.ndarray, *, layout: SlotLayout,
                 bound: int) -> None:
    """Check a share the moment before it leaves the device; raise ``ReleaseRefused`` if not.

    From the charge and public numbers alone: the event is a
    :class:`~mechanisms.events.DistributedGaussianEvent` with finite positive multipliers; the
    signal is one slot of integers of exact norm at most B and the count B in that slot's
    count, zeros elsewhere; the share is an integer vector of the layout's length; and the
    noise, share − signal, has Σ X² at least σ²·χ²_d's lower quantile,
    with σ = z·2B from the charged z (an honest share falls below it with that probability:
    :data:`mechanisms.invariant.REFUSAL_PROBABILITY`, the release invariant's).
    """
    from scipy.stats import chi2

    from mechanisms.events import DistributedGaussianEvent
    from mechanisms.invariant import REFUSAL_PROBABILITY, ReleaseRefused

    if type(event) is not DistributedGaussianEvent:
        raise ReleaseRefused(f"a secure share must be charged as distributed-gaussian, got "
                             f"{event!r}")
    event.validate()
    d = layout.dimension
    for name, v in (("signal", signal), ("share", share)):
        if not (isinstance(v, np.ndarray) and v.dtype == np.int64 and v.shape == (d,)):
            raise ReleaseRefused(f"the {name} must be an int64 vector of length {d}")
    k, n = layout.num_hypotheses, layout.size
    counts = signal[k * n:]
    slots = np.flatnonzero(counts)
    if len(slots) != 1 or counts[slots[0]] != bound:
        raise ReleaseRefused("the share's count is not one slot of weight B")
    j = int(slots[0])
    update = signal[j * n:(j + 1) * n]
    outside = np.concatenate([signal[:j * n], signal[(j + 1) * n:k * n]])
    if outside.any() or _squared_norm(update) > bound * bound:
        raise ReleaseRefused("the share's update is not one slot of norm at most B")
    sigma = event.noise_multiplier * 2.0 * bound
    noise = share - signal
    floor = sigma * sigma * float(chi2.ppf(REFUSAL_PROBABILITY, d))
    if not float(_squared_norm(noise)) >= floor:
        raise ReleaseRefused("the share's noise is below the scale its charge pays for")
