"""Replace a file atomically and durably: the one way gpfl writes a file a reader must trust.

The privacy ledger (:mod:`mechanisms.ledger_store`), the server's checkpoints and run records,
and the experiments' tables are all written here: the bytes go to a temporary file in the same
folder, are flushed and ``fsync``'ed, the temporary is moved over the target with
``os.replace`` (atomic on POSIX), and the folder is ``fsync``'ed so that the rename itself
survives a power cut. A reader therefore sees the old file or the new one, never a mixture,
and after :func:`write_atomic` returns the new one is on disk. It lives in ``mechanisms``
because the ledger needs it and ``mechanisms`` imports no other gpfl package; every other
package may import it.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["EXCLUSIVE", "write_atomic"]

#: Flags of a temporary of a fixed name: created here or not at all, never through a link.
EXCLUSIVE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)


def write_atomic(path: Path, payload: bytes | str, *, temporary: Path | None = None,
                 durable: bool = True, mode: int = 0o600) -> None:
    """Replace ``path`` by ``payload`` atomically (and, if ``durable``, on disk at return).

    Parameters
    ----------
    path : Path
        The file to write; its folder is created if missing.
    payload : bytes or str
        The whole new content (a ``str`` is written as UTF-8).
    temporary : Path, optional
        A temporary of a fixed name in the same folder, created exclusively with mode 0600 (the
        ledger's, which a later open can find and remove if a writer was killed); by default a
        fresh uniquely named one (``tempfile.mkstemp``).
    durable : bool
        ``fsync`` the file and its folder (default). ``False`` keeps the atomic replacement
        only, for files that can be recomputed (a figure's table, a cache entry).
    mode : int
        The new file's permissions (default 0600: a ledger or a run's records are the owner's).

    Raises
    ------
    OSError
        If the file cannot be written; the temporary is removed and ``path`` is unchanged.
    """
    data = payload.encode("utf-8") if isinstance(payload, str) else payload
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if temporary is None:
        fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        tmp = Path(name)
    else:
        tmp = Path(temporary)
        fd = os.open(tmp, EXCLUSIVE, 0o600)
    try:
        if mode != 0o600:
            os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            if durable:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if durable:
        folder = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)
