"""Benchmark: a gpfl round against Flower's own FedAvg at scale, on the Simulation Engine.

One SuperLink running Flower's Simulation Engine with ``--users`` virtual SuperNodes serves, one
after the other and interleaved (FedAvg, gpfl, FedAvg, gpfl, ...), ``--repeats`` runs of each:

* Flower's FedAvg (``flwr.server.strategy.FedAvg``) with a NumPy linear-regression client
  (``experiments/fedavg_baseline``): the same data shape as gpfl's synthetic task, 10 samples and
  2 parameters a user, one gradient step, no privacy;
* gpfl: the synthetic task, k = 2, Euclidean Laplace ν = 5 (every release charged to its
  virtual device's ledger, written durably before the release leaves), one local epoch
  (one batch of 10), server-side validation every round.

Both sample ``--per-round`` users a round. Each run's time per round is read from Flower's own
closing line ("Run finished R round(s) in T s"), so Ray's start is excluded. Prints a Markdown
table: mean and range over the repeats, the ratio of the means, and the peak resident memory of
the whole process tree during each app's runs (this process, the SuperLink, the ServerApp, Ray
and its actors; sampled every 0.5 s, :class:`experiments.scale.MemoryMonitor`).

Ray starts its workers (the Ray actors that run the ClientApps) 15 niceness levels below their
parent by default; the benchmark asks for none (``RAY_worker_niceness=0``, for both apps), so
that on a shared machine the actors run at the benchmark's own priority.

With ``--py-spy DIR`` every run's simulation process (``server.serverapp_runner``) and Ray actors
(``ray::ClientAppActor``) are sampled with py-spy (``--gil``: where CPU goes, in raw form,
``DIR/<run>-<role>-<pid>.txt``) and the heaviest frames of each are printed. Sampling costs
the sampled processes little (``--nonblocking``) but takes CPU of its own: time a run without it.

    python -m experiments.bench_scale --users 1000 --per-round 100 --rounds 5 --repeats 4
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import re
import shutil
import statistics
import subprocess
import tempfile
import threading
from pathlib import Path

import psutil

from client.policy import POLICY_ENV
from experiments.bench_round import timed_run
from experiments.scale import MemoryMonitor
from server.launcher import Federation, project_root
from server.processes import SERVERAPP, bin_dir

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
            # The run's simulation process is the launcher's own (server.serverapp_runner),
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


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=1000)
    parser.add_argument("--per-round", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--py-spy", type=Path, default=None, metavar="DIR",
                        help="sample each run's ServerApp and Ray actors with py-spy into DIR")
    args = parser.parse_args(argv)
    if args.py_spy is not None and shutil.which(str(bin_dir() / "py-spy")) is None:
        parser.error("--py-spy needs py-spy in the environment (pip install py-spy)")
    work = Path(tempfile.mkdtemp(prefix="gpfl-bench-scale-"))
    root = project_root()
    policy = work / "policy.toml"
    # The virtual devices' own settings: ledgers in the work folder, a cap no run reaches.
    policy.write_text(f'ledger-dir = "{work / "ledgers"}"\ncap-d-privacy = 1e9\n')
    runs: dict[str, list[float]] = {"fedavg": [], "gpfl": []}
    peaks: dict[str, int] = {"fedavg": 0, "gpfl": 0}
    with Federation(workdir=work) as fed, contextlib.ExitStack() as stack:
        fed.extra_env[POLICY_ENV] = str(policy)
        fed.extra_env["RAY_worker_niceness"] = "0"
        fed.start_superlink(simulation_supernodes=args.users)
        profiler = (stack.enter_context(Profiler(fed, args.py_spy))
                    if args.py_spy is not None else None)
        for rep in range(args.repeats):
            if profiler is not None:
                profiler.label = f"fedavg-{rep}"
            with MemoryMonitor() as memory:
                runs["fedavg"].append(timed_run(
                    fed, root / "experiments" / "fedavg_baseline",
                    {"num-rounds": args.rounds, "clients-per-round": args.per_round},
                    work / f"fedavg-{rep}.log"))
            peaks["fedavg"] = max(peaks["fedavg"], memory.peak)
            if profiler is not None:
                profiler.label = f"gpfl-{rep}"
            with MemoryMonitor() as memory:
                runs["gpfl"].append(timed_run(
                    fed, root,
                    {"num-rounds": args.rounds, "clients-per-round": args.per_round,
                     "num-hypotheses": 2, "mechanism": "laplace", "noise-multiplier": 5.0,
                     "local-epochs": 1, "patience": 0, "out-dir": str(work / f"gpfl-{rep}")},
                    work / f"gpfl-{rep}.log"))
            peaks["gpfl"] = max(peaks["gpfl"], memory.peak)
            print(f"repeat {rep + 1}/{args.repeats}: FedAvg {runs['fedavg'][-1]:.2f} s/round, "
                  f"gpfl {runs['gpfl'][-1]:.2f} s/round", flush=True)
    base = statistics.mean(runs["fedavg"])
    print(f"\n| run ({args.users} virtual users, {args.per_round} a round, {args.rounds} rounds, "
          f"{args.repeats} repeats) | s / round, mean | range | ratio | peak RSS, GB |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, label in (("fedavg", "Flower FedAvg, NumPy client"),
                        ("gpfl", "gpfl, k = 2, Laplace ν = 5, validation every round")):
        values = runs[name]
        print(f"| {label} | {statistics.mean(values):.2f} | {min(values):.2f}-{max(values):.2f} "
              f"| {statistics.mean(values) / base:.2f} | {peaks[name] / 2**30:.2f} |")
    if profiler is not None:
        print(profiler.report())
    print(f"\nlogs in {work}")


if __name__ == "__main__":
    main()
