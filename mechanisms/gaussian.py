"""The Gaussian mechanism on a clipped update (Wu et al., section 3, for IID data).

δ = updated − reference is clipped (L2 norm C, or each coordinate to [−c, c]),
so its replace-one L2 sensitivity is Δ = 2C (or 2c·√n). The release is
``reference + clip(δ) + N(0, σ² I)`` with σ = z·(Δ + D), where the noise
multiplier z is calibrated once, with dp-accounting's RDP accountant, so that the
client's ``planned_releases`` releases compose to its (ε, δ) target, and D is the
``spread`` of the hypotheses the server sent (0 for one hypothesis).

Why Δ + D. With k ≥ 2 hypotheses θ_1..θ_k the client picks the one that fits its
data best, so ``reference`` itself depends on the private data. Write the release
as f(X) + N(0, σ² I) with f(X) = θ_{j(X)} + clip(δ(X)). For any two local data
sets X_a, X_b, whatever hypotheses θ_a = θ_{j(X_a)} and θ_b = θ_{j(X_b)} they
lead to,

    ‖f(X_a) − f(X_b)‖ ≤ ‖θ_a − θ_b‖ + ‖clip(δ_a) − clip(δ_b)‖ ≤ D + Δ,

with D = max_{i,j} ‖θ_i − θ_j‖ (public: the server sent the hypotheses). A
Gaussian with σ = z·(D + Δ) is therefore the Gaussian mechanism with noise
multiplier z on a function of L2 sensitivity D + Δ, whose RDP curve α/(2z²) is
what dp-accounting composes for ``GaussianDpEvent(z)``; the event, and so the
charged cost, does not change with D. This holds for any hypotheses the server
sends, and composes over rounds even though the server chooses the next
hypotheses after seeing the earlier releases (RDP composes adaptively).
"""

from __future__ import annotations

from typing import ClassVar, TypeVar

import numpy as np
from numpy.random import Generator

from mechanisms._validation import (
    check_choice,
    check_non_negative_finite,
    check_open_unit,
    check_positive_finite,
    check_positive_int,
)
from mechanisms.base import Layers, Mechanism
from mechanisms.calibration import calibrate_gaussian_noise_multiplier
from mechanisms.clipping import CLIP_MODES, clip_elementwise, clip_l2, l2_sensitivity
from mechanisms.events import GaussianReleaseEvent
from mechanisms.grid import grid_spacing, on_grid

#: The event of a clipped-Gaussian mechanism: a Gaussian release or its sign.
_GaussianEventT = TypeVar("_GaussianEventT", bound=GaussianReleaseEvent, covariant=True)


class _ClippedGaussianBase(Mechanism[_GaussianEventT]):
    """Clipping, calibration and metrics shared by the Gaussian and stochastic-sign mechanisms."""

    def __init__(
        self,
        *,
        clip: float,
        clip_mode: str = "l2",
        epsilon: float,
        delta: float,
        planned_releases: int,
    ) -> None:
        self.clip = check_positive_finite("clip", clip)
        self.clip_mode = check_choice("clip_mode", clip_mode, CLIP_MODES)
        self.epsilon = check_positive_finite("epsilon", epsilon)
        self.delta = check_open_unit("delta", delta)
        self.planned_releases = check_positive_int("planned_releases", planned_releases)
        # Memoised per (ε, δ, releases): the client object is rebuilt for every message.
        self.noise_multiplier = calibrate_gaussian_noise_multiplier(
            self.epsilon, self.delta, self.planned_releases
        )

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(clip={self.clip!r}, clip_mode={self.clip_mode!r}, "
            f"epsilon={self.epsilon!r}, delta={self.delta!r}, "
            f"planned_releases={self.planned_releases!r})"
        )

    #: Whether the release is centred on ``reference`` and so must cover the spread.
    _CENTRED_ON_REFERENCE: ClassVar[bool] = True

    @classmethod
    def noise_scale(
        cls, noise_multiplier: float, clip_mode: str, clip: float, n: int, spread: float = 0.0
    ) -> float:
        """Return the per-coordinate noise std σ of this mechanism's release at multiplier z.

        σ = z·(Δ + D) for a release centred on ``reference`` (the Gaussian mechanism, see
        the module notes), σ = z·Δ for one that is not (the stochastic sign: D is ignored),
        with Δ = :func:`~mechanisms.clipping.l2_sensitivity` of the clipped update.

        This is the one place the formula is written. The mechanism draws its noise with
        it (its own z), the client plans the release with it
        (:func:`client.release.plan_release`), and the release invariant
        (:mod:`mechanisms.invariant`) computes with it the scale a charge pays for, from the
        charged z and public numbers, never from the mechanism's own σ: hence a class
        method, which takes z rather than reading it from an instance.

        Parameters
        ----------
        noise_multiplier : float
            z: the mechanism's calibrated one, or the one an event was charged for.
        clip_mode : {"l2", "elementwise"}
            How the update is clipped.
        clip : float
            The clipping norm C (``"l2"``) or coordinate bound c (``"elementwise"``), > 0.
        n : int
            The number of coordinates of the update, >= 1.
        spread : float
            The hypotheses' diameter D (not validated here: :meth:`sigma` and the callers
            pass a checked one).

        Returns
        -------
        float
        """
        sensitivity = l2_sensitivity(clip_mode, clip, n)
        return noise_multiplier * (sensitivity + (spread if cls._CENTRED_ON_REFERENCE else 0.0))

    def sigma(self, n: int, spread: float = 0.0) -> float:
        """Return the per-coordinate noise std of this mechanism's release of ``n`` coordinates.

        :meth:`noise_scale` at this mechanism's calibrated z, clip and clip mode: z·(Δ + spread)
        for the Gaussian mechanism, z·Δ for the stochastic sign (which ignores the spread).

        Parameters
        ----------
        n : int
            The number of coordinates of the update.
        spread : float
            The hypotheses' diameter D, >= 0 and finite (see the module notes).

        Returns
        -------
        float
        """
        spread = check_non_negative_finite("spread", spread)
        return self.noise_scale(self.noise_multiplier, self.clip_mode, self.clip, n, spread)

    def _clipped_delta(
        self, ref: list[np.ndarray], upd: list[np.ndarray]
    ) -> list[np.ndarray]:
        delta = [np.subtract(u, r, dtype=np.float64) for r, u in zip(ref, upd, strict=True)]
        if self.clip_mode == "l2":
            return clip_l2(delta, self.clip)
        return clip_elementwise(delta, self.clip)

    def _noise_sigma(self, n: int, spread: float) -> float:
        """Return the σ the release draws its noise with: :meth:`sigma`.

        The one hook between the release (and its metrics) and the noise scale, so that
        the privacy audits can inject a wrong σ here while the client's plan and the release
        invariant keep the calibrated one.
        """
        return self.sigma(n, spread)

    def _metrics(self, ref: Layers, upd: Layers, spread: float) -> dict[str, float]:
        """Return ``sigma`` (:meth:`_noise_sigma`) and the client's (ε, δ) target."""
        n = sum(u.size for u in upd)
        return {
            "sigma": self._noise_sigma(n, spread),
            "budget-epsilon": self.epsilon,
            "budget-delta": self.delta,
        }


class GaussianMechanism(_ClippedGaussianBase[GaussianReleaseEvent]):
    """Gaussian noise on the clipped update: ``reference + clip(δ) + N(0, σ²)``.

    σ = z·(Δ + spread), with ``spread`` the diameter of the hypotheses the server
    sent (an argument of :meth:`sanitize`), so that the guarantee holds although
    ``reference`` was chosen with private data (see the module notes).

    Parameters
    ----------
    clip : float
        C > 0: the L2 clipping norm (``clip_mode="l2"``) or the coordinate bound
        (``clip_mode="elementwise"``).
    clip_mode : {"l2", "elementwise"}
        Sensitivity 2C (L2) or 2C·√n (element-wise).
    epsilon, delta : float
        The client's target (ε, δ) after ``planned_releases`` releases.
    planned_releases : int
        How many releases the budget is spread over (>= 1).

    Notes
    -----
    The noise is drawn in float64; the exact real sum is rounded onto the public grid of σ
    (:mod:`mechanisms.grid`) and the release leaves as float32. ``noise_multiplier`` (z)
    is the calibrated σ/Δ; the event carries it.
    """

    name: ClassVar[str] = "gaussian"

    def _event(self, upd: Layers) -> GaussianReleaseEvent:
        """Return ``GaussianReleaseEvent(noise_multiplier=z)``."""
        return GaussianReleaseEvent(self.noise_multiplier)

    def _release(self, ref: Layers, upd: Layers, rng: Generator, spread: float) -> Layers:
        """Return ``reference + clip(updated − reference) + N(0, σ² I)`` in float64.

        σ = z·(Δ + ``spread``); ``spread`` is the hypotheses' diameter (0 for one).
        """
        clipped = self._clipped_delta(ref, upd)
        n = sum(u.size for u in upd)
        sigma = self._noise_sigma(n, spread)
        spacing = grid_spacing(sigma, n)
        noise = rng.standard_normal(n)
        noise *= sigma
        out = []
        offset = 0
        for r, d, u in zip(ref, clipped, upd, strict=True):
            layer = noise[offset:offset + u.size].reshape(u.shape)
            offset += u.size
            # The exact real sum hypothesis + clipped update + noise, rounded onto the public
            # grid of σ (mechanisms.grid): no float rounding of the sum reaches the release.
            out.append(on_grid([layer, r, d], spacing))
        return out
