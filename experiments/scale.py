"""Scale on one machine: ≥ 1,000 virtual users, 100 per round, on Flower's Simulation Engine.

The synthetic task (two groups, Laplace ν = 5, k = 2) with one virtual SuperNode per user; 100
users sampled per round. Reported per configuration: the wall time of the whole launch, the time
to the first finished round (SuperLink, Ray and the apps starting), rounds per minute once
running (from the arrival times of the per-round lines), and the peak resident memory of the
whole process tree (this process, the SuperLink, the simulation process, Ray and its workers),
sampled every 0.5 s with psutil. Scale runs are never taken from the cache: timing is the point.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from experiments.common import (
    Context,
    FederationSpec,
    MemoryMonitor,
    Progress,
    experiment_policy,
    fmt,
    plt_module,
    read_csv,
    write_csv,
)

NAME = "scale"
COLUMNS = ("users", "clients_per_round", "rounds", "wall_s", "startup_s", "rounds_per_minute",
           "seconds_per_round", "peak_rss_mb", "peak_processes", "final_val_loss")
PROFILES: dict[str, dict[str, Any]] = {
    "full": {"users": [1000, 5000], "rounds": 30},
    "quick": {"users": [1000], "rounds": 10},
    "smoke": {"users": [1000], "rounds": 4},
}


def spec(users: int, rounds: int) -> FederationSpec:
    """One scale federation."""
    config = {
        "task": "synthetic", "num-hypotheses": 2, "mechanism": "laplace",
        "noise-multiplier": 5.0, "clients-per-round": 100, "num-rounds": rounds,
        "patience": 0, "eval-every": 1, "validation-users": 100, "seed": 0, "data-seed": 0,
    }
    return FederationSpec(f"scale users={users}", config, users)


def run(ctx: Context) -> list[dict[str, Any]]:
    """Launch each size once, timing the rounds and sampling memory."""
    from server.launcher import launch

    p = PROFILES[ctx.profile]
    progress = Progress(NAME, len(p["users"]), ctx.stream)
    rows = []
    traces: dict[int, list[tuple[float, int, int]]] = {}
    for users in p["users"]:
        s = spec(users, p["rounds"])
        directory = ctx.run_dir(s)
        if directory.exists():
            import shutil

            shutil.rmtree(directory)
        arrivals: list[float] = []
        start = time.monotonic()

        def echo(line: str, arrivals: list[float] = arrivals, start: float = start) -> None:
            ctx.log(line)
            if "[gpfl] round " in line and " round 0/" not in line:
                arrivals.append(time.monotonic() - start)

        with MemoryMonitor(interval=0.5) as monitor:
            result = launch(supernodes=users, simulation=True, run_config=dict(s.run_config),
                            policy=experiment_policy(s.run_config), out_dir=directory,
                            echo=echo, timeout=ctx.timeout)
            monitor.sample()
        wall = time.monotonic() - start
        ctx.launched += 1
        rounds = result.summary["rounds_completed"]
        if len(arrivals) >= 2:
            per_round = (arrivals[-1] - arrivals[0]) / (len(arrivals) - 1)
        else:
            per_round = wall / max(rounds, 1)
        history = [e for e in result.summary["history"] if e.get("val_loss") is not None]
        row = {
            "users": users, "clients_per_round": s.run_config["clients-per-round"],
            "rounds": rounds, "wall_s": wall,
            "startup_s": (arrivals[0] - per_round) if arrivals else None,
            "rounds_per_minute": 60.0 / per_round if per_round > 0 else None,
            "seconds_per_round": per_round, "peak_rss_mb": monitor.peak / 2**20,
            "peak_processes": monitor.peak_processes,
            "final_val_loss": history[-1]["val_loss"] if history else None,
        }
        rows.append(row)
        traces[users] = monitor.samples
        progress.step(s.label, f"{fmt(row['rounds_per_minute'])} rounds/min, peak RSS "
                               f"{row['peak_rss_mb']:.0f} MiB over {monitor.peak_processes} "
                               f"processes, wall {wall:.0f} s")
    write_csv(ctx.out / "results.csv", rows, COLUMNS)
    plot(traces, ctx.figures / "scale_memory.png")
    read_csv(ctx.out / "results.csv")
    return rows


def plot(traces: dict[int, list[tuple[float, int, int]]], path: Path) -> Path:
    """Total RSS of the process tree over time, one line per size."""
    plt = plt_module()
    fig, ax = plt.subplots(figsize=(7, 4))
    for users, samples in traces.items():
        ax.plot([s[0] for s in samples], [s[1] / 2**20 for s in samples],
                label=f"{users} virtual users, 100 per round")
    ax.set_xlabel("seconds since launch")
    ax.set_ylabel("RSS of the process tree (MiB)")
    ax.set_title("Simulation Engine memory")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def table(rows: list[dict[str, str]]) -> list[str]:
    """Markdown lines of the scale results."""
    lines = ["| virtual users | per round | rounds | rounds / minute | s / round | startup (s) "
             "| peak RSS (MiB, whole tree) | processes | wall (s) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(
            f"| {r['users']} | {r['clients_per_round']} | {r['rounds']} | "
            f"{fmt(float(r['rounds_per_minute']))} | {fmt(float(r['seconds_per_round']))} | "
            f"{fmt(float(r['startup_s'])) if r['startup_s'] else '-'} | "
            f"{float(r['peak_rss_mb']):.0f} | {r['peak_processes']} | "
            f"{float(r['wall_s']):.0f} |")
    return lines
