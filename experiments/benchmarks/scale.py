"""Scale on one machine: ≥ 1,000 virtual users, 100 per round, on Flower's Simulation Engine.

The synthetic task (two groups, Laplace ν = 5, k = 2) with one virtual SuperNode per user; 100
users sampled per round. Reported per configuration: the wall time of the whole launch, the time
to the first finished round (SuperLink, Ray and the apps starting), rounds per minute once
running (from the arrival times of the per-round lines), and the peak resident memory of the
whole process tree (this process, the SuperLink, the simulation process, Ray and its workers),
sampled every 0.5 s with psutil. Scale runs are never taken from the cache: timing is the point.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import psutil

from experiments.core.claims import flow
from experiments.core.common import Context, FederationSpec
from experiments.core.figures import decorate, pyplot, save
from experiments.core.runner import Cell, Experiment, Run
from experiments.core.sanity import at_most
from experiments.core.tables import mean_pm_ci

NAME = "scale"
COLUMNS = ("users", "repeat", "clients_per_round", "rounds", "wall_s", "startup_s",
           "rounds_per_minute", "seconds_per_round", "peak_rss_mb", "peak_processes",
           "final_val_loss")
#: The columns a rerun cannot reproduce: what the run measures of this machine.
TIMINGS = {column: "a time or a memory peak of this machine, under its load"
           for column in ("wall_s", "startup_s", "rounds_per_minute", "seconds_per_round",
                          "peak_rss_mb")}
TIMINGS["peak_processes"] = "the Ray workers alive at the peak, which vary with scheduling"
PROFILES: dict[str, dict[str, Any]] = {
    # Five repeats of each size (seeds 0-4): the table gives each number's 95 % interval.
    "full": {"users": [1000, 5000], "rounds": 30, "repeats": 5},
    "quick": {"users": [1000], "rounds": 10, "repeats": 5},
    "smoke": {"users": [1000], "rounds": 3},
}


class MemoryMonitor:
    """Samples the RSS of this process and all its descendants; keeps the peak of the sum.

    A context manager; sampling runs on a daemon thread every ``interval`` seconds.
    ``samples`` holds ``(seconds since start, total RSS in bytes, processes)``.
    """

    def __init__(self, interval: float = 0.5) -> None:
        self.interval = interval
        self.samples: list[tuple[float, int, int]] = []
        self.peak = 0
        self.peak_processes = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._start = 0.0

    def __enter__(self) -> MemoryMonitor:
        self._start = time.monotonic()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def sample(self) -> int:
        """Take one sample now; return the total RSS in bytes."""
        root = psutil.Process()
        total, count = 0, 0
        for proc in [root, *root.children(recursive=True)]:
            try:
                total += proc.memory_info().rss
                count += 1
            except psutil.Error:  # a worker that ended between the listing and the reading
                continue
        self.samples.append((time.monotonic() - self._start, total, count))
        if total > self.peak:
            self.peak = total
            self.peak_processes = count
        return total

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)


def spec(users: int, rounds: int, seed: int = 0) -> FederationSpec:
    """One scale federation (``seed``: its repeat)."""
    config = {
        "task": "synthetic", "num-hypotheses": 2, "mechanism": "laplace",
        "noise-multiplier": 5.0, "clients-per-round": 100, "num-rounds": rounds,
        # One data draw for every repeat: the experiment times rounds, and a timing does not
        # depend on which samples the users hold.
        "patience": 0, "eval-every": 1, "validation-users": 100, "seed": seed, "data-seed": 0,
    }
    return FederationSpec(f"scale users={users} repeat={seed}", config, users)


def grid(ctx: Context) -> list[Cell]:
    """One federation per size and repeat of the profile."""
    p = PROFILES[ctx.profile]
    return [Cell.of(spec(users, p["rounds"], repeat), users=users, repeat=repeat)
            for users in p["users"] for repeat in range(p.get("repeats", 1))]


def perform(ctx: Context, cell: Cell) -> dict[str, Any]:
    """Launch past the cache, noting when each round's line arrives and sampling memory."""
    assert cell.spec is not None
    arrivals: list[float] = []
    start = time.monotonic()

    def echo(line: str) -> None:
        ctx.log(line)
        if "[gpfl] round " in line and " round 0/" not in line:
            arrivals.append(time.monotonic() - start)

    with MemoryMonitor(interval=0.5) as monitor:
        summary = ctx.launch(cell.spec, echo, engine="simulation")
        monitor.sample()
    return {"summary": summary, "wall": time.monotonic() - start, "arrivals": arrivals,
            "monitor": monitor}


def measure(cell: Cell, timed: dict[str, Any]) -> dict[str, Any]:
    """Measure rounds per minute once running, startup and peak memory of the tree."""
    assert cell.spec is not None
    summary, wall, arrivals = timed["summary"], timed["wall"], timed["arrivals"]
    monitor: MemoryMonitor = timed["monitor"]
    rounds = summary["rounds_completed"]
    if len(arrivals) >= 2:
        per_round = (arrivals[-1] - arrivals[0]) / (len(arrivals) - 1)
    else:
        per_round = wall / max(rounds, 1)
    history = [e for e in summary["history"] if e.get("val_loss") is not None]
    return {
        "users": cell.keys["users"], "repeat": cell.keys.get("repeat", 0),
        "clients_per_round": cell.spec.run_config["clients-per-round"],
        "rounds": rounds, "wall_s": wall,
        "startup_s": (arrivals[0] - per_round) if arrivals else None,
        "rounds_per_minute": 60.0 / per_round if per_round > 0 else None,
        "seconds_per_round": per_round, "peak_rss_mb": monitor.peak / 2**20,
        "peak_processes": monitor.peak_processes,
        "final_val_loss": history[-1]["val_loss"] if history else None,
    }


def figures(ctx: Context, rows: list[dict[str, str]], runs: list[Run]) -> None:
    """Memory over time (each size's first repeat)."""
    plot({cell.keys["users"]: timed["monitor"].samples for cell, timed in runs
          if cell.keys.get("repeat", 0) == 0},
         ctx.figures / "scale_memory.png")


def plot(traces: dict[int, list[tuple[float, int, int]]], path: Path) -> Path:
    """Total RSS of the process tree over time, one line per size."""
    fig, ax = pyplot().subplots(figsize=(7, 4))
    for users, samples in traces.items():
        ax.plot([s[0] for s in samples], [s[1] / 2**20 for s in samples],
                label=f"{users} virtual users, 100 per round")
    decorate(ax, xlabel="seconds since launch", ylabel="RSS of the process tree (MiB)",
             title="Simulation Engine memory", legend={})
    return save(fig, path)


def table(rows: list[dict[str, str]]) -> list[str]:
    """Markdown lines: per size, each number's mean ± 95 % t half-width over the repeats."""
    lines = ["| virtual users | per round | rounds | repeats | rounds / minute | s / round "
             "| startup (s) | peak RSS (MiB, whole tree) | processes (max) | wall (s) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for users in dict.fromkeys(r["users"] for r in rows):
        sel = [r for r in rows if r["users"] == users]

        def pm(key: str, digits: int, sel: list[dict[str, str]] = sel) -> str:
            return mean_pm_ci((float(r[key]) for r in sel if r[key] not in ("", None)), digits)

        lines.append(
            f"| {users} | {sel[0]['clients_per_round']} | {sel[0]['rounds']} | {len(sel)} | "
            f"{pm('rounds_per_minute', 1)} | {pm('seconds_per_round', 2)} | "
            f"{pm('startup_s', 1)} | {pm('peak_rss_mb', 0)} | "
            f"{max(int(r['peak_processes']) for r in sel)} | {pm('wall_s', 0)} |")
    return lines


# --------------------------------------------------------------------------- report

_TEXT_1 = flow("""
Rounds per minute are measured between the first and the last round's log line; startup
(SuperLink, Ray, the apps) is reported apart; each number is the mean ± the half-width of the
two-sided 95 % Student-t interval over the repeats (seeds 0-4). A machine with more cores
runs more Ray workers at once. The same shape side by side with
Flower's own FedAvg, one command, and where the round's time goes (profiled):
[BENCHMARKS.md](BENCHMARKS.md), "Scale against Flower's FedAvg, side by side" (the two round
times compared, with the command that measures them).
""")


def report_section(rows: list[dict[str, str]]) -> list[str]:
    """Write this experiment's section of docs/RESULTS.md from its rows."""
    return [
        "**Target.** At least 1,000 virtual users with 100 per round on the "
        "synthetic task, on one machine; report rounds per minute and peak memory.",
        "",
        "**Ours** (peak RSS summed over the whole process tree: launcher, SuperLink, "
        "simulation process, Ray and its workers, sampled every 0.5 s with psutil):",
        "",
        *table(rows),
        "",
        _TEXT_1,
    ]


EXPERIMENT = Experiment(
    NAME, COLUMNS, grid, measure, figures, perform=perform,
    shown=("rounds_per_minute", "peak_rss_mb", "peak_processes", "wall_s"),
    report=report_section, paper="≥ 1,000 virtual users on one machine", volatile=TIMINGS,
    checks=(at_most("startup_s", "wall_s"), at_most("clients_per_round", "users")))
