"""Rows in and out: ``results.csv``, the numbers read off a run's summary, and table cells."""

from __future__ import annotations

import csv
import math
import os
import statistics
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "best_entry",
    "fmt",
    "last_entry",
    "mean_std",
    "read_csv",
    "spends_of",
    "write_csv",
]


def write_csv(path: Path, rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> Path:
    """Write ``rows`` with a header row of ``columns`` (extra keys are an error)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for row in rows:
        extra = sorted(set(row) - set(columns))
        if extra:
            raise ValueError(f"row has keys that are not columns of {path.name}: {extra}")
    # Written beside and renamed: an interrupted run never leaves half a results.csv.
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(columns), extrasaction="raise")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: _cell(row.get(k)) for k in columns})
    os.replace(tmp, path)
    return path


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return f"{value:.6g}"
    return value


def read_csv(path: Path) -> list[dict[str, str]]:
    """Read a ``results.csv`` back as a list of dicts of strings."""
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def _validated(summary: Mapping[str, Any]) -> list[dict[str, Any]]:
    history = [e for e in summary.get("history", []) if e.get("val_loss") is not None]
    if not history:
        raise ValueError("the run has no validated round")
    return history


def best_entry(summary: Mapping[str, Any]) -> dict[str, Any]:
    """Return the history entry of the best validation round (what the run delivers).

    Falls back on the last validated round when ``best_round`` is missing.
    """
    best = summary.get("best_round")
    for entry in _validated(summary):
        if entry["round"] == best:
            return dict(entry)
    return last_entry(summary)


def last_entry(summary: Mapping[str, Any]) -> dict[str, Any]:
    """Return the history entry of the last validated round (the final model)."""
    return dict(_validated(summary)[-1])


def spends_of(summary: Mapping[str, Any], clients: int = 0) -> list[float]:
    """Every client's total spend, from the run's privacy report.

    Parameters
    ----------
    summary : Mapping
        A run's ``summary.json``.
    clients : int, optional
        The federation's clients: those never sampled have no ledger entry and are
        added with a spend of 0 (001's statistics are over the whole set of clients).
    """
    per_client = summary.get("privacy", {}).get("per_client", {})
    spends = [float(c["spend"]) for c in per_client.values() if c.get("spend") is not None]
    return spends + [0.0] * max(0, clients - len(spends))


def mean_std(values: Iterable[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value) of the finite values; NaN if none."""
    finite = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not finite:
        return math.nan, math.nan
    if len(finite) == 1:
        return finite[0], 0.0
    return statistics.fmean(finite), statistics.stdev(finite)


def fmt(value: float | None, digits: int = 3) -> str:
    """Format a number for a table: ``-`` for None/NaN, else ``digits`` significant digits."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float) and math.isinf(value):
        return "∞"
    return f"{value:.{digits}g}"


def mean_pm_std(values: Iterable[float], digits: int = 3) -> str:
    """``mean ± std`` of the finite values with ``digits`` decimals, ``-`` when there are none."""
    m, s = mean_std(values)
    return "-" if math.isnan(m) else f"{m:.{digits}f} ± {s:.{digits}f}"
