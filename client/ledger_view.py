"""``gpfl ledger``: a device's privacy ledger rendered for people.

Reads the ledger the way the client does (checked against its lock file, under a
shared lock, creating nothing) and composes it with the client's own accountant,
so the totals printed are the ones the device enforces.

The ledger file holds releases, not caps: the caps are the device's settings. With the
device's policy (:class:`~client.policy.DevicePolicy`, read as the device reads it: a policy
file and node-config keys), :func:`ledger_report` puts each family's spend beside its cap and
what is left; without one, beside the declared defaults a device without a policy applies.
It also lists the federations (runs) the releases were made for, from the tag each entry
carries.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from client.device_budget import FAMILIES, remaining
from client.policy import DevicePolicy
from mechanisms.accountant import LedgerEntry, Spend, compose
from mechanisms.events import (
    RELATIONS,
    DistributedGaussianEvent,
    GaussianReleaseEvent,
    MetricPrivacyEvent,
    NeighbourhoodEvent,
    NonPrivateEvent,
    RecordLevelEvent,
)
from mechanisms.ledger_store import LedgerState, LedgerStore

__all__ = ["format_ledger", "format_ledger_report", "ledger_report"]

#: The δ to report at when neither the caller nor the file gives one.
_DEFAULT_DELTA = 1e-5

#: Where the caps come from when no device settings are given.
NO_POLICY = ("device defaults: the ledger file holds no caps, and no --policy or --node-config "
             "was given, so the declared defaults of a device without a policy are shown")


def format_ledger(path: str | os.PathLike[str], *, delta: float | None = None) -> str:
    """Render a ledger file for people: one line per release, then the totals and relations.

    Every release names the neighbouring relation its cost is stated under; after the totals,
    one line per relation present says what it protects.

    Parameters
    ----------
    path : str or pathlib.Path
        The ledger file.
    delta : float, optional
        The δ for the Gaussian/sign (ε, δ) total; default: the one stored in the file.

    Raises
    ------
    FileNotFoundError
        If there is no ledger at ``path`` and none was ever recorded there.
    mechanisms.LedgerCorruptError
        If the file cannot be parsed, or is missing or rolled back
        (:class:`~mechanisms.LedgerMissingError`, :class:`~mechanisms.LedgerRollbackError`).
    """
    path = Path(path).expanduser()
    state = _load(path)
    if delta is None:
        delta = _file_delta(state)
    return _format_table(path, state, delta)


def ledger_report(
    path: str | os.PathLike[str], *, policy: DevicePolicy | None = None,
    delta: float | None = None,
) -> dict[str, Any]:
    """Return the ledger with the device's caps: what ``gpfl ledger --json`` prints.

    Parameters
    ----------
    path : str or pathlib.Path
        The ledger file.
    policy : DevicePolicy, optional
        The device's settings (:meth:`DevicePolicy.load`); its caps and its δ apply. Without
        it, the declared defaults of a device without a policy, at the file's δ.
    delta : float, optional
        The δ for the (ε, δ) families, over the policy's and the file's.

    Returns
    -------
    dict
        ``ledger``, ``delta``, ``releases``, ``declines``, ``spent`` (every figure of the
        device's lifetime spend), ``caps`` (``source``, ``given``, each cap setting, the
        mechanisms allowed and the policy's ledger file), ``budgets`` (per capped family:
        its unit, cap, spend and what is left), ``federations`` (per federation id the
        releases were tagged with: releases, rounds, times, spend), ``entries`` and
        ``relations``.

    Raises
    ------
    FileNotFoundError, mechanisms.LedgerCorruptError
        As :func:`format_ledger`.
    """
    path = Path(path).expanduser()
    state = _load(path)
    return _report(path, state, policy, delta)


def format_ledger_report(
    path: str | os.PathLike[str], *, policy: DevicePolicy | None = None,
    delta: float | None = None,
) -> str:
    """Render :func:`ledger_report` for people: :func:`format_ledger`, the caps, the runs.

    After the releases and the totals (as :func:`format_ledger` prints them, at the δ the
    report uses): where the caps come from, one line per cap (its setting, its value, the
    spend in its unit and what is left), then one line per federation the releases were made
    for.

    Raises
    ------
    FileNotFoundError, mechanisms.LedgerCorruptError
        As :func:`format_ledger`.
    """
    path = Path(path).expanduser()
    state = _load(path)
    report = _report(path, state, policy, delta)
    lines = [_format_table(path, state, report["delta"]), ""]
    caps = report["caps"]
    lines.append(f"caps from {caps['source']}")
    if caps["given"] and Path(caps["policy-ledger"]).resolve() != path.resolve():
        lines.append(f"note: a device with these settings keeps its ledger at "
                     f"{caps['policy-ledger']}, not in this file")
    for budget in report["budgets"]:
        lines.append(f"{budget['cap-setting']} = {budget['cap']:.6g} {budget['unit']} "
                     f"({budget['label']}): spent {budget['spent']:.6g}, "
                     f"{budget['remaining']:.6g} left")
    lines.append(f"mechanisms allowed: {', '.join(caps['mechanisms'])}; a run may ask for lower "
                 "caps, never higher ones")
    federations = report["federations"]
    lines.append("")
    lines.append(f"federations the releases were made for: {len(federations)}")
    for fed in federations:
        name = fed["federation"] or "(untagged: written before releases named their federation)"
        rounds = ("rounds -" if fed["first-round"] is None
                  else f"rounds {fed['first-round']}-{fed['last-round']}")
        spent = ", ".join(f"{fed['spent'][b['family']]:.6g} {b['unit']}"
                          for b in report["budgets"] if fed["spent"][b["family"]])
        lines.append(f"  {name}: {fed['releases']} releases, {rounds}, {fed['first-time']} to "
                     f"{fed['last-time']}" + (f"; spent {spent}" if spent else ""))
    return "\n".join(lines)


def _load(path: Path) -> LedgerState:
    """Read the ledger as the client does; refuse a folder, a missing or a corrupt ledger."""
    if path.exists() and not path.is_file():
        raise FileNotFoundError(f"no privacy ledger at {path} (not a file)")
    state = LedgerStore(path).load()
    if state is None:
        raise FileNotFoundError(f"no privacy ledger at {path}")
    return state


def _file_delta(state: LedgerState) -> float:
    # The δ the device last composed at is the file's best guess at the device's own.
    return state.delta if state.delta is not None else _DEFAULT_DELTA


def _report(
    path: Path, state: LedgerState, policy: DevicePolicy | None, delta: float | None,
) -> dict[str, Any]:
    given = policy is not None
    if policy is None:
        # Exactly what a device with no node config and no policy file applies.
        policy = DevicePolicy.load({}, environ={})
    if delta is None:
        delta = float(policy.bound("delta")) if given else _file_delta(state)
    spend = compose(state.entries, declines=state.declines, delta=delta)  # checks delta
    budgets = []
    for family in FAMILIES:
        cap = float(policy.bound(family.cap_setting))
        spent = family.spent(spend)
        budgets.append({"family": family.name, "label": family.label,
                        "unit": family.unit(delta), "cap-setting": family.cap_setting,
                        "cap": cap, "spent": spent, "remaining": remaining(spent, cap)})
    return {
        "ledger": str(path),
        "delta": delta,
        "releases": spend.releases,
        "declines": spend.declines,
        "spent": _spent(spend),
        "caps": {
            "source": policy.source if given else NO_POLICY,
            "given": given,
            **{family.cap_setting: float(policy.bound(family.cap_setting))
               for family in FAMILIES},
            "delta": float(policy.bound("delta")),
            "mechanisms": list(policy.mechanisms),
            "policy-ledger": str(policy.ledger_path),
        },
        "budgets": budgets,
        "federations": _federations(state.entries, delta),
        "entries": [_entry(entry) for entry in state.entries],
        "releases-without-noise": sum(isinstance(e.event, NonPrivateEvent)
                                      for e in state.entries),
        "relations": dict(Counter(e.event.relation for e in state.entries)),
    }


def _spent(spend: Spend) -> dict[str, float]:
    """Every figure of a spend, named as a reply's metrics name them (without ``spend-``)."""
    return {"d-privacy": spend.d_privacy, "epsilon": spend.epsilon,
            "epsilon-rdp": spend.epsilon_rdp, "epsilon-pld": spend.epsilon_pld,
            "record-epsilon": spend.record_epsilon, "central-epsilon": spend.central_epsilon,
            "delta": spend.delta}


def _federations(entries: Sequence[LedgerEntry], delta: float) -> list[dict[str, Any]]:
    """One record per federation tag, in the order of its first release.

    The tag is what the server sent (a random federation id, or ``run-<Flower run id>``);
    releases written before tags existed have none (``None``). Declines carry no tag.
    """
    groups: dict[str | None, list[LedgerEntry]] = {}
    for entry in entries:
        groups.setdefault(entry.federation, []).append(entry)
    out = []
    for federation, group in groups.items():
        spend = compose(group, declines=0, delta=delta)
        rounds = [e.round for e in group if e.round is not None]
        out.append({
            "federation": federation,
            "releases": len(group),
            "first-round": min(rounds) if rounds else None,
            "last-round": max(rounds) if rounds else None,
            "first-time": group[0].time,
            "last-time": group[-1].time,
            "spent": {family.name: family.spent(spend) for family in FAMILIES},
        })
    return out


def _entry(entry: LedgerEntry) -> dict[str, Any]:
    event = entry.event
    cost = event.cost if isinstance(event, MetricPrivacyEvent | NeighbourhoodEvent) else None
    return {"time": entry.time, "round": entry.round, "federation": entry.federation,
            "kind": event.kind, "family": event.family, "relation": event.relation,
            "d-cost": cost, "event": event.to_dict()}


def _format_table(path: Path, state: LedgerState, delta: float) -> str:
    """Render the releases and the totals (``format_ledger``'s text) at ``delta``."""
    spend = compose(state.entries, declines=state.declines, delta=delta)  # checks delta
    rows = [("#", "time (UTC)", "round", "kind", "relation", "parameters", "d-cost")]
    rows += [_row(i, entry) for i, entry in enumerate(state.entries, start=1)]
    widths = [max(len(row[k]) for row in rows) for k in range(len(rows[0]))]
    lines = [f"privacy ledger {path}"]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
              for row in rows]
    lines.append("")
    lines.append(f"releases: {spend.releases}   declines: {spend.declines}")
    lines.append(f"d-privacy (Σ ε·r): {spend.d_privacy:.6g}")
    secure = [e.event for e in state.entries if isinstance(e.event, DistributedGaussianEvent)]
    if secure:
        lines.append(f"Gaussian/sign: ε = {spend.epsilon:.6g} at δ = {delta:g} (charged: RDP "
                     "alone, as with discrete Gaussian shares among the releases)")
    elif any(e.event.family == "rdp" for e in state.entries):
        lines.append(f"Gaussian/sign: ε = {spend.epsilon:.6g} at δ = {delta:g} (charged: the "
                     f"smaller of RDP ε = {spend.epsilon_rdp:.6g} and PLD ε = "
                     f"{spend.epsilon_pld:.6g})")
    else:
        lines.append("Gaussian/sign: none")
    if secure:
        cohort = min(event.cohort for event in secure)
        lines.append(f"secure clusters ({len(secure)} shares): central ε = "
                     f"{spend.central_epsilon:.6g} at δ = {delta:g}, what a server learns from "
                     f"the sums if at least {cohort} honest devices' shares are in each (RDP); "
                     "the ε above is the floor that holds without that assumption")
    if any(e.event.family == "record" for e in state.entries):
        lines.append(f"record-level DP-SGD (RDP): ε = {spend.record_epsilon:.6g} at δ = {delta:g}")
    nonprivate = sum(isinstance(e.event, NonPrivateEvent) for e in state.entries)
    if nonprivate:
        lines.append(f"releases without noise (no guarantee): {nonprivate}")
    relations = Counter(e.event.relation for e in state.entries)
    for relation, count in relations.items():
        lines.append(f"relation {relation} ({count} of the releases): "
                     f"{RELATIONS.get(relation, '?')}")
    return "\n".join(lines)


def _row(i: int, entry: LedgerEntry) -> tuple[str, str, str, str, str, str, str]:
    """Return one release's cells: number, time, round, kind, relation, parameters, d-cost.

    The relation is the neighbouring relation the release's cost is stated under
    (``device-replace`` for every device-level release, the device's choice for ``dpsgd``).
    """
    event = entry.event
    if isinstance(event, MetricPrivacyEvent):
        if len(event.layers) == 1:
            params = "ε={:.6g}, r={:.6g}".format(*event.layers[0])
        else:
            params = f"{len(event.layers)} layers"
        cost = f"{event.cost:.6g}"
    elif isinstance(event, NeighbourhoodEvent):
        if len(event.dimensions) == 1:
            params = f"n={event.dimensions[0]}, ν={event.noise_multiplier:.6g}"
        else:
            params = f"{len(event.dimensions)} layers, ν={event.noise_multiplier:.6g}"
        cost = f"{event.cost:.6g}"
    elif isinstance(event, RecordLevelEvent):
        params = (f"q={event.sampling_rate:.6g}, ν={event.noise_multiplier:.6g}, "
                  f"T={event.steps}, choice ν={event.selection_noise_multiplier:.6g}")
        cost = "-"
    elif isinstance(event, DistributedGaussianEvent):
        params = (f"z={event.noise_multiplier:.6g}, central z={event.central_noise_multiplier:.6g}"
                  f", cohort {event.cohort}")
        cost = "-"
    elif isinstance(event, GaussianReleaseEvent):
        params, cost = f"z={event.noise_multiplier:.6g}", "-"
    else:
        params, cost = "no noise", "-"
    round_text = "-" if entry.round is None else str(entry.round)
    return (str(i), entry.time, round_text, event.kind, event.relation, params, cost)
