"""What ``gpfl launch`` runs when it is told nothing: a federation that finds both groups.

The app's own run-config defaults (``pyproject.toml``) are the paper's setting (001 §4.1:
7 of 100 users a round, one local epoch). Under its privacy (Euclidean Laplace, ν = 5) every
release carries noise about 6× the size of the update it hides (E‖noise‖ = ν‖δ‖, Gamma(n)
radius), so an aggregate of 7 releases moves the hypotheses mostly at random and the groups
separate after ~250 rounds, far more than a first run should take.

The quickstart keeps that privacy and changes only what the method leaves free:

* every device takes part in every round (20 SuperNodes, ``clients-per-round`` = 20): the
  noise of a cluster's mean falls as 1/√m with m releases in it;
* five local epochs (``local-epochs`` = 5), so each release carries a larger step toward its
  group's optimum, for the same relative noise;
* the ``plateau`` server update (``server-update``): the papers' cluster mean until the
  server's validation loss stalls; then, at each stall, the best-validated hypotheses are
  restored and the step shrinks (``plateau-factor``), which averages the release noise over
  rounds; a hypothesis that no release reaches for 3 rounds is re-seeded (``reseed-after``).
  Both are post-processing of the releases: no device does or spends anything more;
* from 10 SuperNodes, robust clusters (``cluster-aggregator = clipped-mean``,
  ``persistence-threshold = 3``, :data:`ROBUST_CLUSTERS`): each
  release's offset clipped to its cluster's median distance, each device weighed by how
  persistently its releases lean one way, and set aside once that passes the threshold. With
  an adaptive rogue among 10 devices the papers' mean lost every run; these held in 7 of 10
  (one rogue) and 5 of 10 (two), and cost nothing measurable without rogues
  (docs/RESULTS.md, "rogue-devices"). Below 10 devices, where they were not measured, and in
  the app's defaults the clusters stay the papers' plain means: with 7 devices a round on
  rotated digits they cost accuracy (a cluster of two releases counts as too small to move,
  and re-seeding then splits the trained hypothesis; "digits-server-update");
* 60 rounds, or 100 below 16 SuperNodes (fewer releases a round average less noise), without
  early stopping; the best validation round's hypotheses are the result. At 20 devices the
  final hypotheses were within 0.5 of both optima by round 60 in 20 of 20 in-process runs
  (docs/RESULTS.md, "small-federations"). At 50 rounds 2 of 20 launches over real processes
  ended short, one of them still approaching; the ten rounds more cost each device 4 of
  d-privacy (24 in all).

Measured in process (docs/RESULTS.md, "Small federations") and over real processes
(docs/BENCHMARKS.md, "The default launch, ten times", which gives the round time; docs/USAGE.md,
"What convergence takes", explains the settings).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from settings.rules import SECURE_CLUSTERS_NEEDS

__all__ = ["QUICKSTART_RUN_CONFIG", "QUICKSTART_SUPERNODES", "ROBUST_CLUSTERS", "ROBUST_FROM",
           "quickstart_run_config"]

#: SuperNodes ``gpfl launch`` starts when ``--supernodes`` is not given.
QUICKSTART_SUPERNODES = 20
#: Run-config values ``gpfl launch`` asks for unless told otherwise (``--app-defaults`` drops
#: them); ``clients-per-round`` is every SuperNode (see `quickstart_run_config`).
QUICKSTART_RUN_CONFIG: dict[str, Any] = {
    "local-epochs": 5,
    "num-rounds": 60,
    "patience": 0,
    "server-update": "plateau",
    "reseed-after": 3,
}
#: From this many SuperNodes the quickstart adds :data:`ROBUST_CLUSTERS`: the smallest
#: federation they were measured at (docs/RESULTS.md, "rogue-devices": 10 devices).
ROBUST_FROM = 10
ROBUST_CLUSTERS: dict[str, Any] = {"cluster-aggregator": "clipped-mean",
                                   "persistence-threshold": 3.0}
#: Below this many SuperNodes the quickstart runs :data:`SMALL_FEDERATION_ROUNDS` rounds.
SMALL_FEDERATION = 16
SMALL_FEDERATION_ROUNDS = 100


def quickstart_run_config(supernodes: int, given: Mapping[str, Any]) -> dict[str, Any]:
    """Return the quickstart's run config for ``supernodes`` devices, ``given`` on top.

    Parameters
    ----------
    supernodes : int
        SuperNodes of the launch; all of them are sampled every round, below
        :data:`SMALL_FEDERATION` the run is :data:`SMALL_FEDERATION_ROUNDS` rounds long, and
        from :data:`ROBUST_FROM` its clusters are robust (:data:`ROBUST_CLUSTERS`).
    given : Mapping
        The run config from the command line: its keys win.
    """
    rounds = {"num-rounds": SMALL_FEDERATION_ROUNDS} if supernodes < SMALL_FEDERATION else {}
    robust = ROBUST_CLUSTERS if supernodes >= ROBUST_FROM else {}
    if given.get("aggregation-privacy") == "secure-clusters":
        # The server sees only sums: no robust clusters, no re-seeding from releases, and the
        # device's noise is a Gaussian share (settings.rules.SECURE_CLUSTERS_NEEDS).
        robust = {**SECURE_CLUSTERS_NEEDS}
    return {**QUICKSTART_RUN_CONFIG, **rounds, **robust, "clients-per-round": max(1, supernodes),
            **given}
