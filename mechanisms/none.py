"""The no-privacy baseline: the trained model is released as it is."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from mechanisms._validation import check_generator
from mechanisms.base import Mechanism
from mechanisms.events import NonPrivateEvent


class NoMechanism(Mechanism):
    """Release ``updated`` unchanged (copies); no guarantee, ``NonPrivateEvent``, sigma 0.

    For baselines and debugging. A ledger with a cap refuses its events: no finite
    budget covers a release without noise.
    """

    name: ClassVar[str] = "none"

    def __repr__(self) -> str:
        return "NoMechanism()"

    def event(
        self, reference: Sequence[np.ndarray], updated: Sequence[np.ndarray]
    ) -> NonPrivateEvent:
        """Return ``NonPrivateEvent()``."""
        self._check(reference, updated)
        return NonPrivateEvent()

    def sanitize(
        self,
        reference: Sequence[np.ndarray],
        updated: Sequence[np.ndarray],
        *,
        rng: np.random.Generator,
    ) -> list[np.ndarray]:
        """Return copies of ``updated``."""
        check_generator(rng)
        _, upd = self._check(reference, updated)
        return [u.copy() for u in upd]

    def public_metrics(
        self, reference: Sequence[np.ndarray], updated: Sequence[np.ndarray]
    ) -> dict[str, float]:
        """Return ``sigma`` = 0 and a zero budget."""
        self._check(reference, updated)
        return {"sigma": 0.0, "budget-epsilon": 0.0, "budget-delta": 0.0}
