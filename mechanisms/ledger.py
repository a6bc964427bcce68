"""The client's privacy ledger: a persistent, atomic, locked record of every release.

:class:`PrivacyLedger` is the façade a client uses; it puts together two parts that
change for different reasons:

* :mod:`mechanisms.accountant`: what the charged releases have spent and whether
  one more fits under a cap (pure functions over immutable events);
* :mod:`mechanisms.ledger_store`: the JSON file, its lock file, durable atomic
  writes, and the refusal of a ledger that is unreadable, missing or rolled back
  (:mod:`mechanisms.ledger_errors`).

A charge is checked by the accountant against the ledger as it is on disk, under
the store's exclusive lock, and is on disk before :meth:`PrivacyLedger.charge`
returns, i.e. before the caller releases anything. A refused charge changes no file.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

from mechanisms._validation import check_open_unit
from mechanisms.accountant import (
    BudgetExceededError,
    LedgerEntry,
    Spend,
    check_cap,
    check_cap_value,
    check_supported,
    compose,
)
from mechanisms.events import PrivacyEvent
from mechanisms.ledger_errors import (
    LedgerCorruptError,
    LedgerMissingError,
    LedgerRollbackError,
    LedgerUnavailableError,
)
from mechanisms.ledger_store import EMPTY, LedgerState, LedgerStore

__all__ = [
    "BudgetExceededError",
    "LedgerCorruptError",
    "LedgerEntry",
    "LedgerMissingError",
    "LedgerRollbackError",
    "LedgerUnavailableError",
    "PrivacyLedger",
    "Spend",
]


class PrivacyLedger:
    """A client's persistent privacy ledger (file format: :mod:`mechanisms.ledger_store`).

    Parameters
    ----------
    path : str or pathlib.Path
        The ledger file; its folder is created on the first write. The lock file
        ``<path>.lock`` lives beside it.
    delta : float
        The δ, in (0, 1), at which Gaussian and sign releases are reported as (ε, δ).

    Raises
    ------
    LedgerCorruptError
        If the file exists and cannot be parsed, or (:class:`LedgerMissingError`,
        :class:`LedgerRollbackError`) if it is missing or older than the writes its
        lock file records. Checked when the ledger is opened and on every later read.

    Notes
    -----
    Opening a ledger that passes these checks removes the temporary files a writer
    killed mid-write left beside it (the next write would too); opening a ledger
    that was never written creates nothing.
    """

    def __init__(self, path: str | os.PathLike[str], *, delta: float) -> None:
        self.path = Path(path).expanduser()
        self.delta = check_open_unit("delta", delta)
        self._store = LedgerStore(self.path)
        self._read()
        # Only once the ledger is known good: a refused one is left exactly as it is.
        self._store.remove_stale_temporaries()

    def __repr__(self) -> str:
        return f"PrivacyLedger({str(self.path)!r}, delta={self.delta!r})"

    # -- queries ------------------------------------------------------------------------------

    def spent(self, *, federation: str | None = None) -> Spend:
        """Return the current spend, read from disk (other writers included).

        With ``federation``, only the releases charged for it (``declines`` is then 0: a
        decline is not tagged); without, the device's lifetime spend.
        """
        state = self._read()
        if federation is None:
            return self._spend(state)
        entries = tuple(e for e in state.entries if e.federation == federation)
        return compose(entries, declines=0, delta=self.delta)

    def entries(self) -> tuple[LedgerEntry, ...]:
        """Return every charged release, oldest first."""
        return self._read().entries

    # -- changes ------------------------------------------------------------------------------

    def charge(
        self, event: PrivacyEvent, *, cap: float | None, round: int | None = None,
        federation: str | None = None,
    ) -> Spend:
        """Record a release, unless it would pass ``cap``; return the new spend.

        Everything is checked before anything changes: the event, the cap, the
        round, then (under the lock, against the file as it is now) the spend the
        release would bring. The new entry is on disk when this returns.

        Parameters
        ----------
        event : PrivacyEvent
            What the release costs (``Mechanism.event``).
        cap : float or None
            The bound on the spend of the event's family, in that family's unit,
            compared with that family's spend alone:

            * ``event.family == "d-privacy"``: Σ ε·r over every d-privacy release;
            * ``event.family == "rdp"``: the ε, at the ledger's δ, of every Gaussian
              and sign release, the smaller of dp-accounting's RDP and PLD bounds;
            * ``event.family == "none"``: a release without noise has no finite
              cost, so any cap refuses it.

            ``None``: no cap (for a ``NonPrivateEvent``: the device explicitly
            allows the non-private baseline). Otherwise finite and >= 0.
        round : int or None
            The server round, stored for the record.
        federation : str or None
            The federation the release is made for, stored with it (:meth:`spent`).
            The cap always applies to the device's whole spend.

        Raises
        ------
        BudgetExceededError
            The release would pass the cap (the file is left untouched).
        LedgerCorruptError
            The ledger is unreadable, missing or rolled back (nothing is written).
        TypeError, ValueError
            An unknown event type, non-finite event parameters, a bad cap or round.
        """
        check_supported(event)
        limit = check_cap_value(cap)
        if round is not None and (
            isinstance(round, bool) or not isinstance(round, int) or round < 0
        ):
            raise ValueError(f"round must be a non-negative integer or None, got round={round!r}")
        if federation is not None and not isinstance(federation, str):
            raise TypeError(f"federation must be a string or None, got federation={federation!r}")
        entry = LedgerEntry(event, _now(), round, federation)

        def add(state: LedgerState) -> LedgerState:
            if limit is not None:
                check_cap(state.entries, event, cap=limit, delta=self.delta, ledger=self.path)
            return LedgerState((*state.entries, entry), state.declines, self.delta, 0)

        return self._spend(self._store.update(add))

    def record_decline(self) -> Spend:
        """Count one declined round (persisted like a charge); return the spend."""

        def decline(state: LedgerState) -> LedgerState:
            return LedgerState(state.entries, state.declines + 1, self.delta, 0)

        return self._spend(self._store.update(decline))

    # -- internals ----------------------------------------------------------------------------

    def _spend(self, state: LedgerState) -> Spend:
        return compose(state.entries, declines=state.declines, delta=self.delta)

    def _read(self) -> LedgerState:
        state = self._store.load()
        return EMPTY if state is None else state


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")
