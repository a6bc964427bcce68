"""The client's privacy ledger: a persistent, atomic, locked record of every release.

The ledger lives on the client's own disk (never sent anywhere) as one JSON file::

    {
      "format": "gpfl-privacy-ledger",
      "version": 1,
      "delta": 1e-05,                  # the δ at which the last writer reported (ε, δ)
      "declines": 2,                   # rounds declined because of the cap
      "events": [
        {"time": "2025-01-01T12:00:00+00:00", "round": 3,
         "event": {"kind": "metric", "layers": [[0.8, 0.5]]}},
        {"time": "...", "round": null, "event": {"kind": "gaussian", "noise_multiplier": 25.6}}
      ]
    }

Composition:

* d-privacy (``metric`` events, Euclidean Laplace): costs add, Σ ε·r (Theorem 3.1
  of Galli et al.), reported as ``Spend.d_privacy``;
* ``gaussian`` and ``sign`` events (a sign release is post-processing of a Gaussian
  one): composed by dp-accounting's ``RdpAccountant`` (events grouped by noise
  multiplier as ``SelfComposedDpEvent``) into ``Spend.epsilon`` at the ledger's δ;
* ``none`` events (no noise) are counted as releases; they carry no guarantee,
  so no cap can admit them.

Every change happens under an exclusive ``fcntl.flock`` on a sidecar file
``<ledger>.lock``; the file is re-read under the lock, the change checked, then
written to a temporary file in the same folder, flushed, fsync'ed, moved over the
ledger with ``os.replace`` and the folder fsync'ed. A charge therefore is on disk
before :meth:`PrivacyLedger.charge` returns, i.e. before the caller releases
anything, and a crash leaves either the old or the new file. A missing file is an
empty ledger; an unreadable one is never reset (:class:`LedgerCorruptError`).
"""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from mechanisms._validation import check_open_unit, check_real
from mechanisms.calibration import composed_gaussian_epsilon
from mechanisms.events import (
    GaussianReleaseEvent,
    MetricPrivacyEvent,
    NonPrivateEvent,
    PrivacyEvent,
    SignReleaseEvent,
    event_from_dict,
)

FORMAT = "gpfl-privacy-ledger"
VERSION = 1
DEFAULT_LEDGER_DIR = "~/.gpfl/ledgers"

# A cap is compared with a sum of floats: 6 releases of 0.4 sum to 2.4000000000000004.
# This relative slack keeps such a release inside a cap of 2.4; it is far below any
# meaningful privacy difference.
_CAP_RTOL = 1e-9

_KNOWN_EVENTS = (MetricPrivacyEvent, GaussianReleaseEvent, SignReleaseEvent, NonPrivateEvent)


class BudgetExceededError(Exception):
    """The next release would pass the client's cap; nothing was changed.

    Attributes
    ----------
    spent : float
        The current spend in the cap's unit (d-privacy Σ ε·r, or RDP ε).
    would_spend : float
        The spend after the release (``inf`` for a release without noise).
    cost : float
        ``would_spend - spent``.
    cap : float
        The cap.
    """

    def __init__(self, message: str, *, spent: float, would_spend: float, cap: float) -> None:
        super().__init__(message)
        self.spent = spent
        self.would_spend = would_spend
        self.cost = would_spend - spent
        self.cap = cap


class LedgerCorruptError(RuntimeError):
    """The ledger file exists but cannot be read; it is left as it is, never reset."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(
            f"privacy ledger {path} is corrupt or unreadable ({reason}); it will not be "
            "reset, since that would forget releases already made: restore it from a "
            "backup, or move it away deliberately to start a new budget"
        )
        self.path = path
        self.reason = reason


@dataclass(frozen=True)
class Spend:
    """What a client has spent so far.

    Attributes
    ----------
    d_privacy : float
        Σ ε·r over its d-privacy (Euclidean Laplace) releases.
    epsilon, delta : float
        The RDP-composed (ε, δ) of its Gaussian and sign releases (0, 0 if none).
    releases : int
        Releases charged, of every kind.
    declines : int
        Rounds declined because of the cap.
    """

    d_privacy: float
    epsilon: float
    delta: float
    releases: int
    declines: int

    def to_dict(self) -> dict[str, float | int]:
        """Return the fields as a dict (snake_case keys)."""
        return asdict(self)


@dataclass(frozen=True)
class LedgerEntry:
    """One charged release: the event, when (UTC, ISO 8601) and in which round."""

    event: PrivacyEvent
    time: str
    round: int | None

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form stored in the ledger file."""
        return {"time": self.time, "round": self.round, "event": self.event.to_dict()}


@dataclass(frozen=True)
class _State:
    entries: tuple[LedgerEntry, ...]
    declines: int
    delta: float | None


class PrivacyLedger:
    """A client's persistent privacy ledger (see the module notes for the file format).

    Parameters
    ----------
    path : str or pathlib.Path
        The ledger file; its folder is created on the first write.
    delta : float
        The δ, in (0, 1), at which Gaussian and sign releases are reported as (ε, δ).

    Raises
    ------
    LedgerCorruptError
        If the file exists and cannot be parsed (checked when the ledger is opened
        and on every later read).
    """

    def __init__(self, path: str | os.PathLike[str], *, delta: float) -> None:
        self.path = Path(path).expanduser()
        self.delta = check_open_unit("delta", delta)
        self._lock_path = self.path.with_name(self.path.name + ".lock")
        self._read()

    def __repr__(self) -> str:
        return f"PrivacyLedger({str(self.path)!r}, delta={self.delta!r})"

    # -- queries ------------------------------------------------------------------------------

    def spent(self) -> Spend:
        """Return the current spend, read from disk (other writers included)."""
        return self._spend(self._read())

    def entries(self) -> tuple[LedgerEntry, ...]:
        """Return every charged release, oldest first."""
        return self._read().entries

    # -- changes ------------------------------------------------------------------------------

    def charge(
        self, event: PrivacyEvent, *, cap: float | None, round: int | None = None
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
            ``None``: no cap. Otherwise a finite bound >= 0 on the spend of the
            event's kind: Σ ε·r for a ``MetricPrivacyEvent``, the RDP-composed ε at
            the ledger's δ for Gaussian and sign events. A ``NonPrivateEvent`` has
            no finite cost, so any cap refuses it.
        round : int or None
            The server round, stored for the record.

        Raises
        ------
        BudgetExceededError
            The release would pass the cap (the file is left untouched).
        TypeError, ValueError
            An unknown event type, non-finite event parameters, a bad cap or round.
        """
        if type(event) not in _KNOWN_EVENTS:
            raise TypeError(
                f"cannot charge {event!r}: not one of "
                f"{', '.join(cls.__name__ for cls in _KNOWN_EVENTS)}"
            )
        event.validate()
        if cap is not None:
            cap = check_real("cap", cap)
            if not (cap >= 0.0 and math.isfinite(cap)):
                raise ValueError(
                    f"cap must be non-negative and finite (None for no cap), got cap={cap!r}"
                )
        if round is not None and (
            isinstance(round, bool) or not isinstance(round, int) or round < 0
        ):
            raise ValueError(f"round must be a non-negative integer or None, got round={round!r}")
        entry = LedgerEntry(event, _now(), round)
        with self._locked():
            state = self._read()
            if cap is not None:
                self._check_cap(state, event, cap)
            new = _State((*state.entries, entry), state.declines, self.delta)
            self._write(new)
        return self._spend(new)

    def record_decline(self) -> Spend:
        """Count one declined round (persisted like a charge); return the spend."""
        with self._locked():
            state = self._read()
            new = _State(state.entries, state.declines + 1, self.delta)
            self._write(new)
        return self._spend(new)

    # -- internals ----------------------------------------------------------------------------

    def _check_cap(self, state: _State, event: PrivacyEvent, cap: float) -> None:
        if isinstance(event, NonPrivateEvent):
            raise BudgetExceededError(
                f"a release without noise (mechanism 'none') has no privacy guarantee and "
                f"cannot fit under any cap (cap={cap!r}); ledger {self.path}",
                spent=0.0,
                would_spend=math.inf,
                cap=cap,
            )
        if isinstance(event, MetricPrivacyEvent):
            before = _d_privacy(state.entries)
            after = math.fsum([before, event.cost])
            unit = "d-privacy Σ ε·r"
        else:
            groups = _gaussian_groups(state.entries)
            before = composed_gaussian_epsilon(groups, self.delta)
            groups[_noise_multiplier(event)] += 1
            after = composed_gaussian_epsilon(groups, self.delta)
            unit = f"RDP ε at δ={self.delta:g}"
        if after > cap * (1.0 + _CAP_RTOL):
            raise BudgetExceededError(
                f"release refused: {unit} spent {before:.6g}, this release would bring it to "
                f"{after:.6g} (cost {after - before:.6g}), over the cap {cap:.6g}; "
                f"ledger {self.path}",
                spent=before,
                would_spend=after,
                cap=cap,
            )

    def _spend(self, state: _State) -> Spend:
        groups = _gaussian_groups(state.entries)
        return Spend(
            d_privacy=_d_privacy(state.entries),
            epsilon=composed_gaussian_epsilon(groups, self.delta),
            delta=self.delta if groups else 0.0,
            releases=len(state.entries),
            declines=state.declines,
        )

    @contextmanager
    def _locked(self) -> Iterator[None]:
        import fcntl  # POSIX only; imported here so that `import mechanisms` works anywhere

        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    def _read(self) -> _State:
        # Readers take no lock: os.replace makes every version of the file complete.
        return _load(self.path)

    def _write(self, state: _State) -> None:
        document = {
            "format": FORMAT,
            "version": VERSION,
            "delta": self.delta,
            "declines": state.declines,
            "events": [e.to_dict() for e in state.entries],
        }
        payload = (json.dumps(document, indent=1, allow_nan=False) + "\n").encode()
        fd, tmp = tempfile.mkstemp(
            dir=self.path.parent, prefix=f".{self.path.name}.", suffix=".tmp"
        )
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(payload)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            with _suppress_os_error():
                os.unlink(tmp)
            raise
        dir_fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


@contextmanager
def _suppress_os_error() -> Iterator[None]:
    try:
        yield
    except OSError:
        pass


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _d_privacy(entries: tuple[LedgerEntry, ...]) -> float:
    return math.fsum(e.event.cost for e in entries if isinstance(e.event, MetricPrivacyEvent))


def _noise_multiplier(event: PrivacyEvent) -> float:
    assert isinstance(event, GaussianReleaseEvent)
    return event.noise_multiplier


def _gaussian_groups(entries: tuple[LedgerEntry, ...]) -> Counter[float]:
    return Counter(
        e.event.noise_multiplier for e in entries if isinstance(e.event, GaussianReleaseEvent)
    )


def _reject_constant(name: str) -> float:
    raise ValueError(f"non-finite number {name} in JSON")


def _load(path: Path) -> _State:
    """Read and validate a ledger file; a missing file is an empty ledger."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return _State((), 0, None)
    try:
        document = json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError) as err:
        raise LedgerCorruptError(path, f"not valid JSON: {err}") from err
    try:
        return _parse(document)
    except KeyError as err:
        raise LedgerCorruptError(path, f"missing field {err}") from err
    except (TypeError, ValueError) as err:
        raise LedgerCorruptError(path, str(err)) from err


def _parse(document: Any) -> _State:
    if not isinstance(document, dict):
        raise ValueError(f"the top level is a {type(document).__name__}, not an object")
    if document.get("format") != FORMAT:
        raise ValueError(f"format is {document.get('format')!r}, expected {FORMAT!r}")
    if document.get("version") != VERSION:
        version = document.get("version")
        raise ValueError(f"format version is {version!r}, this code reads {VERSION}")
    declines = document["declines"]
    if isinstance(declines, bool) or not isinstance(declines, int) or declines < 0:
        raise ValueError(f"declines must be a non-negative integer, got {declines!r}")
    delta = check_open_unit("delta", document["delta"])
    events = document["events"]
    if not isinstance(events, list):
        raise ValueError(f"events must be a list, got {type(events).__name__}")
    entries = []
    for i, item in enumerate(events):
        if not isinstance(item, dict) or set(item) != {"time", "round", "event"}:
            raise ValueError(f"event {i} must have exactly the keys time, round, event")
        time, rnd = item["time"], item["round"]
        if not isinstance(time, str):
            raise ValueError(f"event {i}: time must be a string, got {time!r}")
        if rnd is not None and (isinstance(rnd, bool) or not isinstance(rnd, int) or rnd < 0):
            raise ValueError(f"event {i}: round must be a non-negative integer or null")
        try:
            event = event_from_dict(item["event"])
        except (TypeError, ValueError) as err:
            raise ValueError(f"event {i}: {err}") from err
        entries.append(LedgerEntry(event, time, rnd))
    return _State(tuple(entries), declines, delta)


_SAFE_ID = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]*")


def default_ledger_path(ledger_dir: str, partition_id: int | str) -> Path:
    """Where a client keeps its ledger: ``<ledger_dir>/client-<partition_id>.json``.

    Parameters
    ----------
    ledger_dir : str
        The folder; ``""`` means ``~/.gpfl/ledgers``. ``~`` is expanded.
    partition_id : int or str
        The client's id: a non-negative integer or a name of letters, digits,
        ``_``, ``-`` and ``.`` (no path separators, not starting with ``.``).

    Returns
    -------
    pathlib.Path
    """
    if isinstance(partition_id, bool) or not isinstance(partition_id, (int, str)):
        raise TypeError(
            f"partition_id must be an int or a str, got partition_id={partition_id!r}"
        )
    if isinstance(partition_id, int) and partition_id < 0:
        raise ValueError(f"partition_id must be non-negative, got partition_id={partition_id!r}")
    if isinstance(partition_id, str) and not _SAFE_ID.fullmatch(partition_id):
        raise ValueError(
            "partition_id must be letters, digits, '_', '-' or '.' (not starting with '.'), "
            f"got partition_id={partition_id!r}"
        )
    folder = Path(ledger_dir or DEFAULT_LEDGER_DIR).expanduser()
    return folder / f"client-{partition_id}.json"


def format_ledger(path: str | os.PathLike[str], *, delta: float | None = None) -> str:
    """Render a ledger file for people: one line per release, then the totals.

    Parameters
    ----------
    path : str or pathlib.Path
        The ledger file.
    delta : float, optional
        The δ for the Gaussian/sign (ε, δ) total; default: the one stored in the file.

    Raises
    ------
    FileNotFoundError
        If there is no ledger at ``path``.
    LedgerCorruptError
        If the file cannot be parsed.
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"no privacy ledger at {path}")
    state = _load(path)
    if delta is None:
        delta = state.delta if state.delta is not None else 1e-5
    delta = check_open_unit("delta", delta)
    rows = [("#", "time (UTC)", "round", "kind", "parameters", "d-cost")]
    for i, entry in enumerate(state.entries, start=1):
        event = entry.event
        if isinstance(event, MetricPrivacyEvent):
            if len(event.layers) == 1:
                params = "ε={:.6g}, r={:.6g}".format(*event.layers[0])
            else:
                params = f"{len(event.layers)} layers"
            cost = f"{event.cost:.6g}"
        elif isinstance(event, GaussianReleaseEvent):
            params, cost = f"z={event.noise_multiplier:.6g}", "-"
        else:
            params, cost = "no noise", "-"
        round_text = "-" if entry.round is None else str(entry.round)
        rows.append((str(i), entry.time, round_text, event.kind, params, cost))
    widths = [max(len(row[k]) for row in rows) for k in range(len(rows[0]))]
    lines = [f"privacy ledger {path}"]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
              for row in rows]
    groups = _gaussian_groups(state.entries)
    epsilon = composed_gaussian_epsilon(groups, delta)
    lines.append("")
    lines.append(f"releases: {len(state.entries)}   declines: {state.declines}")
    lines.append(f"d-privacy (Σ ε·r): {_d_privacy(state.entries):.6g}")
    if groups:
        lines.append(f"Gaussian/sign (RDP): ε = {epsilon:.6g} at δ = {delta:g}")
    else:
        lines.append("Gaussian/sign (RDP): none")
    nonprivate = sum(isinstance(e.event, NonPrivateEvent) for e in state.entries)
    if nonprivate:
        lines.append(f"releases without noise (no guarantee): {nonprivate}")
    return "\n".join(lines)
