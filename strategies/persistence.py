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

What it keeps. A sum of n float64 per device would be 8 MB for a model of 10⁶ parameters (800 MB
for 100 devices, and as much JSON in every checkpoint). The residuals are computed and summed in
a fixed-size summary instead (:class:`strategies.geometry.CountSketch`): the identity for a
model of at most 4096 parameters (the sums are exact, as they always were), otherwise a
CountSketch of 4096 buckets, so each device costs at most 32 KiB. The offsets, the cluster's
coordinate-wise median and τ are then those of the summaries: the sketch is linear, so a
summary's offset is the offset's summary, but the median of summaries is not the summary of the
median (it is the same kind of robust estimate of the cluster's drift, per bucket instead of per
coordinate). The bound above is unchanged: the units are still zero-mean vectors of norm at
most 1, now in R^4096, and Pinelis' bound holds in any dimension. What a push shows is its
sketch, whose norm is the push's in expectation (E‖Sv‖² = ‖v‖²) and close to it for a push
spread over many coordinates. The buckets are drawn from the strategy's rng (its state, not a
draw: :func:`sketch_seed`) and kept in the checkpoint: a device that knew them could push along
the sketch's kernel unseen, so a deployment leaves the run's ``seed`` unset (the rng then comes
from the OS's entropy); an experiment that fixes it is reproducible and its sketch predictable.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from strategies.geometry import CountSketch, RoundGeometry, measure_round
from strategies.intake import Intake
from strategies.records import ClientRecord
from strategies.replies import NameBook

__all__ = ["Persistence", "residual_units", "set_aside_persistent", "sketch_seed"]

_LOG = logging.getLogger(__name__)


def sketch_seed(rng: np.random.Generator) -> int:
    """Return the seed of the persistence test's sketch, derived from ``rng``'s state.

    Nothing is drawn from ``rng`` (every other use of it sees the same numbers), and the seed
    differs from :func:`strategies.device_keys.seed_of`'s of the same state.
    """
    state = json.dumps(rng.bit_generator.state, sort_keys=True, default=str)
    digest = hashlib.sha256(b"persistence-sketch:" + state.encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def residual_units(released: np.ndarray, hypotheses: np.ndarray, *,
                   sketch: CountSketch | None = None,
                   geometry: RoundGeometry | None = None) -> np.ndarray:
    """Return each release's residual in its round, in units of the round's noise (norm ≤ 1).

    Parameters
    ----------
    released : np.ndarray
        (m, n): the round's screened releases.
    hypotheses : np.ndarray
        (k, n): the hypotheses the round sent.
    sketch : CountSketch, optional
        The summary the residuals are computed in (:class:`Persistence`'s); None: the full
        n coordinates, exactly.
    geometry : RoundGeometry, optional
        The round's measures of these rows (:func:`strategies.geometry.measure_round`), when
        it holds the sketch of ``sketch``; otherwise they are measured here.

    Returns
    -------
    np.ndarray
        (m, w) float64, w = n when the model has at most ``sketch.width`` parameters (or
        ``sketch`` is None), else ``sketch.width``: (offset − the median offset of the releases
        nearest the same hypothesis) / τ, shrunk to norm 1, τ the median residual norm of the
        round, all in the summary. Zero rows when the round's residuals are all zero (nothing
        to tell apart).
    """
    n = released.shape[1]
    if sketch is None:
        sketch = CountSketch(width=max(n, 1), seed=0)  # the identity
    if geometry is None or geometry.sketched is None or geometry.sketch != sketch:
        geometry = measure_round(released, hypotheses, sketch=sketch)
    assert geometry.sketched is not None
    m = geometry.releases
    labels = geometry.nearest()
    # The sketch is linear: the offset of a summary is the summary of the offset. The median
    # is robust statistics on float64 summaries (w ≤ 4096 columns), not on the release itself.
    offsets = geometry.sketched[:m] - geometry.sketched[m:][labels]
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

    Memory: per device one sum of at most :data:`strategies.geometry.SKETCH_WIDTH` float64
    (4096: 32 KiB, whatever the model's size; a model of n ≤ 4096 parameters is summed exactly,
    in n float64) and a count; a set-aside device keeps its sum and count (its statistic is
    logged) and a round number.

    Attributes
    ----------
    threshold : float
        c: a device is set aside once ‖S‖ ≥ c·√n (0: the test is off).
    sums : dict of str to np.ndarray
        S of each device (by name), in the summary of :attr:`sketch`.
    counts : dict of str to int
        n: the releases summed for each device.
    set_aside : dict of str to int
        The round each set-aside device was set aside in.
    sketch : CountSketch
        The summary residuals are computed and summed in (see the module notes); its seed is
        the server's, kept in the checkpoint.
    """

    threshold: float
    sums: dict[str, np.ndarray] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    set_aside: dict[str, int] = field(default_factory=dict)
    sketch: CountSketch = field(default_factory=CountSketch)

    def units(self, released: np.ndarray, hypotheses: np.ndarray,
              geometry: RoundGeometry | None = None) -> np.ndarray:
        """Return :func:`residual_units` of a round's releases, in this test's summary."""
        return residual_units(released, hypotheses, sketch=self.sketch, geometry=geometry)

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
                "counts": dict(self.counts), "set_aside": dict(self.set_aside),
                "sketch": {"width": self.sketch.width, "seed": self.sketch.seed}}

    def load_dict(self, data: Mapping[str, Any]) -> None:
        """Restore :meth:`to_dict`.

        A checkpoint written before the sums were sketched holds each sum in full: a sum
        longer than the sketch's width is sketched here (the sketch is linear, so it is the
        sum of the sketched residuals, up to their normalization in the full space).
        """
        sketch = data.get("sketch")
        if sketch is not None:
            self.sketch = CountSketch(width=int(sketch["width"]), seed=int(sketch["seed"]))
        self.sums = {}
        for key, value in data.get("sums", {}).items():
            total = np.asarray(value, dtype=np.float64)
            if total.size > self.sketch.width:
                total = self.sketch.apply(total[None, :])[0]
            self.sums[str(key)] = total
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
    units = persistence.units(intake.released, hypotheses, intake.geometry)
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
    intake.keep_rows(keep)
    intake.trust = np.array([persistence.trust(labels[i]) for i in keep], dtype=np.float64)
