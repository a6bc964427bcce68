"""The device's budget as its owner reads it: one figure per family, its cap and what is left.

The ledger composes each family in its own unit (:mod:`mechanisms.accountant`); the device's
policy caps each family with its own setting (:mod:`client.policy`). Both the device's round
line (:mod:`client.numpy_client`) and ``gpfl ledger`` (:mod:`client.ledger_view`) state them
through this module, so that the two name a family, its unit and its cap in the same words.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mechanisms.accountant import Spend

__all__ = ["FAMILIES", "Family", "budget_text", "family_of", "remaining"]


@dataclass(frozen=True)
class Family:
    """One event family of the ledger: the unit its cost is counted and capped in.

    Attributes
    ----------
    name : str
        The family as the ledger's events name it (``PrivacyEvent.family``).
    label : str
        What the releases of the family are, for people.
    cap_setting : str
        The device setting that caps it (:mod:`settings.schema`).
    """

    name: str
    label: str
    cap_setting: str

    def unit(self, delta: float) -> str:
        """Return the family's unit; the ε of the (ε, δ) families is stated at ``delta``."""
        if self.name == "d-privacy":
            return "d-privacy"
        if self.name == "rdp":
            return f"epsilon at delta={delta:g}"
        return f"record-epsilon at delta={delta:g}"

    def spent(self, spend: Spend) -> float:
        """Return this family's figure of ``spend`` (the one its cap is compared with)."""
        if self.name == "d-privacy":
            return float(spend.d_privacy)
        if self.name == "rdp":
            # The charged ε: the smaller of RDP's and PLD's, as the accountant caps it.
            return float(spend.epsilon)
        return float(spend.record_epsilon)


#: The capped families, in the order the ledger's totals list them.
FAMILIES: tuple[Family, ...] = (
    Family("d-privacy", "Laplace releases, the sum of epsilon*r", "cap-d-privacy"),
    Family("rdp", "Gaussian and sign releases", "cap-epsilon"),
    Family("record", "record-level DP-SGD releases", "cap-record-epsilon"),
)

_BY_NAME = {family.name: family for family in FAMILIES}


def family_of(name: str) -> Family | None:
    """Return the capped family ``name``; ``None`` for ``none`` (no noise: no unit, no cap)."""
    return _BY_NAME.get(name)


def remaining(spent: float, cap: float | None) -> float | None:
    """Return what is left of ``cap`` after ``spent`` (never below 0); ``None`` for no cap."""
    if cap is None:
        return None
    return max(cap - spent, 0.0)


def budget_text(spent: float, cap: float | None) -> str:
    """Return ``"spent S of cap C, L left"`` (or ``"spent S, no cap"``) for a log line."""
    left = remaining(spent, cap)
    if cap is None or left is None:
        return f"spent {_g(spent)}, no cap"
    return f"spent {_g(spent)} of cap {_g(cap)}, {_g(left)} left"


def _g(value: float) -> str:
    # Six significant digits, as the ledger's totals print them; an infinity stays readable.
    return f"{value:.6g}" if math.isfinite(value) else str(value)
