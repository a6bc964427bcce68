"""What a device decides from public values alone, before it touches its private data.

Everything here reads only what the server sent (the run config as the device applies it, the
instruction and its hypotheses) and the device's own settings, so a refusal here is a
:class:`~client.policy.PolicyDecline` (a reply naming the setting and the value; nothing read,
computed or charged) or an :class:`InstructionError`. The plan's event is computed from the
hypotheses' shapes, so the ledger is charged (or the round declined) before any private data is
read: neither a decline nor its timing can depend on the data.

Each number the device derives from the request is checked here against the range where the
arithmetic of the release holds: the noise scale of every possible release must be positive,
finite and representable in the model's dtype, whatever the local model turns out to be (a
trained model beyond the device's ``max-parameter`` is never released, see
:func:`usable_model`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from client.policy import PolicyDecline
from client.settings import PrivacySettings
from mechanisms import (
    EuclideanLaplace,
    GaussianMechanism,
    Mechanism,
    NoMechanism,
    PrivacyEvent,
    StochasticSign,
    cast_release,
    hypotheses_diameter,
)
from mechanisms.grid import check_grid_fits
from mechanisms.invariant import verify_release

__all__ = [
    "InstructionError",
    "ReleasePlan",
    "build_mechanism",
    "check_instruction",
    "check_shapes",
    "choose_hypothesis",
    "make_release",
    "plan_release",
    "usable_model",
]

Arrays = list[np.ndarray]

#: No noise scale may exceed this: the release must stay finite in float32 (3.4e38) with room
#: for the noise's tail.
MAX_NOISE_SCALE = 1e30
#: The least noise scale relative to the values it is added to: the release is made in float64
#: (52-bit mantissa), so noise at 2^-20 of the values keeps 32 bits, and the rounding of the sum
#: cannot hide it from the release invariant's check. Below that (a clip of 1e-40, say) the
#: noise would vanish in the sum and the release would be refused after the charge.
NOISE_RESOLUTION = 2.0**-20


class InstructionError(ValueError):
    """The server's instruction is malformed (public data only); nothing was computed."""


def build_mechanism(privacy: PrivacySettings) -> Mechanism[Any]:
    """Make the mechanism the client's applied privacy settings name."""
    if privacy.mechanism == "laplace":
        if privacy.calibration == "neighbourhood":
            return EuclideanLaplace(
                calibration="neighbourhood",
                noise_multiplier=privacy.noise_multiplier,
                per_layer=privacy.per_layer,
                least_radius=privacy.least_radius,
            )
        return EuclideanLaplace(
            calibration="fixed",
            epsilon=privacy.d_epsilon,
            public_radius=privacy.public_radius,
            per_layer=privacy.per_layer,
        )
    if privacy.mechanism in ("gaussian", "sign"):
        cls = GaussianMechanism if privacy.mechanism == "gaussian" else StochasticSign
        return cls(
            clip=privacy.clip,
            clip_mode=privacy.clip_mode,
            epsilon=privacy.epsilon,
            delta=privacy.delta,
            planned_releases=privacy.planned_releases,
        )
    return NoMechanism()


def check_instruction(
    parameters: Arrays, config: Mapping[str, Any], *, max_abs: float, max_hypotheses: int,
    max_values: int | None = None, shapes: Sequence[tuple[int, ...]] | None = None,
) -> list[Arrays]:
    """Check the instruction's structure and values; split it into k hypotheses.

    In an order that reads no value before the structure is known to be right: k, the
    arrays' count, types, dtypes and shapes, their total size (``max_values``) and, when the
    device knows them from public values, the task's layer shapes (``shapes``) come from the
    arrays' metadata alone; only then is every value read (finite, within ``max_abs``). So an
    instruction of the wrong shape or of absurd size costs the device neither a pass over
    its values nor its memory, and nothing is charged for it.

    Parameters
    ----------
    parameters : list of numpy.ndarray
        The k hypotheses, one after another.
    config : Mapping
        The instruction's config (``num-hypotheses``).
    max_abs : float
        The device's ``max-parameter``.
    max_hypotheses : int
        The device's ``max-hypotheses``.
    max_values : int, optional
        The device's ``max-instruction-values``: the most values (k × parameters) it accepts.
    shapes : sequence of tuple, optional
        The task's layer shapes, where the device knows them before it charges
        (:func:`public_shapes`); otherwise they are checked once the task is built.

    Raises
    ------
    PolicyDecline
        k beyond the device's ``max-hypotheses``.
    InstructionError
        A count that does not split into ``num-hypotheses`` hypotheses of the same shapes, a
        non-float array, more values than ``max_values``, layer shapes other than the
        task's, a non-finite value, or one beyond ``max_abs`` (public values only).
    """
    k = config.get("num-hypotheses", 1)
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise InstructionError(f"num-hypotheses must be an integer >= 1, got {k!r}")
    if k > max_hypotheses:
        raise PolicyDecline(
            f"declined by policy: num-hypotheses={k} is more than this device's "
            f"max-hypotheses={max_hypotheses}"
        )
    if not parameters or len(parameters) % k:
        raise InstructionError(
            f"expected num-hypotheses={k} hypotheses of equal layers, got {len(parameters)} arrays"
        )
    layers = len(parameters) // k
    first = parameters[:layers]
    hypotheses = [list(parameters[j * layers:(j + 1) * layers]) for j in range(k)]
    # Metadata only: nothing below reads a value.
    for j, arrays in enumerate(hypotheses):
        for i, (array, like) in enumerate(zip(arrays, first, strict=True)):
            if not isinstance(array, np.ndarray) or not isinstance(like, np.ndarray):
                raise InstructionError(f"hypothesis {j}, layer {i}: not an array")
            if array.shape != like.shape or array.dtype != like.dtype:
                raise InstructionError(
                    f"hypothesis {j}, layer {i}: {array.shape} {array.dtype}, hypothesis 0 has "
                    f"{like.shape} {like.dtype}"
                )
            if array.dtype not in (np.float32, np.float64):
                raise InstructionError(f"hypothesis {j}, layer {i}: expected floating-point "
                                       f"values (float32 or float64), got {array.dtype}")
    size = sum(a.size for a in first)
    if size == 0:
        raise InstructionError("the hypotheses have no parameters")
    if max_values is not None and size * k > max_values:
        raise InstructionError(
            f"the instruction holds {size * k} values ({k} hypotheses of {size}), more than "
            f"this device's max-instruction-values={max_values}")
    if shapes is not None:
        check_shapes(hypotheses, shapes)
    # Now the values.
    for j, arrays in enumerate(hypotheses):
        for i, array in enumerate(arrays):
            if not np.isfinite(array).all():
                raise InstructionError(f"hypothesis {j}, layer {i}: non-finite values")
            # Two passes without a temporary: abs() would copy an array the server sized.
            largest = max(float(array.max()), -float(array.min())) if array.size else 0.0
            if largest > max_abs:
                raise InstructionError(
                    f"hypothesis {j}, layer {i}: a value of magnitude {largest:.3g} is beyond "
                    f"this device's max-parameter={max_abs:g}"
                )
    return hypotheses


def check_shapes(hypotheses: list[Arrays], expected: Any) -> None:
    """Refuse hypotheses whose layer shapes are not ``expected`` (:class:`InstructionError`).

    ``expected`` is a sequence of shapes, or a task (its ``parameter_shapes``).
    """
    if not isinstance(expected, Sequence):
        expected = expected.parameter_shapes
    shapes = [tuple(a.shape) for a in hypotheses[0]]
    wanted = [tuple(shape) for shape in expected]
    if shapes != wanted:
        raise InstructionError(
            f"the hypotheses' layer shapes {shapes} are not the task's {wanted}")


@dataclass(frozen=True)
class ReleasePlan:
    """A round's release, decided from public values: what is charged and how it is made.

    Attributes
    ----------
    mechanism : Mechanism
        The mechanism the device applies.
    event : PrivacyEvent
        What the release costs (from the hypotheses' shapes); charged before data is read.
    spread : float
        The hypotheses' diameter (public).
    metrics : dict
        The public metrics of the release (never a function of the private data).
    """

    mechanism: Mechanism[Any]
    event: PrivacyEvent
    spread: float
    metrics: dict[str, float] = field(default_factory=dict)


def plan_release(
    privacy: PrivacySettings, hypotheses: list[Arrays], *, max_abs: float
) -> ReleasePlan:
    """Decide the release from public values, or decline before anything private is touched.

    Raises
    ------
    PolicyDecline
        A noise scale that would be zero, non-finite or beyond float32 for some release the
        device could make (the message names the settings and values).
    """
    reference = hypotheses[0]
    n = sum(a.size for a in reference)
    try:
        mechanism = build_mechanism(privacy)
        spread = hypotheses_diameter(hypotheses)
    except Exception as err:  # public values only: any failure is a decline
        # E.g. dp-accounting finds no noise multiplier for epsilon = 5e-324 (its own
        # NoBracketIntervalFoundError); the text holds only the request's values.
        raise PolicyDecline(f"the request cannot be calibrated: {err}") from None
    check = _Checker(privacy)
    if privacy.mechanism == "laplace" and privacy.calibration == "neighbourhood":
        nu, least = privacy.noise_multiplier, privacy.least_radius
        # A release is trained from a hypothesis and kept within max-parameter: its ‖δ‖ is at
        # most 2·max_abs·√n, so ν·r is at most ν·that; the least is ν·least-radius.
        check.noise("noise-multiplier", nu * 2.0 * max_abs * math.sqrt(n), at_most=True)
        check.finite("least-radius", n / (nu * least))
        check.grid("noise-multiplier", nu * least / math.sqrt(n), n, max_abs)
        metrics: dict[str, float] = {"budget-epsilon": 0.0, "budget-delta": 0.0}
    elif privacy.mechanism == "laplace":
        per_coordinate = math.sqrt(n + 1) / privacy.d_epsilon
        check.noise("d-epsilon", per_coordinate * math.sqrt(n), at_most=True)
        check.grid("d-epsilon", math.sqrt(n) / privacy.d_epsilon, n, max_abs)
        metrics = {k: float(v) for k, v in mechanism.public_metrics(reference, reference).items()}
    elif isinstance(mechanism, GaussianMechanism | StochasticSign):  # "gaussian" or "sign"
        check.finite("epsilon", mechanism.noise_multiplier)
        # The σ the release will draw its noise with, as the mechanism states it (whether the
        # hypotheses' spread enters is the mechanism's to say).
        sigma = mechanism.sigma(n, spread)
        check.noise("epsilon", sigma * math.sqrt(n), at_most=True)
        check.finite("clip", 1.0 / sigma)
        if isinstance(mechanism, GaussianMechanism):
            # The release is hypothesis + clip(δ) + noise: its values are public up to the clip.
            largest = max(float(np.abs(a).max()) for h in hypotheses for a in h if a.size)
            check.resolvable("clip", sigma, largest + privacy.clip)
            check.grid("clip", sigma, n, largest + privacy.clip)
        else:  # the sign of the clipped update alone: each coordinate within the clip
            check.grid("clip", sigma, n, privacy.clip)
        metrics = {k: float(v) for k, v in
                   mechanism.public_metrics(reference, reference, spread=spread).items()}
    else:
        metrics = {"sigma": 0.0, "budget-epsilon": 0.0, "budget-delta": 0.0}
    event = mechanism.event(reference, reference)
    return ReleasePlan(mechanism=mechanism, event=event, spread=spread, metrics=metrics)


class _Checker:
    """Turns an out-of-range derived number into a decline naming the setting behind it."""

    def __init__(self, privacy: PrivacySettings) -> None:
        self.values = {
            "noise-multiplier": privacy.noise_multiplier, "least-radius": privacy.least_radius,
            "d-epsilon": privacy.d_epsilon, "epsilon": privacy.epsilon, "clip": privacy.clip,
        }

    def _decline(self, name: str, what: str) -> PolicyDecline:
        return PolicyDecline(
            f"declined: with {name}={self.values[name]!r} {what}; nothing was computed"
        )

    def finite(self, name: str, value: float) -> None:
        if not (value > 0.0 and math.isfinite(value)):
            raise self._decline(name, f"a derived scale is {value!r}, not positive and finite")

    def resolvable(self, name: str, scale: float, magnitude: float) -> None:
        if scale < NOISE_RESOLUTION * magnitude:
            raise self._decline(
                name, f"the noise scale {scale:.3g} is below float64's resolution at the "
                f"release's values (up to {magnitude:.3g})")

    def grid(self, name: str, least_scale: float, size: int, magnitude: float) -> None:
        try:
            check_grid_fits(least_scale, size, magnitude)
        except ValueError as err:
            raise self._decline(name, f"no floating-point-safe release fits: {err}") from None

    def noise(self, name: str, value: float, *, at_most: bool = False) -> None:
        self.finite(name, value)
        if at_most and value > MAX_NOISE_SCALE:
            raise self._decline(
                name, f"the noise could reach {value:.3g}, beyond what float32 can carry")


def choose_hypothesis(loss: Callable[[Arrays], float], hypotheses: list[Arrays]) -> int:
    """Return the index of the hypothesis of lowest loss; a non-finite loss never wins.

    If every loss is non-finite, hypothesis 0: the choice must not turn into an error (an error
    after private data was read would be a signal of its own).
    """
    losses = []
    for h in hypotheses:
        value = float(loss(h))
        losses.append(value if math.isfinite(value) else math.inf)
    return int(np.argmin(losses)) if any(math.isfinite(v) for v in losses) else 0


def usable_model(trained: Any, reference: Arrays, *, max_abs: float) -> tuple[Arrays, bool]:
    """Return the trained model if it is a finite model within ``max_abs``, else the reference.

    A diverged or absurd local model (a learning rate the data did not tolerate) is replaced
    by the hypothesis it started from, δ = 0, so that divergence is not a signal of its own:
    the release is still made and charged at the scale the plan paid for. Returns the model
    and whether it is the trained one.
    """
    try:
        model = [np.asarray(a) for a in trained]
    except TypeError:
        return [r.copy() for r in reference], False
    ok = len(model) == len(reference) and all(
        m.shape == r.shape and np.issubdtype(m.dtype, np.floating)
        and bool(np.isfinite(m).all()) and (m.size == 0 or float(np.abs(m).max()) <= max_abs)
        for m, r in zip(model, reference, strict=False)
    )
    if not ok:
        return [r.copy() for r in reference], False
    return [m.astype(r.dtype, copy=False) for m, r in zip(model, reference, strict=True)], True


def make_release(
    plan: ReleasePlan, reference: Arrays, updated: Arrays, *, rng: np.random.Generator,
    allow_unsanitized: bool = False,
) -> Arrays:
    """Return the arrays that leave the device: sanitize, cast to float32, check.

    This is the one path of a device-level release, the same in ``fit``, the privacy audits
    and the benchmarks: the mechanism's exact release on its public grid
    (:meth:`~mechanisms.Mechanism.sanitize_exact`), its cast to the release dtype
    (:func:`~mechanisms.cast_release`, float32 whatever the server sent) and the release
    invariant (:func:`~mechanisms.invariant.verify_release`) on both.

    Raises
    ------
    mechanisms.invariant.ReleaseRefused
        The release does not carry the noise its charge paid for (nothing may be sent).
    """
    exact = plan.mechanism.sanitize_exact(reference, updated, rng=rng, spread=plan.spread)
    released = cast_release(exact, updated)
    # The last line of defence: nothing leaves without the noise its charge paid for.
    verify_release(plan.mechanism, plan.event, reference=reference, updated=updated,
                   released=released, exact=exact, spread=plan.spread,
                   allow_unsanitized=allow_unsanitized)
    return released
