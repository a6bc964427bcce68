r"""Benchmark: the cost of one gpfl round against Flower's own FedAvg, same machine, same SuperLink.

One SuperLink (real processes, gRPC) serves, one run after the other:

1. N plain ``flower-supernode`` processes, Flower's default path (a new ``flwr-clientapp``
   process per message, which installs and imports the run's app): Flower's FedAvg with a NumPy
   linear-regression client (``experiments/benchmarks/fedavg_baseline``), then
   (``--with-default-gpfl``) gpfl on the same path;
2. those SuperNodes stopped, N devices started as gpfl devices start (``gpfl supernode``: the
   SuperNode in process isolation, one warm gpfl executor each): gpfl (synthetic task, k = 2,
   Euclidean Laplace ν = 5, server-side validation every round);
3. on the same devices, a run whose every reply is an immediate policy decline (the run asks for
   ``mechanism = none``): no training, no release, so its round is the protocol's floor — the
   SuperNode's 3 s sleep between polls of an idle SuperLink and the ServerApp's 3 s between
   pulls of replies.

Each run's time per round is read from Flower's own closing line ("Run finished R round(s) in
T s"), so start-up is excluded. Prints a Markdown table.

    python -m experiments.benchmarks.bench_round --supernodes 8 --rounds 5

With ``--parameters P [P ...]`` the comparison is at a model of P parameters instead (float32
releases of 4P bytes): for each P, Flower's FedAvg on the plain SuperNodes (the baseline
client's ``num-parameters`` = P, one local sample of P features), then, on the ``gpfl
supernode`` devices, gpfl with a model of P parameters and trivial training (the synthetic task
with optima ``5;-4`` repeated P times, one sample a user, one validation user, validation only
before round 1). Besides seconds per round it reports the peak resident memory of each device
(its SuperNode's process tree: Flower's per-message ``flwr-clientapp`` processes, or gpfl's
executor) and of the ServerApp and SuperLink processes, sampled every 0.2 s during each run:

    python -m experiments.benchmarks.bench_round --supernodes 2 --rounds 2 \
        --parameters 1000000 10000000
"""

from __future__ import annotations

import argparse
import json
import math
import re
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from deploy.launcher import Federation, project_root, stream_lines
from deploy.processes import SERVERAPP

_FINISHED = re.compile(r"Run finished (\d+) round\(s\) in ([\d.]+)s")


def timed_run(fed: Federation, app: Path, config: dict[str, object], log: Path) -> float:
    """Submit one run and return its seconds per round."""
    proc = fed.submit(app, config)
    per_round = None
    for line in stream_lines(proc, log, timeout=3600):
        match = _FINISHED.search(line)
        if match:
            per_round = float(match.group(2)) / int(match.group(1))
    if per_round is None:
        raise RuntimeError(f"no 'Run finished' line; see {log}")
    return per_round


def tree_rss(pid: int) -> int:
    """Resident bytes of process ``pid`` and all its descendants (0 once it is gone).

    Shared pages (libraries mapped by several processes) count once per process, so this is an
    upper bound on what the tree adds to the machine.
    """
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for proc in procs:
        try:
            total += proc.memory_info().rss
        except psutil.Error:  # a per-message process that ended between listing and reading
            continue
    return total


@dataclass
class PeakMemory:
    """Peak resident memory of a federation's process trees while a run is timed.

    Every ``interval`` seconds a thread sums the RSS of each SuperNode's tree, the ServerApp's
    and the SuperLink's; ``peaks`` keeps each name's largest sum (bytes).
    """

    fed: Federation
    interval: float = 0.2
    peaks: dict[str, int] = field(default_factory=dict)

    def sample(self) -> None:
        """Take one sample of every process tree of the federation."""
        for name, proc in list(self.fed.procs.procs.items()):
            if name.startswith("supernode-") or name in (SERVERAPP, "superlink"):
                self.peaks[name] = max(self.peaks.get(name, 0), tree_rss(proc.pid))

    @contextmanager
    def watching(self) -> Iterator[PeakMemory]:
        """Sample in a background thread for the duration of the ``with`` block."""
        stop = threading.Event()

        def loop() -> None:
            while not stop.wait(self.interval):
                self.sample()

        thread = threading.Thread(target=loop, name="peak-memory", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            stop.set()
            thread.join()

    def devices_mib(self) -> float:
        """Return the largest SuperNode tree's peak, MiB."""
        return max((v for k, v in self.peaks.items() if k.startswith("supernode-")),
                   default=0) / 2**20


@dataclass
class ModelRow:
    """One run at a model size: seconds per round and peak memory (MiB)."""

    name: str
    parameters: int
    seconds: float
    device_mib: float
    serverapp_mib: float
    superlink_mib: float


def gpfl_model_config(parameters: int, rounds: int, clients: int) -> dict[str, object]:
    """Return gpfl's run config for a model of ``parameters`` parameters with trivial training.

    The synthetic task with two 1-dimensional optima repeated ``parameters`` times (a linear
    model of that many weights), one sample a user (a 1 × P design matrix on each device), one
    validation user validated only before round 1 (``eval-every`` past the last round), so that
    neither side holds more than a few vectors of the model's size.
    """
    return {"num-rounds": rounds, "clients-per-round": clients, "min-replies": clients,
            "num-hypotheses": 2, "mechanism": "laplace", "noise-multiplier": 5.0,
            "patience": 0, "optima": "5;-4", "optima-repeat": parameters,
            "samples-per-user": 1, "validation-users": 1, "eval-every": rounds + 1,
            "local-epochs": 1, "batch-size": 1, "round-timeout": 1800.0}


def model_size_runs(fed: Federation, work: Path, n: int, rounds: int,
                    sizes: list[int]) -> list[ModelRow]:
    """Time FedAvg on ``fed``'s plain SuperNodes, then gpfl on ``gpfl supernode``, per size."""
    root = project_root()
    rows: list[ModelRow] = []
    # Laplace's neighbourhood calibration costs P/ν a release: a cap the largest model fits.
    cap = max(1e6, 2.0 * rounds * max(sizes) / 5.0)

    def nodes() -> None:
        for i in range(n):
            fed.start_supernode(i, {"partition-id": i, "num-partitions": n,
                                    "ledger-dir": str(work / "ledgers"),
                                    "cap-d-privacy": cap})
        time.sleep(3)  # let every SuperNode register before the first run

    def timed(name: str, p: int, app: Path, config: dict[str, object], log: str) -> None:
        with PeakMemory(fed).watching() as memory:
            try:
                seconds = timed_run(fed, app, config, work / log)
            except RuntimeError as err:
                # A run that does not finish at one size still leaves the others' figures
                # (and its own peak memory) to report.
                print(f"{name}, P = {p:,}: FAILED ({err})", flush=True)
                seconds = math.nan
        rows.append(ModelRow(name, p, seconds, memory.devices_mib(),
                             memory.peaks.get(SERVERAPP, 0) / 2**20,
                             memory.peaks.get("superlink", 0) / 2**20))
        print(f"{name}, P = {p:,}: {seconds:.2f} s / round", flush=True)

    fed.device_runner = False
    nodes()
    for p in sizes:
        timed("Flower FedAvg, NumPy client, Flower's per-message processes", p,
              root / "experiments" / "benchmarks" / "fedavg_baseline",
              {"num-rounds": rounds, "clients-per-round": n, "num-parameters": p,
               "samples-per-client": 1}, f"fedavg-{p}.log")
    for i in range(n):
        fed.stop_supernode(i)
    fed.device_runner = True
    nodes()
    for p in sizes:
        timed("gpfl, k = 2, Laplace ν = 5, device runner (gpfl supernode)", p, root,
              {**gpfl_model_config(p, rounds, n), "out-dir": str(work / f"gpfl-{p}")},
              f"gpfl-{p}.log")
    return rows


def model_size_table(rows: list[ModelRow], n: int, rounds: int) -> str:
    """Return the table of `model_size_runs`: each row's ratio to FedAvg's at its size."""
    fedavg = {r.parameters: r.seconds for r in rows if r.name.startswith("Flower")}
    lines = [f"| run ({n} SuperNodes, {rounds} rounds, one SuperLink) | parameters | s / round "
             "| ratio | peak RSS a device, MiB | ServerApp, MiB | SuperLink, MiB |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        timing = ("failed | -" if math.isnan(r.seconds) else
                  f"{r.seconds:.2f} | {r.seconds / fedavg[r.parameters]:.2f}")
        lines.append(f"| {r.name} | {r.parameters:,} | {timing} | {r.device_mib:.0f} | "
                     f"{r.serverapp_mib:.0f} | {r.superlink_mib:.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--supernodes", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--with-default-gpfl", action="store_true",
                        help="also time gpfl on Flower's default per-message processes")
    parser.add_argument("--parameters", type=int, nargs="+", default=None, metavar="P",
                        help="compare FedAvg and gpfl at models of these sizes instead")
    args = parser.parse_args(argv)
    n, rounds = args.supernodes, args.rounds
    if args.parameters:
        work = Path(tempfile.mkdtemp(prefix="gpfl-bench-round-"))
        with Federation(workdir=work, device_runner=False) as fed:
            fed.start_superlink()
            model_rows = model_size_runs(fed, work, n, rounds, args.parameters)
        print(model_size_table(model_rows, n, rounds))
        print(f"\nlogs in {work}")
        return
    work = Path(tempfile.mkdtemp(prefix="gpfl-bench-round-"))
    root = project_root()
    gpfl = {"num-rounds": rounds, "clients-per-round": n, "num-hypotheses": 2,
            "mechanism": "laplace", "noise-multiplier": 5.0, "patience": 0}
    rows: list[tuple[str, float]] = []

    def nodes(fed: Federation) -> None:
        for i in range(n):
            fed.start_supernode(i, {"partition-id": i, "num-partitions": n,
                                    "ledger-dir": str(work / "ledgers"),
                                    "cap-d-privacy": 1e6})
        time.sleep(3)  # let every SuperNode register before the first run

    with Federation(workdir=work, device_runner=False) as fed:
        fed.start_superlink()
        nodes(fed)
        rows.append(("Flower FedAvg, NumPy client, Flower's per-message processes",
                     timed_run(fed, root / "experiments" / "benchmarks" / "fedavg_baseline",
                               {"num-rounds": rounds, "clients-per-round": n},
                               work / "fedavg.log")))
        if args.with_default_gpfl:
            rows.append(("gpfl, k = 2, Laplace ν = 5, Flower's per-message processes",
                         timed_run(fed, root, {**gpfl, "out-dir": str(work / "gpfl-default")},
                                   work / "gpfl-default.log")))
        # The same SuperLink; the devices now run as gpfl devices do.
        for i in range(n):
            fed.stop_supernode(i)
        fed.device_runner = True
        nodes(fed)
        rows.append(("gpfl, k = 2, Laplace ν = 5, device runner (gpfl supernode)",
                     timed_run(fed, root, {**gpfl, "out-dir": str(work / "gpfl-runner")},
                               work / "gpfl-runner.log")))
        rows.append(("floor: gpfl, every device declines at once (device runner)",
                     timed_run(fed, root, {**gpfl, "mechanism": "none",
                                           "out-dir": str(work / "gpfl-floor")},
                               work / "gpfl-floor.log")))
    runner = json.loads((work / "gpfl-runner" / "summary.json").read_text())
    missing = sum(len(e["missing"]) for e in runner["history"])
    replies = [e["replies"] for e in runner["history"][1:]]
    baseline = rows[0][1]
    print(f"| run ({n} SuperNodes, {rounds} rounds, one SuperLink) | s / round | ratio |")
    print("| --- | ---: | ---: |")
    for name, seconds in rows:
        print(f"| {name} | {seconds:.2f} | {seconds / baseline:.2f} |")
    print(f"\ndevice-runner run: replies per round {replies}, missing {missing}; logs in {work}")


if __name__ == "__main__":
    main()
