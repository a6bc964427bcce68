"""The server's checkpoint: what a run needs to continue after its last completed round.

After every completed round the ServerApp writes ``<out-dir>/checkpoint.npz`` atomically and
durably (:func:`mechanisms.atomic_file.write_atomic`, as the privacy ledger), so a reader, or a
resumed run, sees either the previous round's checkpoint or this one, never a mix: killing the
SuperLink or the ServerApp at any moment loses at most the round in flight.

One ``.npz`` file (NumPy's zip of arrays, read back with ``allow_pickle=False``):

``hypotheses``, ``best_hypotheses``
    (k, n) float32, bit for bit;
``state``
    UTF-8 JSON (as a uint8 array): the format version, the run's identity (:func:`run_identity`),
    the strategy's state (round, counters, best loss, patience count, rng state, client records,
    name bindings, round records) and the recorder's (history, initial hypotheses, resumes).

A run continues from it with the run-config setting ``resume-from = "<run dir>"``; the identity
must match (:func:`check_identity`).
"""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mechanisms.atomic_file import write_atomic

__all__ = [
    "CHECKPOINT_NAME",
    "FORMAT",
    "IDENTITY_KEYS",
    "CheckpointError",
    "check_identity",
    "read_checkpoint",
    "run_identity",
    "write_checkpoint",
]

CHECKPOINT_NAME = "checkpoint.npz"
#: Version of the checkpoint's layout.
FORMAT = 1
#: Run-config keys a resumed run must share with the checkpoint: what the hypotheses mean
#: (task, data split, k), where the server-side randomness comes from, and how releases are
#: made (the magnitude rules and the privacy report depend on it). Everything else (rounds,
#: deadline, patience, learning rates) may change on resume.
IDENTITY_KEYS = ("task", "num-hypotheses", "seed", "data-seed", "mechanism")
_STATE = "state"


class CheckpointError(RuntimeError):
    """A checkpoint is missing, unreadable, or belongs to another run."""


def run_identity(values: Mapping[str, Any], shapes: Sequence[Sequence[int]]) -> dict[str, Any]:
    """Return what a resumed run must share with its checkpoint (run config and layer shapes)."""
    out: dict[str, Any] = {key: values[key] for key in IDENTITY_KEYS}
    out["shapes"] = [list(shape) for shape in shapes]
    return out


def check_identity(saved: Mapping[str, Any], current: Mapping[str, Any], source: str) -> None:
    """Raise :class:`CheckpointError` naming every difference between two identities."""
    keys = list(dict.fromkeys([*saved, *current]))
    diff = [f"{k}={saved.get(k)!r} there, {current.get(k)!r} here"
            for k in keys if saved.get(k) != current.get(k)]
    if diff:
        raise CheckpointError(
            f"resume-from {source}: the checkpoint belongs to another run ({'; '.join(diff)}); "
            f"resume with the same {', '.join(IDENTITY_KEYS)} (and model), or start a fresh run"
        )


def write_checkpoint(
    path: Path, state: Mapping[str, Any], arrays: Mapping[str, np.ndarray]
) -> None:
    """Write ``state`` (JSON values) and ``arrays`` to ``path`` atomically (see the module notes).

    Raises
    ------
    ValueError
        If an array is named ``state``.
    """
    if _STATE in arrays:
        raise ValueError(f"an array may not be named {_STATE!r}")
    payload = json.dumps({"format": FORMAT, **state}).encode("utf-8")
    buffer = io.BytesIO()
    named = {_STATE: np.frombuffer(payload, dtype=np.uint8), **arrays}
    savez: Any = np.savez  # its keyword stubs cannot take a dict of arrays
    savez(buffer, **named)
    write_atomic(path, buffer.getvalue())


def read_checkpoint(path: Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Read a checkpoint written by :func:`write_checkpoint`.

    Returns
    -------
    state : dict
        The JSON state (``format`` included).
    arrays : dict of str to np.ndarray
        Every other array.

    Raises
    ------
    CheckpointError
        If the file is missing, is not a checkpoint, or is of another format version.
    """
    if not path.is_file():
        raise CheckpointError(f"no checkpoint at {path} (a run writes one after each round)")
    try:
        # Opened here, so that the file is closed even when NumPy fails on a damaged zip.
        with path.open("rb") as fh, np.load(fh, allow_pickle=False) as data:
            arrays = {name: data[name] for name in data.files}
        state = json.loads(bytes(arrays.pop(_STATE)).decode("utf-8"))
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as err:
        raise CheckpointError(f"{path} is not a readable checkpoint: {err}") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        got = state.get("format") if isinstance(state, dict) else None
        raise CheckpointError(f"{path} has checkpoint format {got!r}, expected {FORMAT}")
    return state, arrays
