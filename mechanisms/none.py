"""The no-privacy baseline: the trained model is released as it is."""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from numpy.random import Generator

from mechanisms.base import Layers, Mechanism
from mechanisms.events import NonPrivateEvent


class NoMechanism(Mechanism[NonPrivateEvent]):
    """Release ``updated`` unchanged (copies); no guarantee, ``NonPrivateEvent``, sigma 0.

    For baselines and debugging. A ledger with a cap refuses its events: no finite
    budget covers a release without noise; only a device that charges it with
    ``cap=None`` (it explicitly allows the non-private baseline) records it.
    """

    name: ClassVar[str] = "none"

    def __repr__(self) -> str:
        return "NoMechanism()"

    def _event(self, upd: Layers) -> NonPrivateEvent:
        """Return ``NonPrivateEvent()``."""
        return NonPrivateEvent()

    def _release(self, ref: Layers, upd: Layers, rng: Generator, spread: float) -> Layers:
        """Return copies of ``updated`` (``spread`` is validated and ignored)."""
        return [u.astype(np.float64) for u in upd]

    def _metrics(self, ref: Layers, upd: Layers, spread: float) -> dict[str, float]:
        """Return ``sigma`` = 0 and a zero budget."""
        return {"sigma": 0.0, "budget-epsilon": 0.0, "budget-delta": 0.0}
