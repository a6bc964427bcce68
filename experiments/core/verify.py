"""``python -m experiments verify``: rerun committed rows and compare them with what is published.

For each experiment with raw files under the given folder (default ``docs/results``), in order:

1. **Provenance** (`experiments.core.provenance.problems`): ``meta.json`` names a commit of this
   repository's history, from a clean checkout, and the SHA-256 of ``results.csv`` matches the
   file. An edited raw value fails here, whatever else was edited.
2. **Sanity** (`experiments.core.sanity`): every row satisfies the relations its experiment
   declares.
3. **Rerun**: ``--rows K`` rows chosen at random (the seed is printed, ``--seed`` repeats a
   choice; ``--row I`` names rows) are run again, alone and past every cache, with the profile
   and seeds the raw files were made with and the code checked out now; each rerun row must
   equal the committed one in every column as ``results.csv`` writes it (six significant digits),
   except the columns the experiment declares volatile (timings), which are named. The row's
   configuration is rebuilt from the grid and must equal the settings ``meta.json`` recorded
   for it: a grid that changed under the raw files fails before anything runs.
   ``--max-seconds S`` draws only among the rows that took at most S seconds when they ran (the
   cheapest row if none did): how CI checks one cheap row of every experiment.

Exact equality holds because every configuration is seeded, its noise included (the
experiments' devices opt in to seeded noise), and runs in one process in a fixed order: the
direct engine gives the numbers of the Simulation Engine bit for bit
(``tests/test_experiments_pairing.py``), on the same **float environment**
(`experiments.core.provenance.float_environment`: the CPU and the instruction sets torch and
NumPy dispatch to, recorded in ``meta.json``). Another CPU's kernels round a training step
differently, and a long noisy run carries that last bit into its accuracy (a digits CNN row made
on another machine gave accuracy 0.883, rerun on one with AVX-512 kernels 0.864, with the same
package versions). So a rerun row that
differs where the raw files were made on another float environment (or one not recorded) is
**inconclusive**: printed with both environments, not a failure. Where the environments are the
same, any difference fails. Provenance and the relations are checked on every machine.
"""

from __future__ import annotations

import random
import secrets
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from experiments.core.common import Context
from experiments.core.provenance import float_environment
from experiments.core.provenance import problems as provenance_problems
from experiments.core.registry import EXPERIMENTS, load
from experiments.core.runner import Cell, Experiment
from experiments.core.sanity import problems as sanity_problems
from experiments.core.tables import read_csv, write_csv

__all__ = ["Verdict", "choose_rows", "load_raw", "verify", "verify_experiment"]


@dataclass
class Verdict:
    """What ``verify`` found for one experiment.

    Attributes
    ----------
    name : str
        The experiment.
    failures : list of str
        Each thing that failed (provenance, a relation, a row's column); empty when it passed.
    rows : list of int
        The rows rerun.
    notes : list of str
        What was left out and why (volatile columns, a row needing a data file).
    inconclusive : list of str
        Rerun rows that differ from raw files made on another float environment: neither
        confirmed nor failed.
    """

    name: str
    failures: list[str] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    inconclusive: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Whether nothing failed."""
        return not self.failures


def load_raw(folder: Path) -> tuple[list[dict[str, str]], dict[str, Any]]:
    """Return the rows of ``folder/results.csv`` and its ``meta.json``."""
    import json

    meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
    return read_csv(folder / "results.csv"), meta


def choose_rows(meta: dict[str, Any], count: int, rng: random.Random,
                max_seconds: float | None = None) -> list[int]:
    """Draw ``count`` row indices at random, among the cheap ones when ``max_seconds`` is set.

    With ``max_seconds``, only rows recorded as taking at most that long are drawn; when no
    row is that cheap, the cheapest one is.
    """
    records = meta.get("row_settings", [])
    indices = list(range(len(records)))
    if max_seconds is not None:
        cheap = [i for i in indices if float(records[i].get("seconds", 0.0)) <= max_seconds]
        if not cheap and indices:
            cheap = [min(indices, key=lambda i: float(records[i].get("seconds", 0.0)))]
        indices = cheap
    return sorted(rng.sample(indices, min(count, len(indices))))


def _formatted(row: dict[str, Any], columns: Sequence[str], folder: Path) -> dict[str, str]:
    """Return ``row`` as ``results.csv`` writes it (the same formatting, read back)."""
    path = write_csv(folder / "rerun.csv", [row], columns)
    return read_csv(path)[0]


def _first_difference(recorded: Any, rebuilt: Any, path: str = "") -> str:
    """Name the first key at which two settings records differ."""
    if isinstance(recorded, dict) and isinstance(rebuilt, dict):
        for key in sorted(set(recorded) | set(rebuilt)):
            if recorded.get(key) != rebuilt.get(key):
                return _first_difference(recorded.get(key), rebuilt.get(key), f"{path}/{key}")
    return f"{path or '/'}: recorded {recorded!r}, now {rebuilt!r}"


def _rerun(experiment: Experiment, ctx: Context, cell: Cell, work: Path) -> dict[str, str]:
    result = experiment.perform(ctx, cell)
    return _formatted(experiment.measure(cell, result), experiment.columns, work)


def verify_experiment(name: str, folder: Path, *, count: int, rng: random.Random,
                      indices: Sequence[int] | None = None, max_seconds: float | None = None,
                      stream: TextIO | None = None) -> Verdict:
    """Check one experiment's raw files and rerun some of its rows; return the verdict."""
    out = stream or sys.stdout
    verdict = Verdict(name)
    experiment = load(name)
    rows, meta = load_raw(folder)
    verdict.failures += [f"provenance: {p}" for p in provenance_problems(folder, meta)]
    verdict.failures += [f"sanity: {p}" for p in sanity_problems(rows, experiment.checks)]
    records = meta.get("row_settings")
    if not isinstance(records, list) or len(records) != len(rows):
        verdict.failures.append("rerun: meta.json has no settings for each row")
        return verdict
    chosen = list(indices) if indices is not None else choose_rows(meta, count, rng,
                                                                     max_seconds)
    if not chosen:
        return verdict
    recorded, here = meta.get("float_environment"), float_environment()
    elsewhere = None if recorded == here else (
        f"made on {_environment(recorded)}, rerun on {_environment(here)}")
    with tempfile.TemporaryDirectory(prefix=f"gpfl-verify-{name}-") as tmp, \
            open(Path(tmp) / "progress.log", "w", encoding="utf-8") as progress:
        work = Path(tmp)
        # The raw files' profile and seeds; a fresh cache, so that every row runs.
        ctx = Context(name=name, out=work / "out", cache=work / "cache",
                      profile=str(meta["profile"]), seeds=meta.get("seeds"), fresh=True,
                      stream=progress)
        cells = experiment.grid(ctx)
        if len(cells) != len(rows):
            verdict.failures.append(f"rerun: the grid now has {len(cells)} configurations, "
                                    f"the raw files {len(rows)} rows")
            return verdict
        for index in chosen:
            if not 0 <= index < len(rows):
                verdict.failures.append(f"rerun: row {index} does not exist ({len(rows)} rows)")
                continue
            cell, record = cells[index], records[index]
            rebuilt = experiment.settings(ctx, cell)
            if cell.label != record["label"] or rebuilt != record["settings"]:
                verdict.failures.append(
                    f"rerun: row {index} ({record['label']}): its configuration changed in the "
                    f"code: {_first_difference(record['settings'], rebuilt)}")
                continue
            started = time.monotonic()
            rerun = _rerun(experiment, ctx, cell, work)
            seconds = time.monotonic() - started
            verdict.rows.append(index)
            differs = [f"{c} committed {rows[index][c]!r}, rerun {rerun[c]!r}"
                       for c in experiment.columns
                       if c not in experiment.volatile and rows[index][c] != rerun[c]]
            compared = len(experiment.columns) - len(experiment.volatile)
            finding = f"rerun: row {index} ({cell.label}): " + "; ".join(differs)
            if differs and elsewhere:
                verdict.inconclusive.append(f"{finding} ({elsewhere})")
            elif differs:
                verdict.failures.append(finding)
            outcome = (f"equal in {compared} columns" if not differs
                       else f"DIFFERS in {len(differs)} of {compared} columns"
                       + (", inconclusive: another float environment" if elsewhere else ""))
            print(f"verify {name} row {index} ({cell.label}): {outcome}"
                  f"{'' if not experiment.volatile else ', volatile not compared: '}"
                  f"{', '.join(experiment.volatile)} ({seconds:.0f} s)", file=out, flush=True)
    return verdict


def verify(root: Path, names: Sequence[str] | None = None, *, count: int = 1,
           seed: int | None = None, indices: Sequence[int] | None = None,
           max_seconds: float | None = None, stream: TextIO | None = None) -> list[Verdict]:
    """Verify the experiments ``names`` (default: every one with raw files under ``root``).

    Prints the seed of the row draw, one line per rerun row and one per experiment.
    """
    out = stream or sys.stdout
    seed = secrets.randbits(32) if seed is None else seed
    print(f"verify: rows drawn with --seed {seed}", file=out, flush=True)
    rng = random.Random(seed)
    chosen = list(names) if names else [n for n in EXPERIMENTS
                                        if (root / n / "results.csv").is_file()]
    verdicts = []
    for name in chosen:
        folder = root / name
        if not (folder / "results.csv").is_file():
            verdicts.append(Verdict(name, [f"no raw files in {folder}"]))
        else:
            verdicts.append(verify_experiment(name, folder, count=count, rng=rng,
                                              indices=indices, max_seconds=max_seconds,
                                              stream=out))
        verdict = verdicts[-1]
        state = "FAILED" if not verdict.ok else "inconclusive" if verdict.inconclusive else "ok"
        print(f"verify {name}: {state} "
              f"({len(verdict.rows)} rows rerun)", file=out, flush=True)
        for failure in verdict.failures:
            print(f"  {failure}", file=out, flush=True)
        for finding in verdict.inconclusive:
            print(f"  inconclusive: {finding}", file=out, flush=True)
    return verdicts


def _environment(recorded: Any) -> str:
    """Describe a recorded float environment in a few words (or say that none was recorded)."""
    if not isinstance(recorded, dict):
        return "a float environment not recorded"
    return (f"{recorded.get('cpu') or '?'} ({recorded.get('machine')}, torch "
            f"{recorded.get('torch_cpu_capability')}, NumPy "
            f"{'+'.join(recorded.get('numpy_simd') or []) or 'baseline'})")
