"""The client's privacy ledger: a persistent, atomic, locked record of every release.

The ledger lives on the client's own disk (never sent anywhere) as one JSON file::

    {
      "format": "gpfl-privacy-ledger",
      "version": 1,
      "generation": 5,                 # writes so far (absent in older files: events + declines)
      "delta": 1e-05,                  # the δ at which the last writer reported (ε, δ)
      "declines": 2,                   # rounds declined because of the cap
      "events": [
        {"time": "2025-01-01T12:00:00+00:00", "round": 3,
         "event": {"kind": "neighbourhood", "dimensions": [7850], "noise_multiplier": 5.0}},
        {"time": "...", "round": 4, "event": {"kind": "metric", "layers": [[0.8, 0.5]]}},
        {"time": "...", "round": null, "event": {"kind": "gaussian", "noise_multiplier": 25.6}}
      ]
    }

Composition, by the event's family (:mod:`mechanisms.events`); a family's spend is
compared only with a cap in its own unit:

* ``"d-privacy"`` (``neighbourhood`` and ``metric`` events, Euclidean Laplace):
  costs add, Σ ε·r (Theorem 3.1 of Galli et al.), reported as ``Spend.d_privacy``;
* ``"rdp"`` (``gaussian`` and ``sign`` events; a sign release is post-processing of
  a Gaussian one): composed by dp-accounting's ``RdpAccountant`` (events grouped by
  noise multiplier as ``SelfComposedDpEvent``) into ``Spend.epsilon`` at the
  ledger's δ;
* ``"none"`` (``none`` events, no noise): counted as releases; they carry no
  guarantee, so no cap admits them, only ``cap=None``.

Every change happens under an exclusive ``fcntl.flock`` on the sidecar file
``<ledger>.lock``; the file is re-read under the lock, the change checked, then
written to a temporary file in the same folder, flushed, fsync'ed, moved over the
ledger with ``os.replace`` and the folder fsync'ed. A charge therefore is on disk
before :meth:`PrivacyLedger.charge` returns, i.e. before the caller releases
anything, and a crash leaves either the old or the new file. Temporary files left
by a writer that was killed are removed by the next write.

The ledger's spend must never go back to zero by accident. After each write the
lock file records the ledger's generation (how many writes it has seen), and it
survives the ledger file's deletion. Every read compares the two: a ledger that is
missing although the lock file records writes (:class:`LedgerMissingError`), or
whose generation is below the recorded one, i.e. an older copy put back
(:class:`LedgerRollbackError`), is refused, as is an unreadable one
(:class:`LedgerCorruptError`). Only a ledger with neither file starts empty. To
start a new budget deliberately, remove both files. (Removing the whole folder
removes both too: the lock file guards against losing the ledger file, not the
folder.)
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
    EVENT_TYPES,
    GaussianReleaseEvent,
    MetricPrivacyEvent,
    NeighbourhoodEvent,
    NonPrivateEvent,
    PrivacyEvent,
    event_from_dict,
)

FORMAT = "gpfl-privacy-ledger"
# Version 1 files without "generation" or "neighbourhood" events are still version 1:
# both are additive, and a reader that does not know the new kind refuses the file.
VERSION = 1

# A cap is compared with a sum of floats: 6 releases of 0.4 sum to 2.4000000000000004.
# This relative slack keeps such a release inside a cap of 2.4; it is far below any
# meaningful privacy difference.
_CAP_RTOL = 1e-9

_KNOWN_EVENTS: tuple[type[PrivacyEvent], ...] = EVENT_TYPES

# The generation record in the lock file: fixed width, so that every write is one
# pwrite of the same length at offset 0 (it lands in one disk sector and needs no
# truncation that a crash could leave half done).
_GENERATION_RECORD = re.compile(rb"gpfl-privacy-ledger generation (\d{20})\n")
_GENERATION_TEMPLATE = "gpfl-privacy-ledger generation {:020d}\n"

# tempfile.mkstemp names its files prefix + 8 characters of [a-z0-9_] + suffix.
# Matching exactly that keeps the cleanup off any other file, including the
# temporaries of a ledger whose name merely starts with this one's.
_MKSTEMP_RANDOM = "[a-z0-9_]{8}"


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
    """The ledger cannot be trusted; it is left as it is, never reset.

    Attributes
    ----------
    path : pathlib.Path
        The ledger file.
    reason : str
        What is wrong with it.
    """

    def __init__(self, path: Path, reason: str, *, message: str | None = None) -> None:
        super().__init__(
            message
            or f"privacy ledger {path} is corrupt or unreadable ({reason}); it will not be "
            "reset, since that would forget releases already made: restore it from a "
            "backup, or move it away deliberately to start a new budget"
        )
        self.path = path
        self.reason = reason


class LedgerMissingError(LedgerCorruptError):
    """The ledger file is gone although its lock file records writes to it.

    Attributes
    ----------
    recorded : int
        The generation the lock file records.
    lock_path : pathlib.Path
        The lock file.
    """

    def __init__(self, path: Path, *, recorded: int, lock_path: Path) -> None:
        reason = f"the file is missing, but {lock_path} records {recorded} writes to it"
        super().__init__(
            path,
            reason,
            message=(
                f"privacy ledger {path} is missing, but {lock_path} records {recorded} "
                "writes to it: it is refused rather than restarted at zero, which would "
                "forget releases already made. Restore it from a backup; to start a new "
                f"budget deliberately, remove both {path} and {lock_path}"
            ),
        )
        self.recorded = recorded
        self.lock_path = lock_path


class LedgerRollbackError(LedgerCorruptError):
    """The ledger file is an older copy: its generation is below the one recorded.

    Attributes
    ----------
    found : int
        The generation of the ledger file.
    recorded : int
        The generation the lock file records.
    lock_path : pathlib.Path
        The lock file.
    """

    def __init__(self, path: Path, *, found: int, recorded: int, lock_path: Path) -> None:
        reason = f"generation {found}, but {lock_path} records {recorded}"
        super().__init__(
            path,
            reason,
            message=(
                f"privacy ledger {path} is at generation {found}, but {lock_path} records "
                f"{recorded} writes: it is an older copy and is refused, since it would "
                "forget releases already made. Put the newest copy back; to start a new "
                f"budget deliberately, remove both {path} and {lock_path}"
            ),
        )
        self.found = found
        self.recorded = recorded
        self.lock_path = lock_path


@dataclass(frozen=True)
class Spend:
    """What a client has spent so far, one figure per family (never added together).

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
    generation: int


_EMPTY = _State((), 0, None, 0)


class PrivacyLedger:
    """A client's persistent privacy ledger (see the module notes for the file format).

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
    """

    def __init__(self, path: str | os.PathLike[str], *, delta: float) -> None:
        self.path = Path(path).expanduser()
        self.delta = check_open_unit("delta", delta)
        self._lock_path = _lock_path(self.path)
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
            The bound on the spend of the event's family, in that family's unit,
            compared with that family's spend alone:

            * ``event.family == "d-privacy"``: Σ ε·r over every d-privacy release;
            * ``event.family == "rdp"``: the RDP-composed ε, at the ledger's δ, of
              every Gaussian and sign release;
            * ``event.family == "none"``: a release without noise has no finite
              cost, so any cap refuses it.

            ``None``: no cap (for a ``NonPrivateEvent``: the device explicitly
            allows the non-private baseline). Otherwise finite and >= 0.
        round : int or None
            The server round, stored for the record.

        Raises
        ------
        BudgetExceededError
            The release would pass the cap (the file is left untouched).
        LedgerCorruptError
            The ledger is unreadable, missing or rolled back (nothing is written).
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
        with self._locked() as lock_fd:
            state = self._read_locked(lock_fd)
            if cap is not None:
                self._check_cap(state, event, cap)
            new = _State((*state.entries, entry), state.declines, self.delta, state.generation + 1)
            self._write(new, lock_fd)
        return self._spend(new)

    def record_decline(self) -> Spend:
        """Count one declined round (persisted like a charge); return the spend."""
        with self._locked() as lock_fd:
            state = self._read_locked(lock_fd)
            new = _State(state.entries, state.declines + 1, self.delta, state.generation + 1)
            self._write(new, lock_fd)
        return self._spend(new)

    # -- internals ----------------------------------------------------------------------------

    def _check_cap(self, state: _State, event: PrivacyEvent, cap: float) -> None:
        if event.family == "none":
            raise BudgetExceededError(
                f"a release without noise (mechanism 'none') has no privacy guarantee and "
                f"cannot fit under any cap (cap={cap!r}); ledger {self.path}",
                spent=0.0,
                would_spend=math.inf,
                cap=cap,
            )
        if event.family == "d-privacy":
            costs = [_d_cost(e.event) for e in state.entries if e.event.family == "d-privacy"]
            before = math.fsum(costs)
            # The same fsum the spend will report once the entry is written.
            after = math.fsum([*costs, _d_cost(event)])
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
    def _locked(self) -> Iterator[int]:
        """Hold the exclusive lock; yield the lock file's descriptor (it holds the generation)."""
        import fcntl  # POSIX only; imported here so that `import mechanisms` works anywhere

        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield fd
        finally:
            os.close(fd)  # closing releases the lock

    def _read(self) -> _State:
        state = _read_checked(self.path, self._lock_path)
        return _EMPTY if state is None else state

    def _read_locked(self, lock_fd: int) -> _State:
        recorded = _read_generation(lock_fd, self.path, self._lock_path)
        state = _checked(self.path, _load(self.path), recorded, self._lock_path)
        return _EMPTY if state is None else state

    def _write(self, state: _State, lock_fd: int) -> None:
        document = {
            "format": FORMAT,
            "version": VERSION,
            "generation": state.generation,
            "delta": self.delta,
            "declines": state.declines,
            "events": [e.to_dict() for e in state.entries],
        }
        payload = (json.dumps(document, indent=1, allow_nan=False) + "\n").encode()
        self._remove_stale_temporaries()
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
        # After the ledger, never before: a crash in between leaves the record one
        # behind the file, which reads as a valid ledger, never as a rollback.
        _write_generation(lock_fd, state.generation)

    def _remove_stale_temporaries(self) -> None:
        """Remove temporaries of this ledger left by a writer killed mid-write.

        Called under the exclusive lock, so no writer of this ledger is running and
        every such file is stale. A file that cannot be removed is left: it is
        clutter, not a reason to refuse a charge.
        """
        pattern = re.compile(rf"\.{re.escape(self.path.name)}\.{_MKSTEMP_RANDOM}\.tmp")
        try:
            listing = os.scandir(self.path.parent)
        except OSError:
            return
        with listing:
            for item in listing:
                if pattern.fullmatch(item.name) and item.is_file(follow_symlinks=False):
                    with _suppress_os_error():
                        os.unlink(item.path)


@contextmanager
def _suppress_os_error() -> Iterator[None]:
    try:
        yield
    except OSError:
        pass


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _lock_path(path: Path) -> Path:
    return path.with_name(path.name + ".lock")


def _d_cost(event: PrivacyEvent) -> float:
    if not isinstance(event, (MetricPrivacyEvent, NeighbourhoodEvent)):
        raise TypeError(f"{event!r} is not a d-privacy event")
    return event.cost


def _d_privacy(entries: tuple[LedgerEntry, ...]) -> float:
    return math.fsum(_d_cost(e.event) for e in entries if e.event.family == "d-privacy")


def _noise_multiplier(event: PrivacyEvent) -> float:
    assert isinstance(event, GaussianReleaseEvent)
    return event.noise_multiplier


def _gaussian_groups(entries: tuple[LedgerEntry, ...]) -> Counter[float]:
    return Counter(_noise_multiplier(e.event) for e in entries if e.event.family == "rdp")


def _reject_constant(name: str) -> float:
    raise ValueError(f"non-finite number {name} in JSON")


def _read_generation(lock_fd: int, path: Path, lock_path: Path) -> int:
    """Return the generation the lock file records; 0 if it records none (an empty file)."""
    raw = os.pread(lock_fd, 256, 0)
    if not raw:
        # Never written: a brand-new lock file, or one from a version that kept none.
        return 0
    match = _GENERATION_RECORD.fullmatch(raw)
    if match is None:
        raise LedgerCorruptError(
            path,
            f"its lock file {lock_path} holds {raw[:64]!r}, not a generation record; if the "
            "ledger itself is the newest copy, removing the lock file lets it be used again",
        )
    return int(match.group(1))


def _write_generation(lock_fd: int, generation: int) -> None:
    record = _GENERATION_TEMPLATE.format(generation).encode()
    os.pwrite(lock_fd, record, 0)
    os.ftruncate(lock_fd, len(record))  # a no-op but for a lock file someone wrote into
    os.fsync(lock_fd)


def _read_checked(path: Path, lock_path: Path) -> _State | None:
    """Read the ledger and its recorded generation together; ``None`` for no ledger.

    A shared lock on the lock file keeps a writer from changing either between the
    two reads. Without a lock file nothing was ever recorded: there is nothing to
    compare with, and nothing is created just to read.
    """
    import fcntl  # POSIX only, as in PrivacyLedger._locked

    try:
        fd = os.open(lock_path, os.O_RDONLY)
    except FileNotFoundError:
        return _checked(path, _load(path), 0, lock_path)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        recorded = _read_generation(fd, path, lock_path)
        return _checked(path, _load(path), recorded, lock_path)
    finally:
        os.close(fd)


def _checked(path: Path, state: _State | None, recorded: int, lock_path: Path) -> _State | None:
    """Refuse a ledger that is missing or older than the generation its lock file records."""
    if state is None:
        if recorded > 0:
            raise LedgerMissingError(path, recorded=recorded, lock_path=lock_path)
        return None
    if state.generation < recorded:
        raise LedgerRollbackError(
            path, found=state.generation, recorded=recorded, lock_path=lock_path
        )
    return state


def _load(path: Path) -> _State | None:
    """Read and validate a ledger file; ``None`` if there is none."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
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
    # Every write adds one event or one decline, so a file written by this code has
    # generation == events + declines; files from before the field have exactly that.
    writes = len(entries) + declines
    generation = document.get("generation", writes)
    if isinstance(generation, bool) or not isinstance(generation, int) or generation < writes:
        raise ValueError(
            f"generation must be an integer >= the {writes} events and declines, "
            f"got {generation!r}"
        )
    return _State(tuple(entries), declines, delta, generation)


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
        If there is no ledger at ``path`` and none was ever recorded there.
    LedgerCorruptError
        If the file cannot be parsed, or is missing or rolled back
        (:class:`LedgerMissingError`, :class:`LedgerRollbackError`).
    """
    path = Path(path).expanduser()
    if path.exists() and not path.is_file():
        raise FileNotFoundError(f"no privacy ledger at {path} (not a file)")
    state = _read_checked(path, _lock_path(path))
    if state is None:
        raise FileNotFoundError(f"no privacy ledger at {path}")
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
        elif isinstance(event, NeighbourhoodEvent):
            if len(event.dimensions) == 1:
                params = f"n={event.dimensions[0]}, ν={event.noise_multiplier:.6g}"
            else:
                params = f"{len(event.dimensions)} layers, ν={event.noise_multiplier:.6g}"
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
