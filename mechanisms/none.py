"""The no-privacy baseline: the trained model is released as it is."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from mechanisms._validation import check_generator, check_non_negative_finite
from mechanisms.base import Mechanism
from mechanisms.events import NonPrivateEvent


class NoMechanism(Mechanism):
    """Release ``updated`` unchanged (copies); no guarantee, ``NonPrivateEvent``, sigma 0.

    For baselines and debugging. A ledger with a cap refuses its events: no finite
    budget covers a release without noise; only a device that charges it with
    ``cap=None`` (it explicitly allows the non-private baseline) records it.
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
        spread: float = 0.0,
    ) -> list[np.ndarray]:
        """Return copies of ``updated`` (``spread`` is validated and ignored)."""
        check_generator(rng)
        check_non_negative_finite("spread", spread)
        _, upd = self._check(reference, updated)
        return [u.copy() for u in upd]

    def public_metrics(
        self,
        reference: Sequence[np.ndarray],
        updated: Sequence[np.ndarray],
        *,
        spread: float = 0.0,
    ) -> dict[str, float]:
        """Return ``sigma`` = 0 and a zero budget."""
        check_non_negative_finite("spread", spread)
        self._check(reference, updated)
        return {"sigma": 0.0, "budget-epsilon": 0.0, "budget-delta": 0.0}
