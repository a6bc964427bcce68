"""What a run will cost each device, known before round 1: the launch's budget table.

A local launch plays its devices' owners, so it can resolve each device's settings exactly as the
device will (:meth:`client.settings.ClientSettings.resolve`: the run config's request bounded by
the device's policy), build the mechanism the device will build
(:func:`client.numpy_client.build_mechanism`) and ask it for the event of one release, from the
task's shapes alone (``Mechanism.event``: no data, no noise). How many releases the device's cap
allows is then counted with the ledger's own check (:func:`mechanisms.accountant.check_cap`),
charging the event again and again in memory after what the device's ledger already holds: the
same arithmetic that will decline the device's round, so the table cannot disagree with it.

The ledger's unit is the event's family's: Σ ε·r for d-privacy (a Laplace release under the
neighbourhood calibration costs n/ν), the RDP-composed ε at the device's δ for Gaussian and sign
releases (not additive: one release's cost is the ε of one release alone).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from client.numpy_client import build_mechanism
from client.policy import DevicePolicy, PolicyDecline, PolicyError
from client.record_release import plan_record_release
from client.settings import ClientSettings
from mechanisms import LedgerCorruptError, PrivacyLedger
from mechanisms.accountant import BudgetExceededError, LedgerEntry, check_cap, compose
from mechanisms.events import PrivacyEvent

__all__ = ["DeviceBudget", "budget_lines", "meaning", "plan_budgets", "shapes_of", "weakness"]

#: The setting that caps each family, as a device owner names it.
CAP_SETTING = {"d-privacy": "cap-d-privacy", "rdp": "cap-epsilon",
               "record": "cap-record-epsilon"}

#: The run-config change that makes one release of each family cheaper.
CHEAPER = {"cap-d-privacy": "raise noise-multiplier", "cap-epsilon": "lower epsilon",
           "cap-record-epsilon": "raise record-noise-multiplier"}


@dataclass(frozen=True)
class DeviceBudget:
    """One device's budget for the run, as its own settings and ledger make it.

    Attributes
    ----------
    name : str
        The device's ``client-name``.
    unit : str
        Its ledger's unit for this run's releases.
    cost : float or None
        What one release costs in ``unit`` (for RDP: the ε of one release alone).
    cap : float or None
        The device's cap in ``unit`` (``None``: uncapped).
    cap_setting : str or None
        The setting that sets ``cap``.
    spent : float
        What its ledger already holds in ``unit``.
    releases : int or None
        How many more releases the cap allows, counted up to ``rounds`` (``None``: not
        bounded, or not planned: see ``note``).
    rounds : int
        The rounds the run asks for (a device can be asked in each).
    note : str
        Why nothing is planned (the device declines the run, or its ledger is unreadable).
    """

    name: str
    unit: str
    cost: float | None
    cap: float | None
    cap_setting: str | None
    spent: float
    releases: int | None
    rounds: int
    note: str = ""
    family: str = ""
    parameters: int = 0

    @property
    def covers(self) -> bool:
        """Whether the cap pays a release in every round the run asks for."""
        return self.releases is None or self.releases >= self.rounds

    def to_dict(self) -> dict[str, Any]:
        """Return the plain JSON form (``summary.json``'s ``budget_plan``)."""
        said, warned = meaning(self), weakness(self)
        return {"unit": self.unit, "cost": self.cost, "cap": self.cap,
                "cap_setting": self.cap_setting, "spent": self.spent,
                "releases": self.releases, "rounds": self.rounds, "covers": self.covers,
                **({"note": self.note} if self.note else {}),
                **({"meaning": said} if said else {}),
                **({"warning": warned} if warned else {})}


def _unit(family: str, delta: float) -> str:
    return {"d-privacy": "d-privacy (sum of epsilon*r)",
            "rdp": f"RDP epsilon at delta={delta:g}",
            "record": f"record-level RDP epsilon at delta={delta:g}"}.get(family, "none")


def _spend_of(family: str, entries: list[LedgerEntry], delta: float) -> float:
    spend = compose(entries, declines=0, delta=delta)
    return {"d-privacy": spend.d_privacy, "rdp": spend.epsilon,
            "record": spend.record_epsilon}.get(family, 0.0)


def _plan_one(settings: ClientSettings, event: PrivacyEvent, rounds: int) -> DeviceBudget:
    privacy = settings.privacy
    delta = privacy.ledger_delta
    family = event.family
    cap = privacy.cap(family)
    unit = _unit(family, delta)
    try:
        held = list(PrivacyLedger(settings.ledger_path, delta=delta).entries())
    except (LedgerCorruptError, OSError, ValueError) as err:
        return DeviceBudget(settings.name, unit, None, cap, CAP_SETTING.get(family), 0.0, None,
                            rounds, note=f"its ledger {settings.ledger_path} is unusable: {err}")
    spent = _spend_of(family, held, delta)
    one = LedgerEntry(event, "", None)
    if cap is None:  # mechanism "none" with no cap: nothing bounds it
        return DeviceBudget(settings.name, unit, None, None, None, spent, None, rounds)
    cost = _spend_of(family, [one], delta)
    entries = list(held)
    releases = 0
    # The ledger's own check, release after release, up to what the run can ask for.
    while releases < rounds:
        try:
            check_cap(entries, event, cap=cap, delta=delta, ledger=settings.ledger_path)
        except BudgetExceededError:
            break
        entries.append(one)
        releases += 1
    return DeviceBudget(settings.name, unit, cost, cap, CAP_SETTING.get(family), spent,
                        releases, rounds, family=family)


def _event(settings: ClientSettings, zeros: list[np.ndarray], hypotheses: int) -> PrivacyEvent:
    """Return the event one release of the device will charge, from public values only.

    A record-level (DP-SGD) release's event is the device's own plan of it
    (:func:`client.record_release.plan_record_release`: sampling rate, steps, noise and the
    noisy choice among ``hypotheses``), declined there as the device would decline it.
    """
    if settings.privacy.mechanism == "dpsgd":
        return plan_record_release(settings, [zeros] * hypotheses).event
    if settings.secure:
        # A share of a secure sum: the same multiplier, charged by RDP alone.
        from client.secure import plan_share
        from server.secure_round import TERMS

        return plan_share(settings, [zeros] * hypotheses, TERMS).event
    return build_mechanism(settings.privacy).event(zeros, zeros)


def plan_budgets(run_config: Mapping[str, Any], nodes: Mapping[int, Mapping[str, Any]],
                 shapes: list[tuple[int, ...]], done: int = 0,
                 hypotheses: int = 1) -> list[DeviceBudget]:
    """Return each device's budget for the run, in SuperNode order.

    Parameters
    ----------
    run_config : Mapping[str, Any]
        The run config the devices receive.
    nodes : Mapping[int, Mapping[str, Any]]
        Each SuperNode's node config, with its ``policy-file``.
    shapes : list of tuple of int
        The shapes of one hypothesis's layers (the task's model).
    done : int
        Rounds a resumed run has already done (they are not asked again).
    hypotheses : int
        How many hypotheses each instruction carries (``num-hypotheses``): a record-level
        release's noisy choice among them is charged with it.
    """
    zeros = [np.zeros(shape, dtype=np.float32) for shape in shapes]
    rounds = max(0, int(run_config.get("num-rounds", 0) or 0) - done)
    plans: list[DeviceBudget] = []
    cache: dict[tuple[Any, ...], PrivacyEvent] = {}
    for _, node in sorted(nodes.items()):
        try:
            policy = DevicePolicy.load(dict(node))
            settings = ClientSettings.resolve(dict(run_config), policy)
        except (PolicyDecline, PolicyError) as err:
            name = str(node.get("client-name") or f"client-{node.get('partition-id')}")
            plans.append(DeviceBudget(name, "none", None, None, None, 0.0, None, rounds,
                                      note=f"declines the run: {err}"))
            continue
        key = (settings.privacy, settings.aggregation_privacy, settings.min_cohort)
        if key not in cache:
            try:
                cache[key] = _event(settings, zeros, hypotheses)
            except PolicyDecline as err:
                plans.append(DeviceBudget(settings.name, "none", None, None, None, 0.0, None,
                                          rounds, note=f"declines the run: {err}"))
                continue
        plan = _plan_one(settings, cache[key], rounds)
        plans.append(replace(plan, parameters=sum(int(np.prod(s)) for s in shapes)))
    return plans


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.6g}"


def budget_lines(plans: list[DeviceBudget]) -> list[str]:
    """Say, a line per group of devices alike, what a release costs and what the caps pay.

    A device whose cap cannot pay every round gets a second line naming the setting to change.
    """
    groups: dict[tuple[Any, ...], list[str]] = {}
    for p in plans:
        key = (p.unit, p.cost, p.cap, p.cap_setting, p.spent, p.releases, p.rounds, p.note)
        groups.setdefault(key, []).append(p.name)
    lines = []
    for (unit, cost, cap, setting, spent, releases, rounds, note), names in groups.items():
        who = _names(names)
        if note:
            lines.append(f"gpfl: budget of {who}: not planned: {note}")
            continue
        paid = "every one" if releases is None else f"{releases}"
        lines.append(
            f"gpfl: budget of {who}: one release costs {_number(cost)} {unit}; "
            f"{setting}={_number(cap)} (spent {_number(spent)}) pays {paid} more; "
            f"the run asks for {rounds} rounds")
        plan = next(p for p in plans if p.name == names[0])
        said, warned = meaning(plan), weakness(plan)
        if said:
            lines.append(f"gpfl: budget of {who}, in words: {said}")
        if warned:
            lines.append(f"gpfl: WARNING for {who}: {warned}")
        if releases is not None and releases < rounds:
            what = (f"pays {releases} of the {rounds} rounds: after that the device declines"
                    if releases else "pays no round: the device declines every one")
            lines.append(
                f"gpfl: budget of {who}: {setting}={_number(cap)} {what}; raise {setting} (its "
                f"node config or --policy), {CHEAPER.get(str(setting), 'add noise')} (a release "
                "then costs less), or lower num-rounds")
    return lines


def meaning(plan: DeviceBudget) -> str:
    """Say what one release's cost and the cap mean, in words a device owner can check.

    d-privacy (Laplace): a release bounds how much better the release tells apart any two
    model vectors at distance d, by a factor e^{ε·d}; the ledger charges ε·r, r being the
    neighbourhood radius the release was calibrated to (the update's norm under the
    neighbourhood calibration), so within the neighbourhood the factor is e^{cost} and it
    stays under e (the factor usually taken as a meaningful bound) only within r / cost of
    the released model. Gaussian and sign: one release alone is (ε, δ)-DP of the device's
    whole data; the cap bounds the composed ε of all releases (RDP or PLD, not a sum).
    """
    if plan.cost is None or plan.note:
        return ""
    paid = ("a release every round the run asks for" if plan.covers
            else f"{plan.releases} release{'s' if plan.releases != 1 else ''}, fewer than the "
                 f"{plan.rounds} rounds the run asks for")
    budget = f" {plan.cap_setting}={_number(plan.cap)} (spent {_number(plan.spent)}) pays {paid}."
    if plan.family == "d-privacy":
        within = ("within the whole neighbourhood" if plan.cost <= 1
                  else f"only within r/{plan.cost:.3g} of it")
        return (f"a release keeps the device's model indistinguishable from every model within "
                f"its neighbourhood (radius r, the norm of its update) up to a factor "
                f"e^{plan.cost:.3g}; the factor stays under e {within}; releases add up "
                f"(Σ ε·r)." + budget)
    if plan.family == "rdp":
        return (f"one release alone is (ε = {plan.cost:.3g}, δ)-differentially private for the "
                f"device's whole data set: any change of that data changes the probability of "
                f"any release by at most e^{plan.cost:.3g} (plus δ); the cap bounds the "
                f"composed ε of all releases (RDP or PLD), which grows slower than their sum."
                + budget)
    if plan.family == "record":
        return (f"one release alone is (ε = {plan.cost:.3g}, δ)-differentially private for each "
                f"record of the device (the device's aggregate statistics are not protected); "
                f"the cap bounds the composed record-level ε." + budget)
    return ""


#: The per-release cost above which a guarantee is called weak: e^2 ≈ 7.4 times more likely.
WEAK_COST = 2.0


def weakness(plan: DeviceBudget) -> str:
    """Warn where a release's guarantee is weak, and name what gives a meaningful one.

    The neighbourhood calibration charges n/ν a release, so its cost grows with the number of
    parameters n: beyond a few parameters it bounds little (e^12.4 for a 62-parameter model
    at ν = 5, e^16,712 for the digits CNN). A Gaussian or record-level release is calibrated to
    a target ε instead, whatever n is.
    """
    if plan.cost is None or plan.note or plan.cost <= WEAK_COST:
        return ""
    if plan.family == "d-privacy":
        return (f"one release costs {plan.cost:.6g} ({plan.parameters:,} parameters: the "
                f"neighbourhood calibration charges n/ν), a factor e^{plan.cost:.3g}: the "
                f"guarantee is weak. For a meaningful device-level guarantee use "
                f"mechanism='gaussian' (a target epsilon over the run, whatever the model's "
                f"size), or mechanism='dpsgd' for each record; both cost accuracy "
                f"(docs/PRIVACY.md, what each setting guarantees).")
    return (f"one release alone costs ε = {plan.cost:.3g} (e^{plan.cost:.3g}): the guarantee "
            f"is weak; lower epsilon or num-rounds.")


def _names(names: list[str]) -> str:
    if len(names) <= 3:
        return ", ".join(names)
    return f"{len(names)} devices ({names[0]} ... {names[-1]})"


def shapes_of(hypothesis: list[np.ndarray]) -> list[tuple[int, ...]]:
    """Return the layer shapes of one hypothesis."""
    return [tuple(int(d) for d in np.shape(layer)) for layer in hypothesis]


