"""How the hypotheses move towards their clusters' means, and the re-seeding of a lost hypothesis.

Both are post-processing of the releases (and of the server's own validation): they read the
released vectors, this round's clustering and the strategy's records, send nothing to a device
and charge nothing, so no choice here can weaken any device's privacy.

The step (``server-update``), with ``c_j`` the mean of cluster j's releases this round and
``h_j`` hypothesis j:

``mean``
    the papers' Algorithm 1: ``h_j ← c_j``.
``step``
    a damped step ``h_j ← h_j + η (c_j − h_j)`` with ``η = server-step``.
``anneal``
    the full step (``η = 1``, the papers' update) until the server's validation loss has not
    improved for ``anneal-after`` consecutive validations; from that round ``s`` on,
    ``η_t = 1 / (1 + (t − s) / anneal-rounds)``. While the hypotheses travel towards their
    groups the loss keeps improving and the full step keeps them fast; once they only move
    around their optima the release noise dominates each step, and the decreasing step
    (Robbins-Monro: Σ η_t = ∞, Σ η_t² < ∞) averages it over more and more rounds. Without a
    validation (no ``evaluate_fn``) it stays the papers' update.

``plateau``
    the full step until the server's validation loss has not improved for ``anneal-after``
    consecutive validations; then the best-validated hypotheses are *restored* (the next round
    trains from them) and the step is multiplied by ``plateau-factor``; again at every later
    stall (the count restarts at each restore), down to :data:`MIN_PLATEAU_STEP`. It is the
    learning-rate schedule "reduce on plateau, restore the best weights" of centralized
    training, applied to the hypotheses: a noisy step that made them worse is undone instead of
    being averaged in, and the shrinking step averages the release noise over more and more
    rounds (docs/RESULTS.md, "Small federations", measures it against the others).

Why a plain mean random-walks: under the neighbourhood calibration a release carries noise of
expected norm ν‖δ‖, so a cluster mean of m releases moves its hypothesis by its update δ plus
noise of root-mean-square ν‖δ‖·√(1.5/m) (Gamma(2) radius, n = 2): at ν = 5 and m = 4, three
times the update itself. A step η scales that noise by η and the pull towards the optimum by
about η too, so near the optimum (where the noise is the larger part) a smaller step leaves a
smaller orbit, while far from it the step mostly costs speed.

Re-seeding (``reseed-after`` = R > 0): a hypothesis whose cluster held no release in each of
the last R rounds that changed the hypotheses is *dead* (no release lands near it: the
hypotheses have collapsed onto fewer groups than k). It is re-seeded by splitting the largest
cluster of this round: its hypothesis ``h`` and the dead one become ``h ∓ s·v``, with ``v`` the
principal axis of that cluster's releases and ``s`` their standard deviation along it. A
device of either group then picks the half on its own side. A hypothesis re-seeded gets R
rounds before it can be again (with k larger than the number of groups, a surplus hypothesis
is re-seeded every R rounds or so, and takes part of a group's devices).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from settings import SERVER_UPDATES, SETTINGS  # declared once, with the settings
from strategies.records import RoundRecord
from strategies.robust import clip_offsets, lower_median

__all__ = ["MIN_PLATEAU_STEP", "RESEEDED", "SERVER_UPDATES", "ServerUpdate", "anneal_start",
           "dead_hypotheses", "plateaus", "reseed", "split_cluster", "stall_rounds",
           "step_towards"]

_LOG = logging.getLogger(__name__)

# SERVER_UPDATES, the rules' names, is declared once with the setting (settings.declarations).

#: ``plateau``'s smallest step: below it the hypotheses would all but stop following their
#: clusters, and a group that drifts (new devices, new data) could no longer be followed.
MIN_PLATEAU_STEP = 0.02
#: What the log line of a re-seeding says (experiments count re-seedings by it).
RESEEDED = "re-seeded by splitting"


@dataclass(frozen=True)
class ServerUpdate:
    """The federation's choice of server update (see the module notes).

    Attributes
    ----------
    rule : str
        One of :data:`SERVER_UPDATES`.
    step : float
        η of ``step``, in (0, 1].
    anneal_after : int
        ``anneal``: validations without a new best loss before the step starts to decrease.
    anneal_rounds : float
        ``anneal``: τ, the rounds after which the step has halved (> 0).
    reseed_after : int
        Rounds without a release before a hypothesis is re-seeded (0 = never).
    plateau_factor : float
        ``plateau``: the step's factor at each stall, in (0, 1].

    Raises
    ------
    ValueError
        For a value out of range, naming the setting and the value.
    """

    rule: str = SETTINGS["server-update"].default
    step: float = SETTINGS["server-step"].default
    anneal_after: int = SETTINGS["anneal-after"].default
    anneal_rounds: float = SETTINGS["anneal-rounds"].default
    reseed_after: int = SETTINGS["reseed-after"].default
    plateau_factor: float = SETTINGS["plateau-factor"].default

    def __post_init__(self) -> None:
        if self.rule not in SERVER_UPDATES:
            raise ValueError(f"server-update must be one of {', '.join(SERVER_UPDATES)}; got "
                             f"server-update={self.rule!r}")
        if not (math.isfinite(self.step) and 0 < self.step <= 1):
            raise ValueError(f"server-step must be in (0, 1], got server-step={self.step!r}")
        if not (math.isfinite(self.plateau_factor) and 0 < self.plateau_factor <= 1):
            raise ValueError(f"plateau-factor must be in (0, 1], got plateau-factor="
                             f"{self.plateau_factor!r}")
        if not (math.isfinite(self.anneal_rounds) and self.anneal_rounds > 0):
            raise ValueError(f"anneal-rounds must be positive, got anneal-rounds="
                             f"{self.anneal_rounds!r}")
        for name, value, least in (("anneal-after", self.anneal_after, 1),
                                   ("reseed-after", self.reseed_after, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{name} must be an integer >= {least}, got {name}={value!r}")

    def eta(self, round: int, losses: Sequence[tuple[int, float | None]]) -> float:
        """Return the step of ``round`` from the ``(round, validation loss)`` before it."""
        if self.rule == "mean":
            return 1.0
        if self.rule == "step":
            return self.step
        if self.rule == "plateau":
            stalls, _ = plateaus(losses, self.anneal_after)
            return max(MIN_PLATEAU_STEP, self.plateau_factor ** stalls) if stalls else 1.0
        start = anneal_start(losses, self.anneal_after)
        return 1.0 if start is None else 1.0 / (1.0 + (round - start) / self.anneal_rounds)

    def apply(self, hypotheses: np.ndarray, means: np.ndarray, released: np.ndarray,
              labels: np.ndarray, history: Sequence[RoundRecord], round: int,
              reseeded: dict[int, int], inert: Callable[[int], int] | None = None
              ) -> tuple[np.ndarray, list[tuple[int, int]]]:
        """Return this round's new hypotheses and the splits made (``(live, dead)`` pairs).

        Parameters
        ----------
        hypotheses, means : np.ndarray
            (k, n) float32: the current hypotheses and this round's cluster means.
        released, labels : np.ndarray
            This round's releases (m, n) and the cluster of each (m,).
        history : sequence of RoundRecord
            The strategy's records of the rounds before this one.
        round : int
            This round.
        reseeded : dict of int to int
            The round each hypothesis was last re-seeded in; updated in place. The rounds up to
            a re-seeding count neither towards the hypothesis being dead again nor towards the
            annealing (after a split the hypotheses travel again with the full step).
        inert : callable, optional
            ``inert(m)``: the largest cluster of a round of m releases that leaves its
            hypothesis where it was (a robust aggregator's small-cluster rule,
            :func:`strategies.robust.trimmed`); such a cluster counts as empty for re-seeding.
        """
        new = step_towards(hypotheses, means, self.eta(round, _since_split(history, reseeded)))
        if self.reseed_after == 0:
            return new, []
        k = hypotheses.shape[0]
        rounds = [(r.round, r.cluster_sizes) for r in history if r.round > 0 and r.kept is None]
        rounds.append((round, np.bincount(labels, minlength=k).tolist()))
        dead = dead_hypotheses(rounds, self.reseed_after, reseeded, inert)
        if not dead:
            return new, []
        new, splits = reseed(new, released, labels, dead, robust=inert is not None)
        for live, gone in splits:
            reseeded[live] = reseeded[gone] = round
            _LOG.info("round %d: hypothesis %d drew no release that moves it for %d rounds; "
                      "%s hypothesis %d's cluster", round, gone, self.reseed_after, RESEEDED,
                      live)
        return new, splits


    def restores(self, history: Sequence[RoundRecord], reseeded: Mapping[int, int],
                 best_round: int | None) -> bool:
        """Whether ``plateau`` restores the best hypotheses after the last record of ``history``.

        Only when the last validation completed a stall, and the best round came after the
        last re-seeding (restoring hypotheses from before a split would undo it).
        """
        if self.rule != "plateau" or not history or best_round is None:
            return False
        if best_round < max(reseeded.values(), default=0):
            return False
        _, now = plateaus(_since_split(history, reseeded), self.anneal_after)
        if now:
            _LOG.info("round %d: validation stalled; the hypotheses of round %d are restored "
                      "and the step shrinks", history[-1].round, best_round)
        return now


def _since_split(history: Sequence[RoundRecord],
                 reseeded: Mapping[int, int]) -> list[tuple[int, float | None]]:
    """``(round, validation loss)`` of the records since the last re-seeding.

    The rounds up to a re-seeding count neither towards the annealing nor towards a plateau:
    after a split the hypotheses travel again with the full step.
    """
    last_split = max(reseeded.values(), default=0)
    return [(r.round, r.val_loss) for r in history if r.round >= last_split]


def plateaus(losses: Sequence[tuple[int, float | None]], patience: int) -> tuple[int, bool]:
    """Count the stalls of ``losses`` and say whether the last validation completed one.

    A stall is ``patience`` validations in a row without a new best loss, counted afresh after
    each stall (the hypotheses are then restored to the best ones, whose loss is not a new
    best either). Derived from the records alone, so a resumed run continues the same schedule.

    Returns
    -------
    tuple of (int, bool)
        The number of stalls, and whether the last validated entry completed one.
    """
    stalls = stall_rounds(losses, patience)
    # Only the last entry's own validation can restore (not an unvalidated round after it).
    return len(stalls), bool(stalls) and stalls[-1] == losses[-1][0]


def stall_rounds(losses: Sequence[tuple[int, float | None]], patience: int) -> list[int]:
    """Return the rounds that complete ``patience`` validations in a row without a new best.

    The count restarts after each such round. ``losses``: ``(round, validation loss)`` in
    order, ``None`` where a round was not validated (it does not count). A NaN loss is never a
    new best.
    """
    best, stale, stalls = math.inf, 0, []
    for t, loss in losses:
        if loss is None:
            continue
        if loss < best:
            best, stale = loss, 0
            continue
        stale += 1
        if stale >= patience:
            stalls.append(t)
            stale = 0
    return stalls


def anneal_start(losses: Sequence[tuple[int, float | None]], patience: int) -> int | None:
    """Return the round of the ``patience``-th validation in a row without a new best loss.

    Parameters
    ----------
    losses : sequence of (int, float or None)
        ``(round, validation loss)`` in order; ``None``: not validated that round.
    patience : int
        Validations without a new best loss that start the annealing.

    Returns
    -------
    int or None
        That round, or ``None`` if it has not come.
    """
    stalls = stall_rounds(losses, patience)
    return stalls[0] if stalls else None


def step_towards(hypotheses: np.ndarray, means: np.ndarray, eta: float) -> np.ndarray:
    """Return ``h + η (c − h)`` row by row, in float32 (``η = 1``: the means themselves).

    An empty cluster's mean is its hypothesis (:func:`strategies.aggregation.cluster_means`),
    so it stays where it is.
    """
    if eta == 1.0:
        return means
    return (hypotheses + np.float32(eta) * (means - hypotheses)).astype(np.float32)


def dead_hypotheses(rounds: Sequence[tuple[int, Sequence[int]]], after: int,
                    reseeded: Mapping[int, int] | None = None,
                    inert: Callable[[int], int] | None = None) -> list[int]:
    """Return the hypotheses whose cluster was empty in each of the last ``after`` rounds.

    Parameters
    ----------
    rounds : sequence of (int, sequence of int)
        ``(round, cluster sizes)`` of the rounds that changed the hypotheses, oldest first.
    after : int
        How many rounds make a hypothesis dead (0: none ever is).
    reseeded : dict of int to int, optional
        The round each hypothesis was last re-seeded in: only later rounds count for it.
    inert : callable, optional
        ``inert(m)``: a cluster of at most this many of a round's m releases counts as empty
        (it did not move its hypothesis). Under a robust aggregator a rogue's release keeps
        the hypothesis that no honest device chooses from ever being empty, and the small-cluster
        rule keeps it where it is: without this, it would never be re-seeded.
    """
    if after <= 0:
        return []
    reseeded = reseeded or {}
    k = len(rounds[-1][1]) if rounds else 0
    most = inert or (lambda m: 0)
    dead = []
    for j in range(k):
        since = reseeded.get(j, 0)
        recent = [(sizes[j], sum(sizes)) for t, sizes in rounds if t > since][-after:]
        if len(recent) == after and all(size <= most(m) for size, m in recent):
            dead.append(j)
    return dead


def split_cluster(released: np.ndarray, centre: np.ndarray, *, robust: bool = False
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Return two new centres ``centre ∓ s·v`` from a cluster's releases (at least two).

    ``v`` is the unit principal axis of the releases (their largest-variance direction) and
    ``s`` the standard deviation of the releases along it; the sign of ``v`` is fixed so that its
    largest-magnitude coordinate is positive (the result does not depend on the SVD's sign).
    ``robust``: each release's offset from ``centre`` is first clipped to the lower median of
    those offsets' norms, so that a minority of far releases (a rogue's, accepted by the
    screening at up to 1000 times the round's median distance) cannot throw both halves that
    far: without it, two rogues' releases in the cluster sent both hypotheses ~1,000 away.

    Returns
    -------
    tuple of np.ndarray
        ``(centre - s·v, centre + s·v)``, float32.
    """
    x = np.asarray(released, dtype=np.float64)
    if robust:
        c = np.asarray(centre, dtype=np.float64)
        offsets = x - c
        norms = np.linalg.norm(offsets, axis=1)
        x = c + clip_offsets(offsets, norms, lower_median(norms))
    centred = x - x.mean(axis=0)
    _, singular, vt = np.linalg.svd(centred, full_matrices=False)
    v = vt[0]
    if v[np.argmax(np.abs(v))] < 0:
        v = -v
    s = singular[0] / math.sqrt(x.shape[0] - 1)
    c = np.asarray(centre, dtype=np.float64)
    return (c - s * v).astype(np.float32), (c + s * v).astype(np.float32)


def reseed(hypotheses: np.ndarray, released: np.ndarray, labels: np.ndarray,
           dead: Sequence[int], *, robust: bool = False
           ) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """Re-seed each dead hypothesis by splitting the largest cluster of this round.

    Parameters
    ----------
    hypotheses : np.ndarray
        (k, n) float32: the hypotheses after this round's step.
    released, labels : np.ndarray
        This round's releases (m, n) and their clusters (m,).
    dead : sequence of int
        The dead hypotheses (:func:`dead_hypotheses`).
    robust : bool
        Split with clipped offsets (:func:`split_cluster`): under a robust cluster-aggregator.

    Returns
    -------
    new : np.ndarray
        (k, n) float32, a new matrix.
    splits : list of (int, int)
        ``(live, dead)`` for each split made: a cluster with fewer than two releases is not
        split, and each cluster is split at most once a round.
    """
    new = hypotheses.copy()
    sizes = np.bincount(labels, minlength=hypotheses.shape[0])
    splits: list[tuple[int, int]] = []
    for j in dead:
        live = int(np.argmax(sizes))
        if sizes[live] < 2:
            break
        new[live], new[j] = split_cluster(released[labels == live], hypotheses[live],
                                          robust=robust)
        sizes[live] = 0  # not split twice in one round
        splits.append((live, j))
    return new, splits
