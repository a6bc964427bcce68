"""When a run ends ``diverged``: its hypotheses left what the devices or the validation supports.

Two triggers, both read from what the server already holds: no device is asked anything more
and nothing is charged, so neither can weaken a device's privacy (they only stop a run).

refused
    At least half of a round's answering devices refused the hypotheses, values beyond their
    own ``max-parameter`` (:func:`strategies.intake.pushed_away`).
validation
    The last ``divergence-validations`` validations in a row each gave a loss that is not finite
    or above ``divergence-factor`` times the loss of the initial hypotheses (round 0)
    (:meth:`Divergence.check`). A device may keep a large ``max-parameter`` (the default is
    1e6), and a rogue that stays under it can still carry the hypotheses far beyond anything
    the validation data supports: the first trigger then never fires.

Why relative to round 0: the initial hypotheses are the task's untrained model, whatever the
task and its loss (squared error, RMSE, cross-entropy): hypotheses many times worse than knowing
nothing, validation after validation, are no longer being trained. Why several validations in a
row: honest noise can make one validation bad (a 4-device federation at ν = 5 once validated at
42 x its initial loss, and was back under 5 x the next round); what a rogue that keeps pushing
does is sustained. Honest runs measured in process with the real client (the synthetic task at
ν = 5, k = 2, 4 to 20 devices; the digits task, k = 1 and 2): docs/FAULTS.md gives the numbers.

Either trigger names the devices whose accepted releases lay, on average, farthest from their
hypothesis relative to their round's median distance (``ClientRecord.pull``): a device that
pushes the hypotheses away releases far from them round after round.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import islice

import numpy as np

from settings import SETTINGS
from strategies.records import ClientRecord, RoundRecord

__all__ = ["Divergence", "pullers"]

_LOG = logging.getLogger(__name__)

#: A device is named when its mean pull passes this many times the devices' median (or 1).
PULL_FACTOR = 3.0
#: At most this many devices are named.
NAMED = 10


def pullers(clients: Mapping[str, ClientRecord]) -> str:
    """Name the devices whose accepted releases pulled hardest, with their mean pull.

    A device's mean pull is its ``pull`` over its accepted releases: about 1 for an honest
    device. Named: those above :data:`PULL_FACTOR` times the larger of 1 and the median mean
    pull, hardest first.
    """
    pulls = {record.name or f"node {record.cid}": record.pull / record.participations
             for record in clients.values() if record.participations}
    typical = float(np.median(list(pulls.values()))) if pulls else 0.0
    named = sorted((name for name, pull in pulls.items() if pull > PULL_FACTOR * max(typical, 1.0)),
                   key=lambda name: -pulls[name])
    if not named:
        return "no device in particular (every accepted release lay near the median)"
    return ", ".join(f"{name} ({pulls[name]:.3g} x the median distance on average)"
                     for name in named[:NAMED])


@dataclass(frozen=True)
class Divergence:
    """The validation trigger: a loss beyond ``factor`` x the initial one, ``validations`` times.

    Parameters
    ----------
    factor : float
        ``divergence-factor``: how many times the round-0 validation loss a loss may reach
        (0: the trigger is off). Without a finite, positive round-0 loss only non-finite
        losses count.
    validations : int
        ``divergence-validations``: how many validations in a row must be beyond it.

    Raises
    ------
    SettingError
        If a value is outside its declared range (the message names the setting).
    """

    factor: float = SETTINGS["divergence-factor"].default
    validations: int = SETTINGS["divergence-validations"].default

    def __post_init__(self) -> None:
        # The bounds are the settings' declarations; a NumPy scalar is read as its value.
        for name, key in (("factor", "divergence-factor"),
                          ("validations", "divergence-validations")):
            value = getattr(self, name)
            value = value.item() if isinstance(value, np.generic) else value
            object.__setattr__(self, name, SETTINGS[key].parse(value))

    def check(self, history: Sequence[RoundRecord],
              clients: Mapping[str, ClientRecord]) -> str | None:
        """Why the run diverged after the last validation in ``history``, or None.

        Parameters
        ----------
        history : sequence of RoundRecord
            The run's records, round 0 (the initial hypotheses' validation) first.
        clients : mapping of str to ClientRecord
            The devices' records, whose ``pull`` names the devices that moved the hypotheses.
        """
        if self.factor == 0 or not history or history[-1].val_loss is None:
            return None
        initial = next((r.val_loss for r in history if r.round == 0), None)
        usable = initial is not None and math.isfinite(initial) and initial > 0
        bound = self.factor * initial if usable and initial is not None else math.inf
        recent = list(islice((r for r in reversed(history)
                              if r.round > 0 and r.val_loss is not None), self.validations))
        # A NaN compares false with everything: "not finite" is tested first.
        if len(recent) < self.validations or not all(
                r.val_loss is not None and (not math.isfinite(r.val_loss) or r.val_loss > bound)
                for r in recent):
            return None
        losses = ", ".join(f"{r.val_loss:.4g} (round {r.round})" for r in reversed(recent))
        limit = (f"not finite or above {self.factor:g} x the initial hypotheses' loss "
                 f"{initial:.4g}" if usable and initial is not None else "not finite")
        text = (f"round {history[-1].round}: the hypotheses left the range the validation data "
                f"supports: the last {self.validations} validation losses were {limit} "
                f"(divergence-factor, divergence-validations): {losses}; the accepted releases "
                f"that pulled hardest came from {pullers(clients)}")
        _LOG.error("%s; the run stops here", text)
        return text
