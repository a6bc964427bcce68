"""Why a ledger is refused: unreadable, missing, or an older copy put back.

A refused ledger is never reset: resetting it would forget releases already made.
Each error names the file and says how to recover (see :mod:`mechanisms.ledger_store`).
"""

from __future__ import annotations

from pathlib import Path


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


#: The whole text of :class:`LedgerUnavailableError`: fixed, so that nothing of the device's
#: file system (its ledger's path, the operating system's message) can travel in it.
LEDGER_UNAVAILABLE = (
    "the privacy ledger could not be read or written; nothing was charged or released (the "
    "details are in the device's log)"
)


class LedgerUnavailableError(LedgerCorruptError):
    """The ledger's files could not be read or written (a full or read-only disk, say).

    Its text is always :data:`LEDGER_UNAVAILABLE`: no path and no operating-system message,
    which the store logs on the device instead. The ledger on disk is left as it was (a
    write is atomic), so nothing was charged.

    Attributes
    ----------
    path : pathlib.Path
        The ledger file (for the device's own use; not in the text).
    """

    def __init__(self, path: Path) -> None:
        super().__init__(path, "unavailable", message=LEDGER_UNAVAILABLE)
