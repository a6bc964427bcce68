"""The stochastic-sign mechanism (Jin et al., as used by Wu et al. for non-IID data).

Each coordinate p of the clipped update is released as +1 with probability
Φ(p/σ) and −1 otherwise. That is exactly the distribution of
sign(p + N(0, σ²)): the sign of a Gaussian release, i.e. post-processing of it,
so it costs the same as the Gaussian release with the same σ and is accounted
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
        """Return ±1 arrays shaped like ``updated`` (``spread`` is ignored)."""
        # scipy.special costs ~0.4 s to import; only this mechanism needs it.
        from scipy.special import ndtr

        clipped = self._clipped_delta(ref, upd)
        n = sum(u.size for u in upd)
        sigma = self._noise_sigma(n, spread)
        uniform = rng.random(n)
        out = []
        offset = 0
        for d, u in zip(clipped, upd, strict=True):
            draw = uniform[offset:offset + u.size].reshape(u.shape)
            offset += u.size
            plus = draw < ndtr(d / sigma)
            out.append(np.where(plus, 1.0, -1.0))
        return out
