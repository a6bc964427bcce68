"""Value checks a setting's type and bounds cannot say: names, hashes, optima, device strings.

Each ``check_*`` raises ``ValueError`` saying what is wrong (:class:`settings.setting.Setting`
adds the key and the value); :func:`parse_optima` reads the ``optima`` setting once checked.
Imports nothing of gpfl but :mod:`settings.values`.
"""

from __future__ import annotations

import math
import re

from settings.values import MAX_OPTIMUM, MAX_PRIVACY_PARAMETER

__all__ = [
    "LOG_TO_PACKAGES",
    "check_allowed_tasks",
    "check_categories",
    "check_column_list",
    "check_device",
    "check_divergence_factor",
    "check_fab_hashes",
    "check_log_to",
    "check_name",
    "check_number_list",
    "check_optima",
    "check_positive_list",
    "check_task_name",
    "parse_categories",
    "parse_log_to",
    "parse_optima",
]

_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]*")


def check_name(text: str) -> None:
    """Check a device name: empty, or letters, digits, ``_ - .`` not starting with ``.``."""
    if text and not _NAME.fullmatch(text):
        raise ValueError("must be letters, digits, '_', '-' or '.' (not starting with '.')")


def check_ledger_folder(text: str) -> None:
    """Check a ledger folder: absolute (or under ``~``), never empty or relative.

    The ledger is the device's only memory of its spend: a relative path would put it wherever
    the process happened to start, and a restart elsewhere would find no spend.
    """
    if not text.strip():
        raise ValueError("must name a folder (an absolute path); the ledger is the device's "
                         "only memory of its spend")
    if not (text.startswith("/") or text.startswith("~")):
        raise ValueError("must be an absolute path (or start with ~): a relative one would "
                         "move with the folder the device starts in")


def check_ledger_file(text: str) -> None:
    """Check an explicit ledger file: empty (use ``ledger-dir``) or absolute (or under ``~``)."""
    if text and not (text.startswith("/") or text.startswith("~")):
        raise ValueError("must be an absolute path (or start with ~), or empty to use "
                         "ledger-dir")


def check_task_name(text: str) -> None:
    """Check a task name: letters, digits, ``_ - .``, not starting with ``.``."""
    if not _NAME.fullmatch(text):
        raise ValueError("must be a task name: letters, digits, '_', '-' or '.' (not starting "
                         "with '.')")


def check_column_list(text: str) -> None:
    """Check comma-separated column names: none empty, none twice."""
    items = [c.strip() for c in text.split(",")] if text else []
    if any(not c for c in items):
        raise ValueError("must be comma-separated names, none of them empty")
    if len(set(items)) != len(items):
        raise ValueError("must not name a column twice")


def parse_categories(text: str) -> list[tuple[str, list[str]]]:
    """Parse ``"color=red|green|blue, size=S|M|L"`` into (column, vocabulary) pairs, in order."""
    out = []
    for item in (i.strip() for i in text.split(",")) if text.strip() else ():
        column, sep, values = item.partition("=")
        vocabulary = [v.strip() for v in values.split("|")]
        if not sep or not column.strip() or any(not v for v in vocabulary):
            raise ValueError(f"must be column=value|value|... items, comma-separated; got "
                             f"{item!r}")
        if len(set(vocabulary)) != len(vocabulary):
            raise ValueError(f"column {column.strip()!r} lists a value twice")
        out.append((column.strip(), vocabulary))
    if len({c for c, _ in out}) != len(out):
        raise ValueError("must not name a column twice")
    return out


def check_categories(text: str) -> None:
    """Check a categorical-columns value (see `parse_categories`)."""
    parse_categories(text)


#: What ``log-to`` may name, and the package each needs (server/tracking.py writes to them).
LOG_TO_PACKAGES = {"tensorboard": "tensorboard", "mlflow": "mlflow"}


def parse_log_to(text: str) -> list[tuple[str, str]]:
    """Parse ``log-to`` (``tensorboard:DIR,mlflow:URI``) into (kind, target) pairs."""
    out: list[tuple[str, str]] = []
    for item in (i.strip() for i in text.split(",")) if text.strip() else ():
        kind, sep, target = item.partition(":")
        if not sep or kind not in LOG_TO_PACKAGES or not target:
            raise ValueError(f"each item must be tensorboard:DIR or mlflow:URI, got {item!r}")
        out.append((kind, target))
    if len({k for k, _ in out}) != len(out):
        raise ValueError("must not name a kind twice")
    return out


def check_log_to(text: str) -> None:
    """Check a ``log-to`` value's grammar (the libraries are checked where it runs)."""
    parse_log_to(text)


def check_number_list(text: str) -> None:
    """Check comma-separated finite numbers of magnitude at most MAX_OPTIMUM."""
    try:
        values = [float(v) for v in text.split(",")] if text else []
    except ValueError:
        raise ValueError("must be comma-separated numbers") from None
    if any(not math.isfinite(v) or abs(v) > MAX_OPTIMUM for v in values):
        raise ValueError(f"must hold finite numbers of magnitude at most {MAX_OPTIMUM:g}")


def check_allowed_tasks(text: str) -> None:
    """Check ``*`` or comma-separated task names."""
    if text == "*":
        return
    for name in text.split(",") if text else []:
        check_task_name(name.strip())


_FAB_HASH = re.compile(r"[0-9a-f]{64}")


def check_fab_hashes(text: str) -> None:
    """Check comma-separated SHA-256 hashes (64 lower-case hex digits)."""
    if any(not _FAB_HASH.fullmatch(h) for h in text.split(",") if text):
        raise ValueError("must be comma-separated SHA-256 hashes (64 lower-case hex digits)")


def check_positive_list(text: str) -> None:
    """Check comma-separated positive numbers of at most MAX_PRIVACY_PARAMETER."""
    if not text:
        return
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        raise ValueError("must be comma-separated numbers") from None
    if any(not math.isfinite(v) or v <= 0 or v > MAX_PRIVACY_PARAMETER for v in values):
        raise ValueError(f"must hold positive numbers of at most {MAX_PRIVACY_PARAMETER:g}")


def check_optima(text: str) -> None:
    """Check ``;``-separated vectors of equal length, each coordinate finite and bounded."""
    rows = text.split(";")
    if any(not row.strip() for row in rows):
        raise ValueError("must be ';'-separated vectors, none of them empty")
    try:
        vectors = [[float(v) for v in row.split(",")] for row in rows]
    except ValueError:
        raise ValueError("must be ';'-separated vectors of ','-separated numbers") from None
    if not vectors or len({len(v) for v in vectors}) != 1:
        raise ValueError("must hold at least one vector, all of the same length")
    if any(not math.isfinite(x) or abs(x) > MAX_OPTIMUM for v in vectors for x in v):
        raise ValueError(f"must hold finite numbers of magnitude at most {MAX_OPTIMUM:g}")


def parse_optima(text: str) -> list[list[float]]:
    """Parse the ``optima`` setting (already checked) into vectors."""
    return [[float(v) for v in part.split(",")] for part in text.split(";")]


def check_divergence_factor(value: float) -> None:
    """Check a divergence factor: 0 (off) or more than 1 (1 or less ends slow honest runs)."""
    if 0 < value <= 1:
        raise ValueError("must be 0 (off) or more than 1")


_DEVICE = re.compile(r"auto|cpu|cuda(:[0-9]+)?")


def check_device(text: str) -> None:
    """Check a torch device string: auto, cpu, cuda or cuda:N."""
    if not _DEVICE.fullmatch(text):
        raise ValueError("must be auto, cpu, cuda or cuda:N")
