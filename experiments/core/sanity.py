"""Relations an experiment's raw rows must satisfy, whatever the numbers are.

A row can be internally impossible (a largest distance smaller than one it is the largest of,
an accuracy above 1, a delivered round after the last round) and still be printed by the report
as if it were a result. Each experiment declares its relations as `Check` values
(`experiments.core.runner.Experiment.checks`); ``python -m experiments verify`` and the report
apply them to every row of the committed ``results.csv``. A check passes over an empty cell
(``""``: not measured, as the spend of a run without noise) and names the row, the columns
and the values when it fails.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

__all__ = ["Check", "at_most", "equals_max", "flag", "problems", "within"]

Row = Mapping[str, str]


@dataclass(frozen=True)
class Check:
    """One relation between the columns of a row.

    Attributes
    ----------
    says : str
        The relation in words, for the message of a row that breaks it.
    holds : callable
        ``holds(row) -> bool`` on a row whose ``columns`` are all filled.
    columns : tuple of str
        The columns it reads; a row with any of them empty is not checked.
    """

    says: str
    holds: Callable[[Row], bool]
    columns: tuple[str, ...]


def _number(row: Row, column: str) -> float:
    return float(row[column])


def within(columns: str | Sequence[str], low: float, high: float) -> list[Check]:
    """Each of ``columns`` lies in ``[low, high]`` (an accuracy, a rate, an AUC)."""
    names = [columns] if isinstance(columns, str) else list(columns)

    def inside(column: str) -> Callable[[Row], bool]:
        return lambda row: low <= _number(row, column) <= high

    return [Check(f"{c} in [{low:g}, {high:g}]", inside(c), (c,)) for c in names]


def at_most(small: str, large: str) -> Check:
    """``small`` ≤ ``large`` (a median against a maximum, a round against the last one)."""
    return Check(f"{small} <= {large}",
                 lambda row: _number(row, small) <= _number(row, large), (small, large))


def equals_max(largest: str, parts: Sequence[str]) -> Check:
    """``largest`` is the largest of ``parts``, exactly as the CSV writes them."""
    return Check(f"{largest} = max({', '.join(parts)})",
                 lambda row: _number(row, largest) == max(_number(row, p) for p in parts),
                 (largest, *parts))


def flag(column: str) -> Check:
    """``column`` is 0 or 1 (a yes or a no)."""
    return Check(f"{column} in {{0, 1}}", lambda row: row[column] in ("0", "1"), (column,))


def problems(rows: Iterable[Row], checks: Iterable[Check]) -> list[str]:
    """Return one message per row and check it breaks (a value that is no number breaks it)."""
    out: list[str] = []
    listed = list(checks)
    for index, row in enumerate(rows):
        for check in listed:
            if any(row.get(c, "") == "" for c in check.columns):
                continue
            try:
                ok = check.holds(row)
            except ValueError:
                ok = False
            if not ok:  # a NaN breaks every relation: comparisons with it are false
                values = ", ".join(f"{c}={row[c]}" for c in check.columns)
                out.append(f"row {index}: {check.says} fails ({values})")
    return out
