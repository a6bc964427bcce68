"""The ledger's crash-safe store: one JSON file, a lock file, and nothing that goes back in time.

The ledger lives on the client's own disk (never sent anywhere) as one JSON file::

    {
      "format": "gpfl-privacy-ledger",
      "version": 1,
      "generation": 5,                 # writes so far (absent in older files: events + declines)
      "delta": 1e-05,                  # the δ at which the last writer reported (ε, δ)
      "declines": 2,                   # rounds declined because of the cap
      "events": [
        {"time": "2025-01-01T12:00:00+00:00", "round": 3,
         "event": {"kind": "neighbourhood", "dimensions": [7850], "noise_multiplier": 5.0,
                   "relation": "device-replace"}},
        {"time": "...", "round": 4,
         "event": {"kind": "metric", "layers": [[0.8, 0.5]], "relation": "device-replace"}},
        {"time": "...", "round": null,
         "event": {"kind": "gaussian", "noise_multiplier": 25.6, "relation": "device-replace"}}
      ]
    }

Each event names the neighbouring relation its cost is stated under (``relation``, see
:mod:`mechanisms.events`); an event written before device-level events named theirs reads as
its kind's implied relation, and is written with it the next time the file is written.

Every change happens under an exclusive ``fcntl.flock`` on the sidecar file
``<ledger>.lock``; the file is re-read under the lock, the change checked, then
written to the temporary file ``.<ledger>.tmp`` in the same folder, flushed,
fsync'ed, moved over the ledger with ``os.replace`` and the folder fsync'ed. A change
therefore is on disk before :meth:`LedgerStore.update` returns, and a crash leaves
either the old or the new file. The temporary has one fixed name (only the holder
of the exclusive lock writes it), so the one a killed writer left is found with one
``stat``, not a scan of the folder, which the Simulation Engine's virtual devices
share by the thousand: it is removed the next time the ledger is opened
(:meth:`LedgerStore.remove_stale_temporaries`) and replaced by the next write.

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

What the entries cost is not this module's business: see :mod:`mechanisms.accountant`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mechanisms._validation import check_open_unit
from mechanisms.accountant import LedgerEntry
from mechanisms.atomic_file import write_atomic
from mechanisms.events import event_from_dict
from mechanisms.ledger_errors import (
    LedgerCorruptError,
    LedgerMissingError,
    LedgerRollbackError,
    LedgerUnavailableError,
)

logger = logging.getLogger(__name__)

FORMAT = "gpfl-privacy-ledger"
# Version 1 files without "generation", "neighbourhood" events or events' "relation" are still
# version 1: each is additive, and a reader that does not know the new kind or field refuses
# the file (it never misreads it).
VERSION = 1

# The generation record in the lock file: fixed width, so that every write is one
# pwrite of the same length at offset 0 (it lands in one disk sector and needs no
# truncation that a crash could leave half done).
_GENERATION_RECORD = re.compile(rb"gpfl-privacy-ledger generation (\d{20})\n")
_GENERATION_TEMPLATE = "gpfl-privacy-ledger generation {:020d}\n"

@dataclass(frozen=True)
class LedgerState:
    """What one ledger file holds.

    Attributes
    ----------
    entries : tuple of LedgerEntry
        Every charged release, oldest first.
    declines : int
        Rounds declined because of the cap.
    delta : float or None
        The δ the last writer reported at; ``None`` for a ledger never written.
    generation : int
        Writes so far; only the store sets it.
    """

    entries: tuple[LedgerEntry, ...]
    declines: int
    delta: float | None
    generation: int


#: The state of a ledger with neither a file nor a lock file.
EMPTY = LedgerState((), 0, None, 0)


class LedgerStore:
    """The files of one ledger: ``path`` and its lock file ``<path>.lock`` beside it.

    Parameters
    ----------
    path : pathlib.Path
        The ledger file; its folder is created on the first write.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock_path = lock_path_of(path)
        self.temporary_path = temporary_path_of(path)

    def load(self) -> LedgerState | None:
        """Read the ledger and check it against its lock file; ``None`` for no ledger.

        A shared lock on the lock file keeps a writer from changing either between the
        two reads. Without a lock file nothing was ever recorded: there is nothing to
        compare with, and nothing is created just to read.

        Raises
        ------
        LedgerCorruptError
            Unreadable, or (:class:`LedgerMissingError`, :class:`LedgerRollbackError`)
            missing or older than the writes its lock file records.
        """
        import fcntl  # POSIX only; imported here so that `import mechanisms` works anywhere

        with self._unavailable_on_os_error("read"):
            try:
                fd = os.open(self.lock_path, os.O_RDONLY)
            except FileNotFoundError:
                return self._checked(0)
            try:
                fcntl.flock(fd, fcntl.LOCK_SH)
                return self._checked(_read_generation(fd, self.path, self.lock_path))
            finally:
                os.close(fd)

    def update(self, change: Callable[[LedgerState], LedgerState]) -> LedgerState:
        """Apply ``change`` to the ledger as it is on disk now, and write the result.

        Under the exclusive lock: read and check the ledger, call ``change`` on it
        (an exception from it, e.g. a refused charge, leaves every file as it was),
        give the result the next generation (the ``generation`` that ``change``
        returns is ignored: only the store numbers writes) and write it durably.
        Returns the state written.
        """
        with self._unavailable_on_os_error("write"), self._locked() as lock_fd:
            recorded = _read_generation(lock_fd, self.path, self.lock_path)
            current = self._checked(recorded) or EMPTY
            new = dataclasses.replace(change(current), generation=current.generation + 1)
            self._write(new, lock_fd)
        return new

    def remove_stale_temporaries(self) -> None:
        """Remove the temporary of this ledger that a writer killed mid-write left behind.

        Does nothing (and creates nothing) when there is none, or when there is no
        lock file to hold: every writer creates the lock file before its temporary,
        so the next write will clean up instead.
        """
        if not os.path.lexists(self.temporary_path):
            return
        import fcntl  # POSIX only, as in load

        try:
            fd = os.open(self.lock_path, os.O_RDONLY)
        except FileNotFoundError:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            self._remove_stale_temporaries()
        finally:
            os.close(fd)

    # -- internals ----------------------------------------------------------------------------

    @contextmanager
    def _unavailable_on_os_error(self, action: str) -> Iterator[None]:
        """Turn an OSError into :class:`LedgerUnavailableError`; the detail goes to the log.

        The error's text is fixed: it may travel further than the device (a reply, a log a
        server collects), and the path and the operating system's message must not.
        """
        try:
            yield
        except OSError as err:
            logger.error("privacy ledger %s could not be %s: %s", self.path,
                         "read" if action == "read" else "written", err)
            raise LedgerUnavailableError(self.path) from None

    @contextmanager
    def _locked(self) -> Iterator[int]:
        """Hold the exclusive lock; yield the lock file's descriptor (it holds the generation)."""
        import fcntl  # POSIX only, as in load

        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield fd
        finally:
            os.close(fd)  # closing releases the lock

    def _checked(self, recorded: int) -> LedgerState | None:
        """Read the file; refuse it if missing or older than the ``recorded`` generation."""
        state = _load(self.path)
        if state is None:
            if recorded > 0:
                raise LedgerMissingError(self.path, recorded=recorded, lock_path=self.lock_path)
            return None
        if state.generation < recorded:
            raise LedgerRollbackError(
                self.path, found=state.generation, recorded=recorded, lock_path=self.lock_path
            )
        return state

    def _write(self, state: LedgerState, lock_fd: int) -> None:
        payload = (json.dumps(_document(state), indent=1, allow_nan=False) + "\n").encode()
        # A temporary still there was left by a writer killed mid-write (under the lock no
        # other writer runs): removed, so that the exclusive create below cannot fail on it.
        self._remove_stale_temporaries()
        write_atomic(self.path, payload, temporary=self.temporary_path)
        # After the ledger, never before: a crash in between leaves the record one
        # behind the file, which reads as a valid ledger, never as a rollback.
        _write_generation(lock_fd, state.generation)

    def _remove_stale_temporaries(self) -> None:
        """Remove this ledger's temporary; the caller holds the exclusive lock.

        Under that lock no writer of this ledger is running, so the file is stale.
        One that cannot be removed is left here; the next write then fails to create
        its temporary and refuses the charge (nothing is released).
        """
        with _suppress_os_error():
            os.unlink(self.temporary_path)


def lock_path_of(path: Path) -> Path:
    """Return the lock file of the ledger ``path``: ``<path>.lock`` beside it."""
    return path.with_name(path.name + ".lock")


def temporary_path_of(path: Path) -> Path:
    """Return the temporary file of the ledger ``path``: ``.<name>.tmp`` beside it."""
    return path.with_name(f".{path.name}.tmp")


@contextmanager
def _suppress_os_error() -> Iterator[None]:
    try:
        yield
    except OSError:
        pass


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


# -- the JSON format --------------------------------------------------------------------------


def _document(state: LedgerState) -> dict[str, Any]:
    """Return the JSON document of ``state`` (which has been given a δ by its writer)."""
    return {
        "format": FORMAT,
        "version": VERSION,
        "generation": state.generation,
        "delta": state.delta,
        "declines": state.declines,
        "events": [e.to_dict() for e in state.entries],
    }


def _reject_constant(name: str) -> float:
    raise ValueError(f"non-finite number {name} in JSON")


def _load(path: Path) -> LedgerState | None:
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


def _parse(document: Any) -> LedgerState:
    if not isinstance(document, dict):
        raise ValueError(f"the top level is a {type(document).__name__}, not an object")
    if document.get("format") != FORMAT:
        raise ValueError(f"format is {document.get('format')!r}, expected {FORMAT!r}")
    if document.get("version") != VERSION:
        version = document.get("version")
        raise ValueError(f"format version is {version!r}, this code reads {VERSION}")
    declines = document["declines"]
    if not _is_count(declines):
        raise ValueError(f"declines must be a non-negative integer, got {declines!r}")
    delta = check_open_unit("delta", document["delta"])
    events = document["events"]
    if not isinstance(events, list):
        raise ValueError(f"events must be a list, got {type(events).__name__}")
    entries = tuple(_parse_entry(i, item) for i, item in enumerate(events))
    # Every write adds one event or one decline, so a file written by this code has
    # generation == events + declines; files from before the field have exactly that.
    writes = len(entries) + declines
    generation = document.get("generation", writes)
    if not _is_count(generation) or generation < writes:
        raise ValueError(
            f"generation must be an integer >= the {writes} events and declines, "
            f"got {generation!r}"
        )
    return LedgerState(entries, declines, delta, generation)


def _parse_entry(i: int, item: Any) -> LedgerEntry:
    keys = set(item) if isinstance(item, dict) else set()
    if keys not in ({"time", "round", "event"}, {"time", "round", "event", "federation"}):
        raise ValueError(f"event {i} must have exactly the keys time, round, event "
                         "(and optionally federation)")
    time, rnd = item["time"], item["round"]
    federation = item.get("federation")
    if federation is not None and not isinstance(federation, str):
        raise ValueError(f"event {i}: federation must be a string, got {federation!r}")
    if not isinstance(time, str):
        raise ValueError(f"event {i}: time must be a string, got {time!r}")
    if rnd is not None and not _is_count(rnd):
        raise ValueError(f"event {i}: round must be a non-negative integer or null")
    try:
        event = event_from_dict(item["event"])
    except (TypeError, ValueError) as err:
        raise ValueError(f"event {i}: {err}") from err
    return LedgerEntry(event, time, rnd, federation)


def _is_count(value: object) -> bool:
    """Whether ``value`` is a JSON integer >= 0 (``true`` is not one)."""
    return not isinstance(value, bool) and isinstance(value, int) and value >= 0
