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
* up to 60 rounds, stopped after 15 without a better validation loss, and the best
  validation round's hypotheses are the result.

Measured over real processes (docs/USAGE.md, "What convergence takes"): the quickstart ends
within 0.5 of both optima, for the paper's optima and for another well-separated pair. More
SuperNodes would need fewer rounds, but each round costs more: on 2 cores 20 real SuperNodes take
~8 s a round, 30 take ~13 s.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["QUICKSTART_RUN_CONFIG", "QUICKSTART_SUPERNODES", "quickstart_run_config"]

#: SuperNodes ``gpfl launch`` starts when ``--supernodes`` is not given.
QUICKSTART_SUPERNODES = 20
#: Run-config values ``gpfl launch`` asks for unless told otherwise (``--app-defaults`` drops
#: them); ``clients-per-round`` is every SuperNode (see `quickstart_run_config`).
QUICKSTART_RUN_CONFIG: dict[str, Any] = {
    "local-epochs": 5,
    "num-rounds": 60,
    "patience": 15,
}


def quickstart_run_config(supernodes: int, given: Mapping[str, Any]) -> dict[str, Any]:
    """Return the quickstart's run config for ``supernodes`` devices, ``given`` on top.

    Parameters
    ----------
    supernodes : int
        SuperNodes of the launch; all of them are sampled every round.
    given : Mapping
        The run config from the command line: its keys win.
    """
    return {**QUICKSTART_RUN_CONFIG, "clients-per-round": max(1, supernodes), **given}
