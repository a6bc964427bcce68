"""The one loop every experiment runs: a grid of configurations, a measurement each, a table.

An experiment module declares itself as an `Experiment` and holds nothing else than its grid,
its measurement, its table, its figures and its section of docs/RESULTS.md:

* ``grid(ctx)`` lists the configurations (`Cell`) in the order they run;
* ``perform(ctx, cell)`` runs one of them; by default `Context.run` on the cell's federation,
  which reuses a finished federation from the cache;
* ``measure(cell, result)`` turns the result into the ``results.csv`` row of that cell;
* ``shown`` names the columns that a finished cell's progress line shows;
* ``figures(ctx, rows, runs)`` draws the PNGs from the rows (as read back from ``results.csv``,
  so a figure shows what the CSV holds) and, where a figure needs more, from the results;
* ``report(rows)`` writes the experiment's section of docs/RESULTS.md from its rows (the
  papers' numbers, ours, the claims and what differs), and ``paper`` names what it reproduces
  (`experiments.core.report` assembles the sections).

`run` does the rest, the same way for every experiment: one configuration at a time, one
progress line per finished configuration, ``results.csv`` with the declared ``columns``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.progress import Progress as RichProgress

from experiments.core.common import Context, FederationSpec
from experiments.core.provenance import jsonable
from experiments.core.sanity import Check
from experiments.core.tables import fmt, read_csv, write_csv

__all__ = ["ENGINES", "Cell", "Experiment", "Progress", "Run", "run"]


@dataclass(frozen=True)
class Cell:
    """One configuration of an experiment's grid.

    Attributes
    ----------
    label : str
        Names the configuration on its progress line.
    keys : Mapping[str, Any]
        The values that tell this configuration from the others (``nu``, ``k``, ``seed``...):
        what ``measure`` needs besides the result, usually the first columns of its row.
    spec : FederationSpec or None
        The federation that the default ``perform`` runs; ``None`` for an experiment that
        runs no federation (the DLG audit).
    """

    label: str
    keys: Mapping[str, Any]
    spec: FederationSpec | None = None

    @classmethod
    def of(cls, spec: FederationSpec, **keys: Any) -> Cell:
        """Make a cell that runs ``spec``, labelled like it."""
        return cls(spec.label, keys, spec)


Run = tuple[Cell, Any]
"""A finished configuration: its cell and what ``perform`` returned (a run's summary)."""


#: What an experiment's ``engine`` may say, and how the report says it.
ENGINES = {
    "simulation": "this repository's ServerApp and ClientApp, one virtual SuperNode per user, "
                  "on Flower's Simulation Engine (Ray) or on the direct engine (the same apps "
                  "and Flower's server loop in one process, `deploy/direct_grid.py`; "
                  "the same results bit for bit, `tests/test_experiments_pairing.py`); each "
                  "section's note says which",
    "in-process": "gpfl's own client, mechanisms or trainer called in one process, without a "
                  "Flower engine",
}


def _perform_federation(ctx: Context, cell: Cell) -> dict[str, Any]:
    if cell.spec is None:
        raise ValueError(f"cell {cell.label!r} has no federation: give the experiment a perform")
    return ctx.run(cell.spec)


def _no_figures(ctx: Context, rows: list[dict[str, str]], runs: list[Run]) -> None:
    """Draw nothing."""


def _rows_only(rows: list[dict[str, str]]) -> list[str]:
    """Say how many rows there are: an experiment without a section of its own."""
    return [f"{len(rows)} rows in its `results.csv`."]


@dataclass(frozen=True)
class Experiment:
    """What an experiment declares; `run` does the rest.

    Attributes
    ----------
    name : str
        The command-line name (``python -m experiments NAME``).
    columns : Sequence[str]
        The header of ``results.csv``; a row with another key is an error.
    grid : callable
        ``grid(ctx) -> list[Cell]``: the configurations, in the order they run.
    measure : callable
        ``measure(cell, result) -> dict``: the row of a finished configuration.
    figures : callable
        ``figures(ctx, rows, runs)``: draw the figures under ``ctx.figures``.
    shown : Sequence[str]
        The columns of a row that its progress line shows.
    describe : callable or None
        ``describe(row, result) -> str``: a progress message of its own instead of
        ``shown`` (for what the row does not hold).
    perform : callable
        ``perform(ctx, cell) -> result``: run one configuration (default: its federation,
        through the cache).
    report : callable
        ``report(rows) -> list of Markdown lines``: the experiment's section of
        docs/RESULTS.md, from the rows of its ``results.csv`` (default: a line saying where
        they are).
    paper : str
        What the experiment reproduces (a paper's figure or table), for the report's index.
    engine : str
        What runs its configurations, for the report: ``"simulation"`` (the ServerApp and
        ClientApp on Flower's Simulation Engine) or ``"in-process"`` (gpfl's own client,
        mechanisms or trainer called in this process, no Flower engine).
    profiles : Mapping
        An in-process experiment's settings per profile (``PROFILES``), recorded with each
        row so that ``meta.json`` says what ran; a federation's run config says it already.
    volatile : Mapping
        Columns that a rerun cannot reproduce (a timing, a memory peak), each with the reason:
        ``python -m experiments verify`` compares every other column exactly.
    checks : Sequence of Check
        Relations every row must satisfy (`experiments.core.sanity`), applied by ``verify``
        and the report to the committed rows.
    """

    name: str
    columns: Sequence[str]
    grid: Callable[[Context], list[Cell]]
    measure: Callable[[Cell, Any], dict[str, Any]]
    figures: Callable[[Context, list[dict[str, str]], list[Run]], None] = _no_figures
    shown: Sequence[str] = ()
    describe: Callable[[dict[str, Any], Any], str] | None = None
    perform: Callable[[Context, Cell], Any] = _perform_federation
    report: Callable[[list[dict[str, str]]], list[str]] = _rows_only
    paper: str = "-"
    engine: str = "simulation"
    profiles: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    volatile: Mapping[str, str] = field(default_factory=dict)
    checks: Sequence[Check] = ()

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"engine must be one of {sorted(ENGINES)}, got {self.engine!r}")
        unknown = sorted(set(self.volatile).union(*(c.columns for c in self.checks))
                         - set(self.columns))
        if unknown:
            raise ValueError(f"volatile or checked columns {unknown} are not columns of "
                             f"{self.name}")

    def settings(self, ctx: Context, cell: Cell) -> dict[str, Any]:
        """Return what a row's configuration ran with, as JSON data, for ``meta.json``.

        A federation: its SuperNode count and full run config. In process: the cell's keys
        and the profile's settings (the code they call is the commit's).
        """
        if cell.spec is not None:
            return {"federation": {"supernodes": cell.spec.supernodes,
                                   "run_config": jsonable(cell.spec.config)}}
        profile = self.profiles.get(ctx.profile)
        return {"keys": jsonable(dict(cell.keys)),
                **({"profile": jsonable(dict(profile))} if profile is not None else {})}

    def message(self, row: dict[str, Any], result: Any) -> str:
        """Return the progress message of a finished configuration."""
        if self.describe is not None:
            return self.describe(row, result)
        return ", ".join(f"{column.replace('_', ' ')} {_show(row.get(column))}"
                         for column in self.shown)


def _seconds(result: Any, started: float) -> float:
    """Return what a row cost: its federation's time when it ran, if read from the cache."""
    if isinstance(result, Mapping) and "_wall_s" in result:
        return float(result["_wall_s"])
    return time.monotonic() - started


def _show(value: Any) -> str:
    return fmt(value) if isinstance(value, float) else "-" if value is None else str(value)


def run(experiment: Experiment, ctx: Context) -> list[dict[str, Any]]:
    """Run every configuration of ``experiment``; write ``results.csv`` and the figures.

    Returns
    -------
    list of dict
        The rows, in grid order, as ``measure`` made them (not yet formatted for the CSV).
    """
    cells = experiment.grid(ctx)
    rows: list[dict[str, Any]] = []
    runs: list[Run] = []
    ctx.row_settings.clear()
    with Progress(experiment.name, len(cells), ctx.stream) as progress:
        for cell in cells:
            started = time.monotonic()
            result = experiment.perform(ctx, cell)
            row = experiment.measure(cell, result)
            rows.append(row)
            runs.append((cell, result))
            ctx.row_settings.append({"label": cell.label,
                                     "settings": experiment.settings(ctx, cell),
                                     "seconds": round(_seconds(result, started), 2)})
            cached = isinstance(result, Mapping) and result.get("_cached")
            progress.step(cell.label,
                          experiment.message(row, result) + (" [cached]" if cached else ""))
    path = write_csv(ctx.out / "results.csv", rows, experiment.columns)
    experiment.figures(ctx, read_csv(path), runs)
    return rows


class Progress:
    """One line per finished configuration, under a live progress bar on a terminal.

    The lines are the same with or without a terminal (a CI log gets them alone): the
    experiment's name, how many configurations are done out of how many, the configuration
    and its message, the time elapsed and an estimate of the time left. On a terminal,
    rich draws a bar below them while the experiment runs.

    Parameters
    ----------
    name : str
        The experiment's name, printed on every line.
    total : int
        Configurations to run.
    stream : file-like, optional
        Where the lines go (default: standard output).
    """

    def __init__(self, name: str, total: int, stream: TextIO | None = None) -> None:
        self.name = name
        self.total = max(total, 1)
        self.count = 0
        self.start = time.monotonic()
        # soft_wrap: a long line stays one line in a log instead of being cut at 80 columns.
        self.console = Console(file=stream if stream is not None else sys.stdout,
                               soft_wrap=True, highlight=False, markup=False, emoji=False)
        self._bar: RichProgress | None = None
        if self.console.is_terminal:
            self._bar = RichProgress(TextColumn("{task.description}"), BarColumn(),
                                     MofNCompleteColumn(), TimeElapsedColumn(),
                                     TimeRemainingColumn(), console=self.console,
                                     transient=True)
            self._task = self._bar.add_task(name, total=self.total)

    def __enter__(self) -> Progress:
        if self._bar is not None:
            self._bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()

    def step(self, label: str, message: str) -> None:
        """Count one configuration as finished and print its line."""
        self.count += 1
        elapsed = time.monotonic() - self.start
        left = elapsed / self.count * (self.total - self.count)
        timing = f"{_duration(elapsed)} elapsed" + (
            f", ~{_duration(left)} left" if self.count < self.total else "")
        self.console.print(f"{self.name} {self.count}/{self.total} {label}: {message} ({timing})")
        if self._bar is not None:
            self._bar.advance(self._task)

    def note(self, message: str) -> None:
        """Print a line that does not count as a configuration."""
        self.console.print(f"{self.name}: {message}")


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"
