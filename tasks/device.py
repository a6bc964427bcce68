"""Pick the torch device and thread count for local training.

torch is imported inside the functions: importing this module stays cheap.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from tasks.config import TaskSettingsError

if TYPE_CHECKING:
    import torch

__all__ = ["configure_torch_threads", "resolve_device"]

#: Environment variable that overrides the torch thread count set by `configure_torch_threads`.
THREADS_ENV = "GPFL_TORCH_THREADS"


def resolve_device(name: str) -> torch.device:
    """Return the torch device for the run-config value ``device``.

    Parameters
    ----------
    name : str
        ``"auto"`` (CUDA when available, else CPU), ``"cpu"`` or ``"cuda"`` (``"cuda:N"`` for a
        given GPU).

    Returns
    -------
    torch.device
        The device.

    Raises
    ------
    TaskSettingsError
        If the name is unknown, or CUDA is requested and not available.
    """
    import torch

    value = name.strip().lower() if isinstance(name, str) else name
    if value == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if value == "cpu":
        return torch.device("cpu")
    if isinstance(value, str) and (value == "cuda" or value.startswith("cuda:")):
        if not torch.cuda.is_available():
            raise TaskSettingsError(
                f"device={name!r} was requested but CUDA is not available "
                "(use device='auto' or 'cpu')"
            )
        # The index is read here, not by torch: torch keeps it in 8 bits, so "cuda:999" became
        # cuda:-25 (seen with torch 2.11), which no check on its index could then refuse.
        index_text = value.partition(":")[2] if ":" in value else None
        if index_text is not None and not (index_text.isascii() and index_text.isdigit()):
            raise TaskSettingsError(
                f"device must name a CUDA device as cuda or cuda:N, got device={name!r}")
        index = None if index_text is None else int(index_text)
        if index is not None and index >= torch.cuda.device_count():
            raise TaskSettingsError(
                f"device={name!r} names GPU {index} but only "
                f"{torch.cuda.device_count()} are visible"
            )
        device = torch.device("cuda", index) if index is not None else torch.device("cuda")
        return device
    raise TaskSettingsError(f"device must be auto, cpu, cuda or cuda:N, got device={name!r}")


def configure_torch_threads(default: int = 1) -> int:
    """Limit torch's intra-op CPU threads for this process and return the number set.

    A Flower simulation runs several ClientApps side by side; each torch process taking every
    core oversubscribes the machine, and the tiny models here gain nothing from more threads.
    The torch tasks call this once when they are built. ``GPFL_TORCH_THREADS`` overrides
    ``default`` (e.g. for a single large experiment process).
    """
    import torch

    raw = os.environ.get(THREADS_ENV, "").strip()
    try:
        threads = int(raw) if raw else default
    except ValueError:
        raise TaskSettingsError(
            f"{THREADS_ENV} must be a positive integer, got {THREADS_ENV}={raw!r}"
        ) from None
    if threads < 1:
        raise TaskSettingsError(f"{THREADS_ENV} must be >= 1, got {THREADS_ENV}={threads}")
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    return threads
