"""The release invariant: the last check before a vector leaves a device.

Everything before it (settings bounds, the instruction's checks, the mechanisms'
own validation) may one day have a bug; this check is written to hold even then.
Given the event the ledger charged and the arrays about to be sent, it verifies,
without the mechanism's own noise or σ (what it does read is said below), that

1. the charge is real: an event this accountant knows, with a cost (d-privacy) or
   noise multiplier (RDP) that is positive and finite, and it is the event of this
   very release (recomputed from the release's shapes and the mechanism's
   parameters);
2. the release is well formed: the layers' count and shapes of the model, the
   device's release dtype (float32, whatever the server sent), every value finite;
3. the noise is there, at the scale the charge paid for: the noise actually added
   (the release in float64, before its cast to the model's dtypes, minus the
   noiseless output) is not smaller than the charged scale allows, up to a
   lower-tail bound of its law that an honest release falls below with
   probability at most :data:`REFUSAL_PROBABILITY`; and the arrays sent are
   exactly the cast of that float64 release. The cast is post-processing (it
   keeps the guarantee) but may round noise below the dtype's resolution away:
   float32 has a spacing of 0.0625 at 1e6, a device's largest parameter;
4. the release is floating-point safe: every value of the float64 release is an
   integer multiple of the grid spacing (:func:`~mechanisms.grid.grid_spacing`)
   of the scale computed here from the charge, so the set of values a release
   can take is fixed by public numbers (for the neighbourhood calibration, by
   ν and the radius the charge scales to), never by the last bits of the data.

What the check takes from the mechanism, and why that is sound. The scale is
computed here, from the charged event and public numbers: ν·max(‖δ‖, r_min) for
the neighbourhood calibration, n/ε for the fixed one, and for the Gaussian z·(Δ + D)
by the formula of the mechanism the event names
(:meth:`GaussianMechanism.noise_scale <mechanisms.gaussian.GaussianMechanism.noise_scale>`,
called with the charged z; the clipped update is recomputed with
:mod:`mechanisms.clipping`); the mechanism's own σ and noise are never used. It does
read public parameters from the mechanism: its event for
this release (compared with the charged one), its least radius r_min
(neighbourhood) and its clip C and clip mode (Gaussian, sign). None of them
enters the charge: a neighbourhood release costs n/ν at any radius r (ε = n/(ν·r),
ε·r = n/ν), and a Gaussian one is charged by z, which gives its (ε, δ) for any C
as long as the noise is z·(Δ + D); so whatever values these attributes hold, a
release that passes carries noise at the scale its charge stands for (an r_min of
0 with ‖δ‖ = 0 leaves no scale and is refused). That the least radius is the
device's own, and the clip the one the mechanism applied, is not checked here:
the first is the device's policy, applied where the mechanism is built
(:func:`client.release.build_mechanism`), the second is the shared clipping code.
For the stochastic sign the noise cannot be seen in a ±1 vector: the check is that
every value is ±1 and that the mechanism's σ (the one method it calls) is at
least the scale its charge pays for, z·Δ
(:meth:`StochasticSign.noise_scale <mechanisms.sign.StochasticSign.noise_scale>` of the
charged z).

A failed check raises :class:`ReleaseRefused`; the caller sends nothing (the
release was already charged: a refusal must not be a free signal).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np

from mechanisms._numeric import BLOCK, sum_of_squared_differences
from mechanisms.base import Mechanism, PrivacyEvent
from mechanisms.clipping import CLIP_MODES, clip_elementwise, clip_l2
from mechanisms.events import (
    GaussianReleaseEvent,
    MetricPrivacyEvent,
    NeighbourhoodEvent,
    NonPrivateEvent,
    SignReleaseEvent,
)
from mechanisms.gaussian import GaussianMechanism
from mechanisms.grid import RELEASE_DTYPE, grid_spacing, on_grid_exactly
from mechanisms.laplace import laplace_grid, neighbourhood_epsilon
from mechanisms.sign import StochasticSign

__all__ = ["REFUSAL_PROBABILITY", "ReleaseRefused", "lower_tail_factor", "verify_release"]

#: The largest probability that an honest release is refused by the noise check.
REFUSAL_PROBABILITY = 1e-9


class ReleaseRefused(RuntimeError):
    """The release does not carry the noise its charge paid for; it must not be sent.

    The message names which check failed and public numbers only.
    """


# Memoised: every release asks it for its block sizes, and the bisection costs ~0.3 ms, a third
# of a small model's whole release.
@functools.lru_cache(maxsize=256)
def lower_tail_factor(shape: float, probability: float = REFUSAL_PROBABILITY) -> float:
    """Return x in (0, 1) with P(Gamma(shape, 1) < x·shape) <= ``probability``.

    By the Chernoff bound P(G < x·k) <= (x·e^{1−x})^k for G ~ Gamma(k, 1) and
    x < 1, so the x solving k·(ln x + 1 − x) = ln p is such a factor. It serves
    both laws the mechanisms draw: the Euclidean Laplace radius is
    Gamma(n, scale), and ‖N(0, σ²I_n)‖²/(2σ²) is Gamma(n/2, 1).

    Parameters
    ----------
    shape : float
        The Gamma shape k > 0.
    probability : float
        The tail probability p in (0, 1).
    """
    if not (shape > 0.0 and math.isfinite(shape)) or not 0.0 < probability < 1.0:
        raise ValueError(f"need shape > 0 and 0 < probability < 1, got {shape!r}, {probability!r}")
    target = math.log(probability) / shape
    low, high = 0.0, 1.0  # ln x + 1 − x rises from −inf (x → 0) to 0 (x = 1)
    for _ in range(200):
        mid = 0.5 * (low + high)
        if mid <= 0.0 or math.log(mid) + 1.0 - mid < target:
            low = mid
        else:
            high = mid
    return low


def verify_release(
    mechanism: Mechanism[PrivacyEvent],
    event: PrivacyEvent,
    *,
    reference: Sequence[np.ndarray],
    updated: Sequence[np.ndarray],
    released: Sequence[np.ndarray],
    spread: float,
    exact: Sequence[np.ndarray] | None = None,
    allow_unsanitized: bool = False,
) -> None:
    """Refuse a release that does not carry the noise ``event`` was charged for.

    Parameters
    ----------
    mechanism : Mechanism
        The mechanism that made the release (its public parameters only are read).
    event : PrivacyEvent
        The event the ledger charged for this release.
    reference, updated : sequence of numpy.ndarray
        The hypothesis the release is centred on and the model that was sanitized.
    released : sequence of numpy.ndarray
        What is about to leave the device.
    spread : float
        The hypotheses' diameter the mechanism was given.
    exact : sequence of numpy.ndarray, optional
        The release in float64 before its cast to the model's dtypes
        (:meth:`~mechanisms.base.Mechanism.sanitize_exact`). When given, ``released``
        must be exactly its cast, and the noise is measured on it: a cast may round
        noise below the dtype's resolution away (post-processing, which keeps the
        guarantee), and must not make an honest release look unnoised.
    allow_unsanitized : bool
        The device explicitly allows the non-private baseline (``NonPrivateEvent``).

    Raises
    ------
    ReleaseRefused
        If any check fails (see the module notes).
    """
    ref = [np.asarray(a) for a in reference]
    upd = [np.asarray(a) for a in updated]
    out = [np.asarray(a) for a in released]
    _check_charge(event, allow_unsanitized)
    try:
        expected = mechanism.event(reference, updated)
    except (TypeError, ValueError) as err:
        raise ReleaseRefused(f"the release's event cannot be recomputed: {err}") from None
    if expected != event:
        raise ReleaseRefused(f"the charged event {event!r} is not this release's {expected!r}")
    _check_shape(upd, out)
    if exact is not None:
        out = _check_cast(out, exact)
    if isinstance(event, NonPrivateEvent):
        return
    if isinstance(event, NeighbourhoodEvent):
        least = getattr(mechanism, "least_radius", None) or 0.0
        blocks = _blocks(upd, len(event.dimensions))
        for layers in blocks:
            delta = math.sqrt(math.fsum(
                sum_of_squared_differences(upd[i], ref[i]) for i in layers))
            n = sum(upd[i].size for i in layers)
            try:
                epsilon = neighbourhood_epsilon(n, event.noise_multiplier, max(delta, least))
            except ValueError:
                raise ReleaseRefused("the charged noise scale is not positive and finite") from None
            _check_radial_noise(upd, out, layers, epsilon)
    elif isinstance(event, MetricPrivacyEvent):
        blocks = _blocks(upd, len(event.layers))
        for layers, (epsilon, _) in zip(blocks, event.layers, strict=True):
            _check_radial_noise(upd, out, layers, epsilon)
    elif isinstance(event, SignReleaseEvent):
        _check_sign(mechanism, event, upd, out, spread)
    elif isinstance(event, GaussianReleaseEvent):
        _check_gaussian(mechanism, event, ref, upd, out, spread)
    else:  # pragma: no cover - _check_charge refuses every other type
        raise ReleaseRefused(f"no noise check for {type(event).__name__}")


# -- the checks -------------------------------------------------------------------------------


def _check_charge(event: PrivacyEvent, allow_unsanitized: bool) -> None:
    if isinstance(event, NonPrivateEvent):
        if not allow_unsanitized:
            raise ReleaseRefused("a release without noise is not allowed on this device")
        return
    if type(event) in (NeighbourhoodEvent, MetricPrivacyEvent):
        cost = event.cost  # type: ignore[attr-defined]
        if not (cost > 0.0 and math.isfinite(cost)):
            raise ReleaseRefused(f"the charged cost is not positive and finite: {cost!r}")
        return
    if type(event) in (GaussianReleaseEvent, SignReleaseEvent):
        z = event.noise_multiplier  # type: ignore[attr-defined]
        if not (z > 0.0 and math.isfinite(z)):
            raise ReleaseRefused(f"the charged noise multiplier is not positive and finite: {z!r}")
        return
    raise ReleaseRefused(f"{type(event).__name__} is not an event this device can charge")


def _check_shape(upd: list[np.ndarray], out: list[np.ndarray]) -> None:
    if len(out) != len(upd):
        raise ReleaseRefused(f"the release has {len(out)} layers, the model {len(upd)}")
    for i, (u, o) in enumerate(zip(upd, out, strict=True)):
        if o.shape != u.shape or o.dtype != RELEASE_DTYPE:
            raise ReleaseRefused(
                f"layer {i}: released {o.shape} {o.dtype}, the release must be {u.shape} "
                f"{RELEASE_DTYPE}")
        if not np.isfinite(o).all():
            raise ReleaseRefused(f"layer {i}: the release holds non-finite values")


def _check_cast(out: list[np.ndarray], exact: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Return the float64 release of which ``out`` must be exactly the cast; else refuse."""
    noisy = [np.asarray(a) for a in exact]
    if len(noisy) != len(out):
        raise ReleaseRefused(f"the float64 release has {len(noisy)} layers, the model {len(out)}")
    for i, (n, o) in enumerate(zip(noisy, out, strict=True)):
        if n.dtype != np.float64 or n.shape != o.shape or not np.isfinite(n).all():
            raise ReleaseRefused(f"layer {i}: the float64 release is not a finite float64 array "
                                 "of the model's shape")
        if not _is_cast_of(o, n):
            raise ReleaseRefused(f"layer {i}: the release is not the cast of its float64 release")
    return noisy


def _is_cast_of(released: np.ndarray, exact: np.ndarray) -> bool:
    """Return whether ``released`` is exactly ``exact`` cast to the release dtype (in blocks)."""
    flat, source = released.ravel(), exact.ravel()
    buffer = np.empty(min(BLOCK, flat.size), dtype=RELEASE_DTYPE)
    for start in range(0, flat.size, BLOCK):
        stop = min(start + BLOCK, flat.size)
        cast = buffer[:stop - start]
        with np.errstate(over="ignore"):
            cast[:] = source[start:stop]
        if not np.array_equal(cast, flat[start:stop]):
            return False
    return True


def _blocks(upd: list[np.ndarray], count: int) -> list[tuple[int, ...]]:
    """Return the layers of each noise block: all together, or each non-empty layer."""
    if count == 1:
        return [tuple(range(len(upd)))]
    layers: list[tuple[int, ...]] = [(i,) for i in range(len(upd)) if upd[i].size > 0]
    if len(layers) != count:
        raise ReleaseRefused(f"the event has {count} blocks, the model {len(layers)} layers")
    return layers


def _check_radial_noise(
    upd: list[np.ndarray], out: list[np.ndarray], layers: tuple[int, ...], epsilon: float
) -> None:
    """Euclidean Laplace: the noise norm is Gamma(n, 1/ε); refuse one below its 1e-9 tail.

    The release must also lie on the grid of ε (:func:`~mechanisms.laplace.laplace_grid`).
    """
    n = sum(upd[i].size for i in layers)
    mean_norm = n / epsilon if epsilon > 0.0 else math.inf
    if not (mean_norm > 0.0 and math.isfinite(mean_norm)):
        raise ReleaseRefused(f"the charged noise scale is not positive and finite: {mean_norm!r}")
    try:
        spacing = laplace_grid(n, epsilon)
    except ValueError:
        raise ReleaseRefused("the charged noise scale has no release grid") from None
    realized = math.sqrt(math.fsum(
        sum_of_squared_differences(out[i], upd[i]) for i in layers))
    # Rounding onto the grid moves the release by at most spacing·√n/2 (grid_spacing keeps
    # that far below the tail, so a release without noise is still refused).
    if realized + spacing * math.sqrt(n) / 2 < lower_tail_factor(n) * mean_norm:
        raise ReleaseRefused(
            f"a block of {n} parameters carries noise of norm {realized:.3g}, below what its "
            "charge pays for")
    _check_grid(out, layers, spacing)


def _check_grid(out: list[np.ndarray], layers: tuple[int, ...], spacing: float) -> None:
    """Refuse a release whose float64 values are not all on the public grid of its charge."""
    for i in layers:
        if not on_grid_exactly(out[i], spacing):
            raise ReleaseRefused(
                f"layer {i}: the release is not on the grid of its charged noise scale "
                f"(spacing {spacing:.3g}): its last bits could carry the data")


def _check_gaussian(
    mechanism: Mechanism[PrivacyEvent], event: GaussianReleaseEvent, ref: list[np.ndarray],
    upd: list[np.ndarray], out: list[np.ndarray], spread: float,
) -> None:
    """Gaussian: ‖noise‖² is σ²·χ²_n; σ must be at least z·(Δ + D)."""
    clip, mode = getattr(mechanism, "clip", None), getattr(mechanism, "clip_mode", None)
    if not isinstance(clip, float) or mode not in CLIP_MODES:
        raise ReleaseRefused("a Gaussian release from a mechanism without a clipping bound")
    n = sum(u.size for u in upd)
    # The Gaussian mechanism's formula at the charged z: not the mechanism's own σ.
    sigma = GaussianMechanism.noise_scale(event.noise_multiplier, mode, clip, n, spread)
    delta = [np.subtract(u, r, dtype=np.float64) for r, u in zip(ref, upd, strict=True)]
    clipped = clip_l2(delta, clip) if mode == "l2" else clip_elementwise(delta, clip)
    energy = math.fsum(
        sum_of_squared_differences(np.asarray(o), r, d)
        for o, r, d in zip(out, ref, clipped, strict=True))
    if not (sigma > 0.0 and math.isfinite(sigma)):
        raise ReleaseRefused(f"the charged noise scale is not positive and finite: {sigma!r}")
    try:
        spacing = grid_spacing(sigma, n)
    except ValueError:
        raise ReleaseRefused("the charged noise scale has no release grid") from None
    # ‖ρ‖²/(2σ²) ~ Gamma(n/2, 1): refuse below its 1e-9 lower tail, less what rounding onto
    # the grid can take away (at most spacing·√n/2 of the norm).
    needed = math.sqrt(lower_tail_factor(n / 2) * n) * sigma
    if math.sqrt(energy) + spacing * math.sqrt(n) / 2 < needed:
        raise ReleaseRefused(
            f"the release carries noise of norm {math.sqrt(energy):.3g} over {n} coordinates, "
            "below what its charge pays for")
    _check_grid(out, tuple(range(len(out))), spacing)


def _check_sign(
    mechanism: Mechanism[PrivacyEvent], event: SignReleaseEvent, upd: list[np.ndarray],
    out: list[np.ndarray], spread: float,
) -> None:
    """Stochastic sign: only ±1, drawn with σ at least z·Δ (the noise itself is not visible)."""
    clip, mode = getattr(mechanism, "clip", None), getattr(mechanism, "clip_mode", None)
    sigma_of = getattr(mechanism, "sigma", None)
    if not isinstance(clip, float) or mode not in CLIP_MODES or sigma_of is None:
        raise ReleaseRefused("a sign release from a mechanism without a clipping bound")
    for i, o in enumerate(out):
        if not np.isin(o, (-1.0, 1.0)).all():
            raise ReleaseRefused(f"layer {i}: a sign release holds values other than +1 and -1")
    n = sum(u.size for u in upd)
    # The sign mechanism's formula at the charged z (it leaves the spread out).
    needed = StochasticSign.noise_scale(event.noise_multiplier, mode, clip, n, spread)
    if not sigma_of(n, 0.0) >= needed:
        raise ReleaseRefused("the sign mechanism's sigma is below what its charge pays for")
