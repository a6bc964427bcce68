"""The rules that span several settings, one function each.

A single setting's type, bounds and allowed values are its declaration's
(:mod:`settings.declarations`); what depends on two or more settings is here, and every reader
(the ServerApp's :class:`server.settings.RunSettings`, the strategy, ``gpfl launch``) calls
these functions rather than restating a rule. Each raises :class:`~settings.setting.SettingError`
naming the settings and their values.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from settings.setting import SettingError
from settings.values import MAX_COHORT

__all__ = [
    "NEEDS_SIGMA",
    "check_quorum",
    "check_run_rules",
    "check_secure_clusters",
    "check_sigma_declared",
    "check_sign_single_model",
    "declares_sigma",
]

#: Aggregations that weigh releases by the noise σ their clients declare.
NEEDS_SIGMA = ("weighted", "probability", "inverse-variance")


def check_sign_single_model(mechanism: str, num_hypotheses: int) -> None:
    """Refuse the sign mechanism with ``num-hypotheses > 1``: signs cannot be clustered."""
    if mechanism == "sign" and num_hypotheses != 1:
        raise SettingError(
            "the sign mechanism releases signs, which cannot be clustered: it needs "
            f"num-hypotheses=1, got num-hypotheses={num_hypotheses}"
        )


def declares_sigma(mechanism: str, calibration: str) -> bool:
    """Whether a release of this mechanism carries its noise σ in its public metrics.

    A neighbourhood-calibrated Laplace release does not: its σ would reveal ‖δ‖.
    """
    return mechanism in ("gaussian", "sign") or (
        mechanism == "laplace" and calibration == "fixed"
    )


def check_sigma_declared(aggregation: str, mechanism: str, calibration: str) -> None:
    """Refuse an aggregation that weighs by σ with a mechanism that does not declare σ."""
    if aggregation in NEEDS_SIGMA and not declares_sigma(mechanism, calibration):
        raise SettingError(
            f"aggregation={aggregation!r} weighs clients by their declared noise σ, which "
            f"mechanism={mechanism!r} (calibration={calibration!r}) does not declare "
            "(under the neighbourhood calibration σ would reveal ‖δ‖); use "
            "aggregation='mean', or a gaussian, sign or fixed-calibration laplace mechanism"
        )


def check_quorum(min_replies: int, clients_per_round: int) -> None:
    """Refuse ``min-replies`` above ``clients-per-round``, the most replies a round gets."""
    if min_replies > clients_per_round:
        raise SettingError(
            f"min-replies={min_replies} can never be reached with clients-per-round="
            f"{clients_per_round}: a round gets at most clients-per-round replies"
        )


#: What ``aggregation-privacy = "secure-clusters"`` needs: the server sees only sums, so what
#: works on individual releases (k-means, robust aggregators, the persistence test, budget
#: weights, re-seeding from releases) is not there, and the device's noise is a Gaussian share.
SECURE_CLUSTERS_NEEDS: dict[str, Any] = {
    "mechanism": "gaussian",
    "clip-mode": "l2",
    "aggregation": "mean",
    "cluster-aggregator": "mean",
    "persistence-threshold": 0.0,
    "reseed-after": 0,
}


def check_secure_clusters(values: Mapping[str, Any]) -> None:
    """Refuse a secure-clusters run with a setting that needs individual releases.

    Also: a round's cohort (``clients-per-round``) must reach ``min-cohort``, SecAgg+'s
    threshold, and stay within :data:`~settings.values.MAX_COHORT`.
    """
    if values.get("aggregation-privacy") != "secure-clusters":
        return
    for name, needed in SECURE_CLUSTERS_NEEDS.items():
        if values[name] != needed:
            raise SettingError(
                f"aggregation-privacy=secure-clusters needs {name}={needed!r} (the server sees "
                f"only per-cluster sums), got {name}={values[name]!r}")
    if values["client-epsilons"]:
        raise SettingError(
            "aggregation-privacy=secure-clusters needs every device to add the same noise "
            f"share: client-epsilons must be empty, got {values['client-epsilons']!r}")
    if values["clients-per-round"] > MAX_COHORT:
        raise SettingError(
            f"aggregation-privacy=secure-clusters: clients-per-round={values['clients-per-round']}"
            f" is above {MAX_COHORT}, the most devices one SecAgg+ sum can weigh (their weights "
            "add up within its modulus)")
    if values["clients-per-round"] < values["min-cohort"]:
        raise SettingError(
            f"aggregation-privacy=secure-clusters: clients-per-round={values['clients-per-round']} "
            f"is below min-cohort={values['min-cohort']}, SecAgg+'s threshold: no round could "
            "complete")


def check_run_rules(values: Mapping[str, Any]) -> None:
    """Apply every rule above to a run config already checked key by key."""
    check_sign_single_model(values["mechanism"], values["num-hypotheses"])
    check_sigma_declared(values["aggregation"], values["mechanism"], values["calibration"])
    check_quorum(values["min-replies"], values["clients-per-round"])
    check_secure_clusters(values)
