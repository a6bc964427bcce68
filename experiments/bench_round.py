"""Benchmark: the cost of one gpfl round against Flower's own FedAvg, same machine, same SuperLink.

One SuperLink (real processes, gRPC) serves, one run after the other:

1. N plain ``flower-supernode`` processes, Flower's default path (a new ``flwr-clientapp``
   process per message, which installs and imports the run's app): Flower's FedAvg with a NumPy
   linear-regression client (``experiments/fedavg_baseline``), then (``--with-default-gpfl``)
   gpfl on the same path;
2. those SuperNodes stopped, N devices started as gpfl devices start (``gpfl supernode``: the
   SuperNode in process isolation, one warm gpfl executor each): gpfl (synthetic task, k = 2,
   Euclidean Laplace ν = 5, server-side validation every round);
3. on the same devices, a run whose every reply is an immediate policy decline (the run asks for
   ``mechanism = none``): no training, no release, so its round is the protocol's floor — the
   SuperNode's 3 s sleep between polls of an idle SuperLink and the ServerApp's 3 s between
   pulls of replies.

Each run's time per round is read from Flower's own closing line ("Run finished R round(s) in
T s"), so start-up is excluded. Prints a Markdown table.

    python -m experiments.bench_round --supernodes 8 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
import time
from pathlib import Path

from server.launcher import Federation, project_root, stream_lines

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


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--supernodes", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--with-default-gpfl", action="store_true",
                        help="also time gpfl on Flower's default per-message processes")
    args = parser.parse_args(argv)
    n, rounds = args.supernodes, args.rounds
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
                     timed_run(fed, root / "experiments" / "fedavg_baseline",
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
