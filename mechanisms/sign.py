"""The stochastic-sign mechanism (Jin et al., as used by Wu et al. for non-IID data).

Each coordinate p of the clipped update is released as the sign of its Gaussian
release p + N(0, σ²), rounded exactly onto the release's public grid
(:mod:`mechanisms.grid`; a grid value of exactly 0 gives a fair coin): +1 with
probability Φ(p/σ) up to the grid's resolution, −1 otherwise. It is post-processing of
the Gaussian release, so it costs the same as the Gaussian release with the same σ and is accounted
the same way (``SignReleaseEvent(noise_multiplier)``).

Unlike the Gaussian release, the sign release is not centred on ``reference``: it
depends on the data only through clip(δ), which lies within Δ = 2C (or 2c·√n) of
any other clipped update whichever hypothesis was chosen, so the hypotheses'
``spread`` does not enter σ (it is validated and ignored).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from numpy.random import Generator

from mechanisms.base import Layers
from mechanisms.events import SignReleaseEvent
from mechanisms.gaussian import _ClippedGaussianBase
from mechanisms.grid import grid_spacing, on_grid


class StochasticSign(_ClippedGaussianBase[SignReleaseEvent]):
    """±1 per coordinate of the clipped update, +1 with probability Φ(p/σ).

    Same parameters, clipping and calibration as
    :class:`~mechanisms.gaussian.GaussianMechanism`. The release holds only ±1,
    in the dtype of each ``updated`` array; the server turns a majority vote of
    signs into a step of its own learning rate.

    ``spread`` is ignored: the release depends on the data only through clip(δ),
    which is within 2C (L2 clipping) of any other clipped update whatever
    hypothesis was chosen, so σ = z·Δ already covers the choice of hypothesis.
    """

    name: ClassVar[str] = "sign"
    _CENTRED_ON_REFERENCE: ClassVar[bool] = False

    def _event(self, upd: Layers) -> SignReleaseEvent:
        """Return ``SignReleaseEvent(noise_multiplier=z)``."""
        return SignReleaseEvent(self.noise_multiplier)

    def _release(self, ref: Layers, upd: Layers, rng: Generator, spread: float) -> Layers:
        """Return ±1 arrays shaped like ``updated`` (``spread`` is ignored).

        The sign of the Gaussian release of clip(δ) on its public grid
        (:mod:`mechanisms.grid`): +1 above zero, −1 below, and a fair coin where the grid
        value is exactly 0 (so that the law stays symmetric; post-processing either way).
        """
        clipped = self._clipped_delta(ref, upd)
        n = sum(u.size for u in upd)
        sigma = self._noise_sigma(n, spread)
        spacing = grid_spacing(sigma, n)
        noise = rng.standard_normal(n)
        noise *= sigma
        coin = rng.random(n) < 0.5
        out = []
        offset = 0
        for d, u in zip(clipped, upd, strict=True):
            layer = noise[offset:offset + u.size].reshape(u.shape)
            ties = coin[offset:offset + u.size].reshape(u.shape)
            offset += u.size
            value = on_grid([layer, d], spacing)  # its sign is the grid step's
            out.append(np.where(value > 0, 1.0, np.where(value < 0, -1.0,
                                                         np.where(ties, 1.0, -1.0))))
        return out
