"""``gpfl ledger``: a device's privacy ledger rendered for people.

Reads the ledger the way the client does (checked against its lock file, under a
shared lock, creating nothing) and composes it with the client's own accountant,
so the totals printed are the ones the device enforces.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

from mechanisms.accountant import LedgerEntry, compose
from mechanisms.events import (
    RELATIONS,
    GaussianReleaseEvent,
    MetricPrivacyEvent,
    NeighbourhoodEvent,
    NonPrivateEvent,
    RecordLevelEvent,
)
from mechanisms.ledger_store import LedgerStore

__all__ = ["format_ledger"]

#: The δ to report at when neither the caller nor the file gives one.
_DEFAULT_DELTA = 1e-5


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
    if path.exists() and not path.is_file():
        raise FileNotFoundError(f"no privacy ledger at {path} (not a file)")
    state = LedgerStore(path).load()
    if state is None:
        raise FileNotFoundError(f"no privacy ledger at {path}")
    if delta is None:
        delta = state.delta if state.delta is not None else _DEFAULT_DELTA
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
    if any(e.event.family == "rdp" for e in state.entries):
        lines.append(f"Gaussian/sign: ε = {spend.epsilon:.6g} at δ = {delta:g} (charged: the "
                     f"smaller of RDP ε = {spend.epsilon_rdp:.6g} and PLD ε = "
                     f"{spend.epsilon_pld:.6g})")
    else:
        lines.append("Gaussian/sign: none")
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
    elif isinstance(event, GaussianReleaseEvent):
        params, cost = f"z={event.noise_multiplier:.6g}", "-"
    else:
        params, cost = "no noise", "-"
    round_text = "-" if entry.round is None else str(entry.round)
    return (str(i), entry.time, round_text, event.kind, event.relation, params, cost)
