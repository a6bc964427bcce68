"""Rows in and out: ``results.csv``, the numbers read off a run's summary, and table cells."""

from __future__ import annotations

import csv
import io
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from scipy import stats

from mechanisms.atomic_file import write_atomic

#: The confidence level of every interval the tables and the report print.
CI_LEVEL = 0.95
#: How the tables name their intervals.
CI_NAME = "mean ± half-width of the two-sided 95 % Student-t interval over seeds"

__all__ = [
    "best_entry",
    "excludes_zero",
    "fmt",
    "last_entry",
    "mean_ci",
    "mean_pm_ci",
    "paired_difference",
    "read_csv",
    "spends_of",
    "verdict",
    "write_csv",
]


def write_csv(path: Path, rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> Path:
    """Write ``rows`` with a header row of ``columns`` (extra keys are an error)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for row in rows:
        extra = sorted(set(row) - set(columns))
        if extra:
            raise ValueError(f"row has keys that are not columns of {path.name}: {extra}")
    # Atomic: an interrupted run never leaves half a results.csv.
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(columns), extrasaction="raise")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: _cell(row.get(k)) for k in columns})
    write_atomic(path, buffer.getvalue(), durable=False, mode=0o644)
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


def fmt(value: float | None, digits: int = 3) -> str:
    """Format a number for a table: ``-`` for None/NaN, else ``digits`` significant digits."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float) and math.isinf(value):
        return "∞"
    return f"{value:.{digits}g}"


def _finite(values: Iterable[float | None]) -> list[float]:
    return [float(v) for v in values if v is not None and math.isfinite(float(v))]


def mean_ci(values: Iterable[float | None], level: float = CI_LEVEL) -> tuple[float, float, int]:
    """Mean, half-width of its two-sided Student-t interval, and the number of finite values.

    The interval is mean ± t_{(1+level)/2, n-1} · s / √n, s the sample standard deviation: it
    assumes the seeds' values are independent draws of a roughly normal quantity, which is
    what a seed buys (its own data draw, noise, sampling and initialisation). The
    half-width is NaN for fewer than two values (no interval can be given) and 0 when every
    value is the same.
    """
    finite = _finite(values)
    n = len(finite)
    if n == 0:
        return math.nan, math.nan, 0
    mean = statistics.fmean(finite)
    if n == 1:
        return mean, math.nan, 1
    sd = statistics.stdev(finite)
    half = float(stats.t.ppf((1.0 + level) / 2.0, n - 1)) * sd / math.sqrt(n)
    return mean, half, n


def mean_pm_ci(values: Iterable[float | None], digits: int = 3, *, seeds: bool = False) -> str:
    """``mean ± half-width`` (see `mean_ci`) with ``digits`` decimals; ``-`` for no values.

    One value prints as ``mean (1 seed)``: no interval can be given. ``seeds`` appends the
    number of values, ``(n)``.
    """
    mean, half, n = mean_ci(values)
    if n == 0:
        return "-"
    if n == 1:
        return f"{mean:.{digits}f} (1 seed)"
    text = f"{mean:.{digits}f} ± {half:.{digits}f}"
    return f"{text} ({n})" if seeds else text


def paired_difference(a: Mapping[Any, float], b: Mapping[Any, float],
                      level: float = CI_LEVEL) -> tuple[float, float, int]:
    """`mean_ci` of a − b over the keys (seeds) both have finite values for.

    Pairing by seed removes what two settings share on one seed (the data draw, the devices
    asked each round: experiments draw them by name, see `experiments.core.common`), so the
    interval of a difference is narrower than the two intervals side by side suggest.
    """
    keys = [k for k in a if k in b and math.isfinite(a[k]) and math.isfinite(b[k])]
    return mean_ci([a[k] - b[k] for k in keys], level)


def verdict(mean: float, half: float, n: int, digits: int = 3) -> str:
    """How a difference's interval reads: ``+0.012 [+0.004, +0.020], n = 5``."""
    if n == 0:
        return "no paired seeds"
    if n == 1 or math.isnan(half):
        return f"{mean:+.{digits}f} (1 seed, no interval)"
    return f"{mean:+.{digits}f} [{mean - half:+.{digits}f}, {mean + half:+.{digits}f}], n = {n}"


def excludes_zero(mean: float, half: float, n: int) -> bool:
    """Whether the interval lies wholly on one side of 0 (needs two values or more)."""
    return n >= 2 and math.isfinite(half) and abs(mean) > half


def wilson(hits: int, n: int) -> tuple[float, float]:
    """Return the Wilson score 95 % interval of a proportion ``hits / n`` (SciPy's).

    ``(nan, nan)`` for ``n = 0``.
    """
    if n == 0:
        return (math.nan, math.nan)
    from scipy.stats import binomtest

    interval = binomtest(hits, n).proportion_ci(confidence_level=0.95, method="wilson")
    return (float(interval.low), float(interval.high))
