"""Across rounds: a device whose releases lean the same way round after round is set aside.

Under local noise no single round tells a rogue from an honest device: at ν = 5 an honest
release is its update plus about five times as much noise, and a rogue that stays inside that
spread pulls its hypothesis as hard as the cluster's honest updates together
(:mod:`strategies.robust`). What tells them apart is *time*: each honest release carries noise
drawn afresh by the device, so its deviations from its cluster average out over rounds; a push
does not.

For every device (by ``client-name``) the server keeps S = Σ u over the device's releases, where
u is the release's *residual* in its round: its offset from the nearest hypothesis the round
sent, minus the coordinate-wise median offset of the releases nearest that hypothesis (the
cluster's common drift), divided by the round's median residual norm τ and shrunk to norm at
most 1. For independent zero-mean vectors of norm at most 1, ‖S‖ ≥ c·√n has probability at most
2·exp(−c²/2) in any dimension (Pinelis 1994), n the device's releases. A device whose ‖S‖
reaches ``persistence-threshold`` · √n is *set aside*: its release of that round and every
later one are left out of the clusters, and it is not asked again (its further releases would
be charged for nothing). A device can reach the bound only once n > c², since ‖S‖ ≤ n.

Before a device is set aside, its release weighs ``trust`` = 1 − (‖S‖ / (c·√n))² in its
cluster (``mean`` and ``clipped-mean``; :meth:`Persistence.trust`), with S and n including the
round's own release, so a release that leans further costs its device weight in that same round.
An honest device's statistic stays near 1 (‖S‖²/n is about the mean squared unit), a weight of
about 0.9 at c = 3 that every honest device shares; a device that keeps its statistic at z gets
weight 1 − (z/c)².

What it bounds. A device that knows the rule keeps ‖S‖ below c·√n: the part of its releases
that leans one way sums to at most c·√n·τ over n rounds, the same order as the honest noise of
one device over those rounds, so its average push per round falls as c·τ/√n. With the trust
weight, what it moves is its push times its weight, (1 − (z/c)²)·z·√n·τ at most, largest at
z = c/√3: 0.38·c·√n·τ, as if the threshold were 0.38·c, while honest devices keep most of their
weight. Before n reaches c² nothing is set aside, but the weight already applies.

What it costs. Honest residuals are not exactly zero-mean: a device whose data differ from its
cluster's pulls the same way every round too, by its share of the heterogeneity. The statistic
is normalized by the round's noise, so that drift is ~ (heterogeneity / noise) per round: a
device far from its cluster at little noise can be set aside. docs/RESULTS.md ("Rogue
devices") measures how often honest devices are. The residuals are post-processing of the
releases the server holds: nothing is sent to a device, nothing is charged.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from strategies.clustering import nearest_hypothesis
from strategies.intake import Intake
from strategies.records import ClientRecord
from strategies.replies import NameBook

__all__ = ["Persistence", "residual_units", "set_aside_persistent"]

_LOG = logging.getLogger(__name__)


def residual_units(released: np.ndarray, hypotheses: np.ndarray) -> np.ndarray:
    """Return each release's residual in its round, in units of the round's noise (norm ≤ 1).

    Parameters
    ----------
    released : np.ndarray
        (m, n): the round's screened releases.
    hypotheses : np.ndarray
        (k, n): the hypotheses the round sent.

    Returns
    -------
    np.ndarray
        (m, n) float64: (offset − the median offset of the releases nearest the same
        hypothesis) / τ, shrunk to norm 1, τ the median residual norm of the round. Zero rows
        when the round's residuals are all zero (nothing to tell apart).
    """
    rows = released.astype(np.float64)
    labels = nearest_hypothesis(released, hypotheses)
    offsets = rows - hypotheses[labels].astype(np.float64)
    residuals = np.empty_like(offsets)
    for j in np.unique(labels):
        members = labels == j
        residuals[members] = offsets[members] - np.median(offsets[members], axis=0)
    norms = np.linalg.norm(residuals, axis=1)
    tau = float(np.median(norms)) if norms.size else 0.0
    if not tau > 0 or not math.isfinite(tau):
        return np.zeros_like(residuals)
    return residuals / np.maximum(norms / tau, 1.0)[:, None] / tau


@dataclass
class Persistence:
    """Each device's summed residual units, and the devices set aside.

    Attributes
    ----------
    threshold : float
        c: a device is set aside once ‖S‖ ≥ c·√n (0: the test is off).
    sums : dict of str to np.ndarray
        S of each device (by name).
    counts : dict of str to int
        n: the releases summed for each device.
    set_aside : dict of str to int
        The round each set-aside device was set aside in.
    """

    threshold: float
    sums: dict[str, np.ndarray] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    set_aside: dict[str, int] = field(default_factory=dict)

    def statistic(self, name: str, unit: np.ndarray | None = None) -> float:
        """Return ‖S‖ / √n of ``name`` (with ``unit`` added as one more release)."""
        total = self.sums.get(name)
        count = self.counts.get(name, 0)
        if unit is not None:
            total = unit if total is None else total + unit
            count += 1
        if total is None or count == 0:
            return 0.0
        return float(np.linalg.norm(total)) / math.sqrt(count)

    def trust(self, name: str, unit: np.ndarray | None = None) -> float:
        """Return the weight of ``name``'s release in its cluster: 1 − (‖S‖ / (c·√n))², ≥ 0.

        With ``unit`` added as one more release, as in :meth:`statistic`. 1 when the test is
        off or nothing is summed yet (see the module notes).
        """
        if self.threshold <= 0:
            return 1.0
        return max(0.0, 1.0 - (self.statistic(name, unit) / self.threshold) ** 2)

    def update(self, server_round: int, names: Sequence[str], units: np.ndarray) -> list[str]:
        """Add one round's residual units; return the devices set aside by it.

        ``names[i]`` released row ``i`` of ``units`` (:func:`residual_units`). Devices already
        set aside are not summed (their rows should not reach here).
        """
        newly: list[str] = []
        if self.threshold <= 0:
            return newly
        for name, unit in zip(names, units, strict=True):
            if name in self.set_aside:
                continue
            self.sums[name] = self.sums.get(name, 0.0) + unit
            self.counts[name] = self.counts.get(name, 0) + 1
            if self.statistic(name) >= self.threshold:
                self.set_aside[name] = server_round
                newly.append(name)
        return newly

    def to_dict(self) -> dict[str, Any]:
        """Return the state as plain JSON values (for a checkpoint)."""
        return {"sums": {k: v.tolist() for k, v in self.sums.items()},
                "counts": dict(self.counts), "set_aside": dict(self.set_aside)}

    def load_dict(self, data: Mapping[str, Any]) -> None:
        """Restore :meth:`to_dict`."""
        self.sums = {str(k): np.asarray(v, dtype=np.float64)
                     for k, v in data.get("sums", {}).items()}
        self.counts = {str(k): int(v) for k, v in data.get("counts", {}).items()}
        self.set_aside = {str(k): int(v) for k, v in data.get("set_aside", {}).items()}


def set_aside_persistent(server_round: int, intake: Intake, hypotheses: np.ndarray,
                         persistence: Persistence, names: NameBook,
                         record: Callable[[str], ClientRecord]) -> None:
    """Sum the round's residuals; drop the rows of devices set aside from ``intake``.

    A device set aside this round loses this round's release too; each is logged and listed in
    ``intake.dropped`` with the statistic that set it aside.
    """
    if persistence.threshold <= 0 or intake.released.shape[0] == 0:
        return
    labels = [names.label(cid) for cid in intake.cids]
    units = residual_units(intake.released, hypotheses)
    newly = set(persistence.update(server_round, labels, units))
    keep = [i for i, name in enumerate(labels) if name not in persistence.set_aside]
    for i, (cid, name) in enumerate(zip(intake.cids, labels, strict=True)):
        if name in newly:
            reason = (f"set aside: its releases lean one way round after round "
                      f"(‖S‖/√n = {persistence.statistic(name):.2f} ≥ persistence-threshold="
                      f"{persistence.threshold:g} after {persistence.counts[name]} releases)")
            intake.dropped.append((name, reason))
            record(cid).dropped += 1
            _LOG.warning("round %d: %s %s; not asked again", server_round, name, reason)
        elif i not in keep:
            intake.dropped.append((name, "set aside in an earlier round"))
            record(cid).dropped += 1
    intake.released = intake.released[keep]
    intake.sigmas = intake.sigmas[keep]
    intake.cids = [intake.cids[i] for i in keep]
    intake.trust = np.array([persistence.trust(labels[i]) for i in keep], dtype=np.float64)
