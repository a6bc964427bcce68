"""``python -m experiments bench``: every benchmark, one table of ratios against floors and anchors.

Each benchmark module (``experiments.benchmarks.bench_*``) runs as its own process, as a person
would run it (``python -m experiments.benchmarks.bench_sampling ...``), so that one benchmark's
imports, memory and threads do not weigh on the next; its Markdown output is read back and each
measurement is set against the floor or anchor the benchmark itself measures in the same run
(NumPy's normal draw, Flower's FedAvg, the replies' size, ...), or, where a benchmark measures none,
against the figure documented for it (marked *documented*). The table printed at the end::

    | benchmark | measured | floor / anchor | ratio |

The profiles size the runs: ``quick`` (``--quick``) finishes in a few minutes on 2 cores,
``full`` runs the commands of docs/BENCHMARKS.md and docs/SCALE.md (hours), ``smoke`` is the
tests' (tiny sizes, in-process benchmarks only by default).

    python -m experiments bench --quick
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TextIO

from deploy.launcher import project_root

__all__ = ["BENCHMARKS", "Benchmark", "Result", "markdown_tables", "run_suite", "suite_table"]


@dataclass(frozen=True)
class Result:
    """One measurement against its floor or anchor.

    ``anchor`` is ``None`` where the benchmark has nothing to compare the measurement with;
    ``printed_ratio`` is the benchmark's own ratio where it prints one from unrounded figures.
    """

    benchmark: str
    measured: float
    anchor: float | None
    unit: str
    anchor_name: str = ""
    printed_ratio: float | None = None

    @property
    def ratio(self) -> float | None:
        """``measured / anchor`` (``None`` without an anchor or with a zero one)."""
        if self.printed_ratio is not None:
            return self.printed_ratio
        if self.anchor is None or self.anchor == 0:
            return None
        return self.measured / self.anchor


def markdown_tables(text: str) -> list[list[dict[str, str]]]:
    """Return every Markdown table of ``text`` as rows of ``{header: cell}``.

    A table is a run of lines starting with ``|``: a header, a ``---`` separator, rows.
    """
    tables: list[list[dict[str, str]]] = []
    block: list[list[str]] = []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            block.append([cell.strip() for cell in line.strip().strip("|").split("|")])
            continue
        if len(block) >= 2:
            header = block[0]
            tables.append([dict(zip(header, row, strict=False)) for row in block[2:]])
        block = []
    return tables


def number(cell: str) -> float:
    """Return the first number of a table cell (``"1,234.5 ms"`` -> 1234.5)."""
    match = re.search(r"-?[\d,]*\.?\d+(?:e[-+]?\d+)?", cell)
    if match is None:
        raise ValueError(f"no number in table cell {cell!r}")
    return float(match.group(0).replace(",", ""))


def column(row: dict[str, str], start: str) -> str:
    """Return the cell of ``row`` whose header starts with ``start``."""
    for key, value in row.items():
        if key.startswith(start):
            return value
    raise KeyError(f"no column starting with {start!r} in {list(row)}")


# -- what each benchmark's output says --------------------------------------------------------
def sampling_results(out: str) -> list[Result]:
    """Read Laplace draws against NumPy's normals, and a fresh CSPRNG seed against a reused one."""
    results = [Result(f"sampling: Euclidean Laplace, n = {row['n']}", number(row["ours (ms)"]),
                      number(row["normals (ms)"]), "ms", "NumPy normals")
               for row in markdown_tables(out)[0]]
    reused = re.search(r"one reused generator:\s+([\d.]+) ms", out)
    fresh = re.search(r"device_rng\(\) per release \(CSPRNG\):\s+([\d.]+) ms", out)
    if reused and fresh:
        results.append(Result("sampling: device_rng() per release", float(fresh.group(1)),
                              float(reused.group(1)), "ms", "one reused generator"))
    return results


def release_results(out: str) -> list[Result]:
    """Read a device's whole release against as many float32 normals as the model's size."""
    return [Result(f"release: {row['mechanism']}, n = {row['n']}",
                   number(row["release path (ms)"]), number(row["normals float32 (ms)"]), "ms",
                   "NumPy float32 normals")
            for row in markdown_tables(out)[0]]


#: bench_aggregate's heading of each arm's table, and its closing ratio line.
_AGGREGATE_ARM = re.compile(r"^aggregate_fit, arm (\S+) ", re.MULTILINE)
_AGGREGATE_RATIO = re.compile(
    r"robust / mean, CPU time: ([\d.]+) s / ([\d.]+) s = ([\d.]+)")


def aggregate_results(out: str) -> list[Result]:
    """Read the robust arm's CPU time against the plain mean's, and each arm's peak memory."""
    results = []
    for arm, table in zip(_AGGREGATE_ARM.findall(out), markdown_tables(out), strict=True):
        rows = {row["measure"]: row for row in table}
        size = number(rows["replies' size"]["value"])
        # The benchmark's own ratio: its table rounds the sizes to whole MiB.
        results += [Result(f"aggregate_fit {arm}: {name}", number(row["value"]), size, "MiB",
                           "replies' size", number(row["/ replies' size"]))
                    for name, row in rows.items() if name.startswith("peak extra memory")]
    ratio = _AGGREGATE_RATIO.search(out)
    if ratio is not None:
        robust, mean, printed = (float(g) for g in ratio.groups())
        results.append(Result("aggregate_fit: robust clusters, CPU time", robust, mean, "CPU s",
                              "the plain mean's", printed))
    return results


def fab_results(out: str) -> list[Result]:
    """Read the FAB built from gpfl's copy of the app against Flower's from the folder."""
    rows = markdown_tables(out)[0]
    direct = number(column(rows[0], "CPU"))
    copy, build = (number(part) for part in column(rows[1], "CPU").split("+"))
    return [Result("FAB: gpfl's copy + build", copy + build, direct, "CPU s",
                   "build from the app folder")]


def round_results(out: str) -> list[Result]:
    """Read seconds per round of each run against Flower's FedAvg on the same SuperLink."""
    results = []
    for table in markdown_tables(out):
        if not table:
            continue
        if "parameters" in table[0]:
            fedavg = {row["parameters"]: number(row["s / round"]) for row in table
                      if next(iter(row.values())).startswith("Flower")}
            for row in table:
                name = next(iter(row.values()))
                results.append(Result(f"round: {name}, P = {row['parameters']}",
                                      number(row["s / round"]), fedavg[row["parameters"]],
                                      "s / round", "Flower FedAvg"))
                results.append(Result(f"round: {name}, P = {row['parameters']}, peak RSS a "
                                      "device", number(row["peak RSS a device, MiB"]), None,
                                      "MiB"))
        elif "s / round" in table[0]:
            base = number(table[0]["s / round"])
            results += [Result(f"round: {next(iter(row.values()))}", number(row["s / round"]),
                               base, "s / round", "Flower FedAvg") for row in table]
    return results


def scale_results(out: str) -> list[Result]:
    """Read the Simulation Engine's seconds per round against FedAvg's at the same users.

    At each larger number of users, also the later rounds (round 1 holds the engine's start)
    against the first number's.
    """
    table = markdown_tables(out)[-1]
    fedavg: dict[str, float] = {}
    first_later: dict[str, float] = {}
    first_users = column(table[0], "users")
    results = []
    for row in table:
        app, users = next(iter(row.values())), column(row, "users")
        per_round = number(column(row, "s / round, mean"))
        if app.startswith("Flower"):
            fedavg[users] = per_round
        results.append(Result(f"scale: {app}, {users} users", per_round, fedavg.get(users),
                              "s / round", "Flower FedAvg"))
        later = column(row, "later rounds, s")
        if later in ("", "nan"):
            continue
        if users == first_users:
            first_later[app] = number(later)
        elif app in first_later:
            results.append(Result(f"scale: {app}, later rounds at {users} users", number(later),
                                  first_later[app], "s / round", f"at {first_users} users"))
    return results


#: A device's memory documented in docs/SCALE.md, section 5 (PSS, 10-100 devices): bench_deploy
#: measures no floor of its own, so its figure is set against the documented one.
DOCUMENTED_DEVICE_MB = 164.0


def deploy_results(out: str) -> list[Result]:
    """Read a device's memory (PSS) against the documented figure, and seconds per round."""
    results = []
    for row in markdown_tables(out)[-1]:
        devices = next(iter(row.values()))
        if not column(row, "MB / device"):
            continue  # a skipped or failed size: its error is in the benchmark's own output
        results.append(Result(f"deploy: {devices} devices, memory a device",
                              number(column(row, "MB / device")), DOCUMENTED_DEVICE_MB, "MB",
                              "documented (SCALE.md)"))
        results.append(Result(f"deploy: {devices} devices, round",
                              number(column(row, "s / round")), None, "s / round"))
    return results


@dataclass(frozen=True)
class Benchmark:
    """A benchmark module, its arguments in each profile and how to read its output."""

    name: str
    module: str
    args: dict[str, tuple[str, ...]]
    read: Callable[[str], list[Result]]
    #: Started processes of its own (a SuperLink, devices, Ray): not in the ``smoke`` profile.
    processes: bool = False


#: Every benchmark, in the order ``bench`` runs them (the cheap ones first).
BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark("sampling", "experiments.benchmarks.bench_sampling",
              {"smoke": ("--repeats", "1"), "quick": ("--repeats", "5"),
               "full": ("--repeats", "25")}, sampling_results),
    Benchmark("release", "experiments.benchmarks.bench_release",
              {"smoke": ("--repeats", "1", "--sizes", "1000"),
               "quick": ("--repeats", "3", "--sizes", "1000000"),
               "full": ("--repeats", "3")}, release_results),
    Benchmark("aggregate", "experiments.benchmarks.bench_aggregate",
              {"smoke": ("--replies", "10", "--params", "1000", "--repeats", "1"),
               "quick": ("--replies", "20", "--params", "100000", "--repeats", "2"),
               "full": ()}, aggregate_results),
    Benchmark("fab", "experiments.benchmarks.bench_fab", {"smoke": (), "quick": (), "full": ()},
              fab_results),
    Benchmark("round", "experiments.benchmarks.bench_round",
              {"smoke": ("--supernodes", "1", "--rounds", "1"),
               "quick": ("--supernodes", "2", "--rounds", "2"),
               "full": ("--supernodes", "8", "--rounds", "5", "--with-default-gpfl")},
              round_results, processes=True),
    Benchmark("round-model", "experiments.benchmarks.bench_round",
              {"smoke": ("--supernodes", "1", "--rounds", "1", "--parameters", "1000"),
               "quick": ("--supernodes", "2", "--rounds", "1", "--parameters", "1000000"),
               "full": ("--supernodes", "2", "--rounds", "2", "--parameters", "1000000",
                        "10000000")},
              round_results, processes=True),
    Benchmark("scale", "experiments.benchmarks.bench_scale",
              {"smoke": ("--users", "4", "--per-round", "2", "--rounds", "1", "--repeats", "1"),
               "quick": ("--users", "50", "500", "--per-round", "10", "--rounds", "3",
                         "--repeats", "1"),
               "full": ("--users", "10000", "100000", "--per-round", "1000", "--rounds", "3",
                        "--repeats", "1")},
              scale_results, processes=True),
    Benchmark("deploy", "experiments.benchmarks.bench_deploy",
              {"smoke": ("--devices", "1", "--rounds", "1"),
               "quick": ("--devices", "4", "--rounds", "2"),
               "full": ("--devices", "10", "50", "100", "--rounds", "3", "--max-memory-gb", "8")},
              deploy_results, processes=True),
)


def run_benchmark(bench: Benchmark, profile: str, stream: TextIO,
                  timeout: float | None = None) -> list[Result]:
    """Run one benchmark in its own process, echo its output to ``stream``, return its results.

    Raises
    ------
    RuntimeError
        If the process fails (its exit status and last lines) or prints nothing readable.
    """
    argv = [sys.executable, "-m", bench.module, *bench.args[profile]]
    print(f"\n## {bench.name}: {' '.join(argv[1:])}", file=stream, flush=True)
    started = time.monotonic()
    done = subprocess.run(argv, cwd=project_root(), capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=timeout, check=False)
    stream.write(done.stdout)
    print(f"({time.monotonic() - started:.0f} s)", file=stream, flush=True)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-5:])
        raise RuntimeError(f"{bench.module} exited with {done.returncode}: {tail}")
    results = bench.read(done.stdout)
    if not results:
        raise RuntimeError(f"{bench.module} printed no table the suite can read")
    return results


def _cell(value: float | None, unit: str) -> str:
    return "-" if value is None else f"{value:,.4g} {unit}"


def suite_table(results: Iterable[Result], failed: Sequence[str] = ()) -> str:
    """Return the Markdown table of ``results`` (and a row for each failed benchmark)."""
    lines = ["| benchmark | measured | floor / anchor | ratio |", "| --- | ---: | ---: | ---: |"]
    for r in results:
        anchor = _cell(r.anchor, r.unit) + (f" ({r.anchor_name})" if r.anchor_name else "")
        ratio = "-" if r.ratio is None else f"{r.ratio:.2f}"
        lines.append(f"| {r.benchmark} | {_cell(r.measured, r.unit)} | {anchor} | {ratio} |")
    lines += [f"| {name}: FAILED | | | |" for name in failed]
    return "\n".join(lines)


def run_suite(profile: str, names: Sequence[str] | None = None, stream: TextIO | None = None,
              timeout: float | None = None) -> tuple[list[Result], list[str]]:
    """Run the benchmarks (all of ``profile``'s, or ``names``) and print the table.

    Parameters
    ----------
    profile : str
        ``"quick"``, ``"full"`` or ``"smoke"`` (the tests': only the in-process benchmarks
        unless ``names`` asks for others).
    names : sequence of str, optional
        Benchmarks to run (`Benchmark.name`), in the suite's order.
    stream : TextIO, optional
        Where the benchmarks' output and the table go (standard output by default).
    timeout : float, optional
        Seconds each benchmark may run.

    Returns
    -------
    tuple of (list of Result, list of str)
        The results, and the names of the benchmarks that failed.

    Raises
    ------
    ValueError
        For a name no benchmark has.
    """
    out = stream or sys.stdout
    known = {b.name for b in BENCHMARKS}
    unknown = sorted(set(names or ()) - known)
    if unknown:
        raise ValueError(f"no benchmark named {', '.join(unknown)}; known: {', '.join(known)}")
    chosen = [b for b in BENCHMARKS
              if (b.name in names if names else profile != "smoke" or not b.processes)]
    results: list[Result] = []
    failed: list[str] = []
    for bench in chosen:
        try:
            results += run_benchmark(bench, profile, out, timeout)
        except (RuntimeError, subprocess.TimeoutExpired, ValueError, KeyError,
                IndexError) as err:
            # One broken benchmark must not hide the others' figures.
            print(f"{bench.name}: FAILED: {err}", file=out, flush=True)
            failed.append(bench.name)
    print(f"\n{suite_table(results, failed)}", file=out, flush=True)
    return results, failed
