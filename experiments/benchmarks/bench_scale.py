"""Benchmark: a gpfl round against Flower's own FedAvg at scale, on the Simulation Engine.

One SuperLink running Flower's Simulation Engine with ``--users`` virtual SuperNodes serves, one
after the other and interleaved (FedAvg, gpfl, FedAvg, gpfl, ...), ``--repeats`` runs of each:

* Flower's FedAvg (``flwr.server.strategy.FedAvg``) with a NumPy linear-regression client
  (``experiments/benchmarks/fedavg_baseline``): the same data shape as gpfl's synthetic task, 10
  samples and 2 parameters a user, one gradient step, no privacy;
* gpfl: the synthetic task, k = 2, Euclidean Laplace ν = 5 (every release charged to its
  virtual device's ledger, written durably before the release leaves), one local epoch
  (one batch of 10), server-side validation every round.

Both sample ``--per-round`` users a round. Each run's time per round is read from Flower's own
closing line ("Run finished R round(s) in T s"), so Ray's start is excluded. Prints a Markdown
table: mean and range over the repeats, the ratio of the means, and the peak resident memory of
the whole process tree during each app's runs (this process, the SuperLink, the ServerApp, Ray
and its actors; sampled every 0.5 s, :class:`experiments.benchmarks.scale.MemoryMonitor`).

Ray starts its workers (the Ray actors that run the ClientApps) 15 niceness levels below their
parent by default; the benchmark asks for none (``RAY_worker_niceness=0``, for both apps), so
that on a shared machine the actors run at the benchmark's own priority.

With ``--py-spy DIR`` every run's simulation process (``deploy.serverapp_runner``) and Ray actors
(``ray::ClientAppActor``) are sampled with py-spy (``--gil``: where CPU goes, in raw form,
``DIR/<run>-<role>-<pid>.txt``) and the heaviest frames of each are printed. Sampling costs
the sampled processes little (``--nonblocking``) but takes CPU of its own: time a run without it.

    python -m experiments.benchmarks.bench_scale --users 1000 --per-round 100 --rounds 5 --repeats 4
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import itertools
import re
import shutil
import statistics
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import psutil

from client.policy import POLICY_ENV
from client.process_tree import bin_dir
from deploy.launcher import Federation, project_root
from deploy.processes import SERVERAPP
from deploy.raycluster import ray_cluster_env
from experiments.benchmarks.bench_round import timed_run
from experiments.benchmarks.scale import MemoryMonitor

_LINE_NUMBER = re.compile(r":\d+\)$")


class Profiler:
    """Sample the processes of each run of one federation with py-spy while it runs.

    Parameters
    ----------
    fed : Federation
        The federation; its run's simulation process and that process's descendants are
        watched.
    out : Path
        Where the raw profiles go.
    """

    def __init__(self, fed: Federation, out: Path) -> None:
        self.fed = fed
        self.out = out
        self.label = "start"
        self.files: list[Path] = []
        self._seen: set[int] = set()
        self._spies: list[subprocess.Popen[bytes]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> Profiler:
        self.out.mkdir(parents=True, exist_ok=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        for spy in self._spies:
            try:
                spy.wait(timeout=30)  # py-spy stops when its process does
            except subprocess.TimeoutExpired:
                spy.terminate()
                spy.wait()

    def _watch(self) -> None:
        py_spy = str(bin_dir() / "py-spy")
        while not self._stop.wait(0.3):
            # The run's simulation process is the launcher's own (deploy.serverapp_runner),
            # and Ray's actors are its descendants.
            run = self.fed.procs.procs.get(SERVERAPP)
            if run is None or run.poll() is not None:
                continue
            try:
                children = [psutil.Process(run.pid),
                            *psutil.Process(run.pid).children(recursive=True)]
            except psutil.Error:
                continue
            for child in children:
                try:
                    command = " ".join(child.cmdline())
                except psutil.Error:
                    continue
                if child.pid in self._seen:
                    continue
                role = ("serverapp" if child.pid == run.pid else
                        "actor" if command.startswith("ray::ClientAppActor") else None)
                if role is None:
                    continue
                self._seen.add(child.pid)
                path = self.out / f"{self.label}-{role}-{child.pid}.txt"
                self.files.append(path)
                self._spies.append(subprocess.Popen(
                    [py_spy, "record", "--nonblocking", "--gil", "--rate", "50", "--format", "raw",
                     "--output", str(path), "--pid", str(child.pid)],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

    def report(self, top: int = 25) -> str:
        """Return the heaviest frames (inclusive share of the samples) of every profile."""
        lines = []
        for path in self.files:
            frames: collections.Counter[str] = collections.Counter()
            total = 0
            if not path.exists():
                continue
            for line in path.read_text().splitlines():
                stack, _, count = line.rpartition(" ")
                if not stack or not count.isdigit():
                    continue
                total += int(count)
                for frame in {_LINE_NUMBER.sub(")", f) for f in stack.split(";")}:
                    frames[frame] += int(count)
            lines.append(f"\n{path.name}: {total} samples at 50 Hz (CPU, GIL held)")
            lines += [f"  {n / total:6.1%}  {frame[:140]}" for frame, n in frames.most_common(top)]
        return "\n".join(lines)


#: Flower's line opening round R, with its timestamp (the run's log, DEBUG format).
_ROUND_START = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO flwr: \[ROUND (\d+)\]")
_RUN_FINISHED = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO flwr: Run finished")


def round_seconds(log: Path) -> list[float]:
    """Return each round's seconds, from Flower's timestamped lines in a run's log.

    Round 1 also holds the engine's start (Ray, its actors, the first instructions): the later
    rounds are the cost of a round's work.
    """
    starts: dict[int, datetime] = {}
    end: datetime | None = None
    for line in log.read_text(errors="replace").splitlines():
        if (match := _ROUND_START.match(line)) is not None:
            starts.setdefault(int(match.group(2)), datetime.strptime(
                match.group(1), "%Y-%m-%d %H:%M:%S,%f"))
        elif (match := _RUN_FINISHED.match(line)) is not None:
            end = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f")
    ordered = [starts[r] for r in sorted(starts)] + ([end] if end is not None else [])
    return [(b - a).total_seconds() for a, b in itertools.pairwise(ordered)]


@dataclass
class AppTimes:
    """One app's runs at one number of users."""

    #: Seconds per round of each run (Flower's closing line: start included).
    per_round: list[float] = field(default_factory=list)
    #: Seconds of every round after the first, over the runs.
    later: list[float] = field(default_factory=list)
    #: Peak resident memory of the whole process tree, bytes.
    peak: int = 0


def bench_users(users: int, args: argparse.Namespace) -> dict[str, AppTimes]:
    """Run FedAvg and gpfl, interleaved, on one SuperLink with ``users`` virtual SuperNodes.

    Returns, per app, its seconds per round (Flower's closing line), its later rounds' mean
    seconds and its peak resident memory, over the repeats.
    """
    work = Path(tempfile.mkdtemp(prefix=f"gpfl-bench-scale-{users}-"))
    root = project_root()
    policy = work / "policy.toml"
    # The virtual devices' own settings: ledgers in the work folder, a cap no run reaches.
    policy.write_text(f'ledger-dir = "{work / "ledgers"}"\ncap-d-privacy = 1e9\n')
    times = {"fedavg": AppTimes(), "gpfl": AppTimes()}
    configs: dict[str, tuple[Path, dict[str, object]]] = {
        "fedavg": (root / "experiments" / "benchmarks" / "fedavg_baseline",
                   {"num-rounds": args.rounds, "clients-per-round": args.per_round}),
        "gpfl": (root, {"num-rounds": args.rounds, "clients-per-round": args.per_round,
                        "num-hypotheses": 2, "mechanism": "laplace", "noise-multiplier": 5.0,
                        "local-epochs": 1, "patience": 0, "out-dir": str(work / "gpfl")}),
    }
    with Federation(workdir=work) as fed, contextlib.ExitStack() as stack:
        fed.extra_env[POLICY_ENV] = str(policy)
        fed.extra_env["RAY_worker_niceness"] = "0"
        if args.ray_address is not None:  # the virtual nodes run on a running Ray cluster
            fed.extra_env.update(ray_cluster_env(args.ray_address, policy))
        fed.start_superlink(simulation_supernodes=users)
        profiler = (stack.enter_context(Profiler(fed, args.py_spy))
                    if args.py_spy is not None else None)
        for rep in range(args.repeats):
            for name, (app, config) in configs.items():
                if profiler is not None:
                    profiler.label = f"{users}-{name}-{rep}"
                log = work / f"{name}-{rep}.log"
                with MemoryMonitor() as memory:
                    times[name].per_round.append(timed_run(fed, app, config, log))
                times[name].peak = max(times[name].peak, memory.peak)
                times[name].later.extend(round_seconds(log)[1:])
            print(f"{users} users, repeat {rep + 1}/{args.repeats}: FedAvg "
                  f"{times['fedavg'].per_round[-1]:.2f} s/round, gpfl "
                  f"{times['gpfl'].per_round[-1]:.2f} s/round", flush=True)
        if profiler is not None:
            print(profiler.report())
    print(f"logs in {work}", flush=True)
    return times


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, nargs="+", default=[1000],
                        help="virtual users; several: one federation each, in turn")
    parser.add_argument("--per-round", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--ray-address", default=None, metavar="HOST:PORT",
                        help="run the virtual nodes on the running Ray cluster whose head is "
                             "HOST:PORT (as gpfl launch --ray-address) instead of a local Ray")
    parser.add_argument("--py-spy", type=Path, default=None, metavar="DIR",
                        help="sample each run's ServerApp and Ray actors with py-spy into DIR")
    args = parser.parse_args(argv)
    if args.py_spy is not None and shutil.which(str(bin_dir() / "py-spy")) is None:
        parser.error("--py-spy needs py-spy in the environment (pip install py-spy)")
    results = {users: bench_users(users, args) for users in args.users}
    first = args.users[0]
    print(f"\n| run ({args.per_round} a round, {args.rounds} rounds, {args.repeats} repeats) "
          "| users | s / round, mean | range | ratio to FedAvg | later rounds, s / round "
          f"| later rounds, ratio to {first} users | peak RSS, GB |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for users, result in results.items():
        base = statistics.mean(result["fedavg"].per_round)
        for name, label in (("fedavg", "Flower FedAvg, NumPy client"),
                            ("gpfl", "gpfl, k = 2, Laplace ν = 5, validation every round")):
            app, reference = result[name], results[first][name]
            steady = statistics.mean(app.later) if app.later else float("nan")
            versus = (steady / statistics.mean(reference.later) if app.later and reference.later
                      else float("nan"))
            print(f"| {label} | {users} | {statistics.mean(app.per_round):.2f} | "
                  f"{min(app.per_round):.2f}-{max(app.per_round):.2f} | "
                  f"{statistics.mean(app.per_round) / base:.2f} | {steady:.2f} | {versus:.2f} "
                  f"| {app.peak / 2**30:.2f} |")
    if len(args.users) > 1:
        low, high = args.users[0], args.users[-1]
        for name in ("fedavg", "gpfl"):
            grown = results[high][name].peak - results[low][name].peak
            print(f"{name}: {grown / (high - low) / 1024:.1f} KiB of peak memory per virtual user "
                  f"({low} → {high} users)")


if __name__ == "__main__":
    main()
