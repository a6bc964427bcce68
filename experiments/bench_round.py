"""Benchmark: the cost of one gpfl round against Flower's own FedAvg, same machine, same run.

One SuperLink and N SuperNodes (real processes, gRPC) serve two runs one after the other:
Flower's FedAvg with a NumPy linear-regression client (``experiments/fedavg_baseline``)
and gpfl (synthetic task, k = 2, Euclidean Laplace ν = 5, server-side validation every
round). Each run's time per round is read from Flower's own closing line
("Run finished R round(s) in T s"), so start-up is excluded. Prints a Markdown table.

    python -m experiments.bench_round --supernodes 8 --rounds 5
"""

from __future__ import annotations

import argparse
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
    args = parser.parse_args(argv)
    n, rounds = args.supernodes, args.rounds
    work = Path(tempfile.mkdtemp(prefix="gpfl-bench-round-"))
    root = project_root()
    with Federation(workdir=work) as fed:
        fed.start_superlink()
        for i in range(n):
            fed.start_supernode(i, {"partition-id": i, "num-partitions": n,
                                    "ledger-dir": str(work / "ledgers"),
                                    "cap-d-privacy": 1e6})
        time.sleep(3)  # let every SuperNode register before the first run
        baseline = timed_run(fed, root / "experiments" / "fedavg_baseline",
                             {"num-rounds": rounds, "clients-per-round": n},
                             work / "fedavg.log")
        ours = timed_run(fed, root, {"num-rounds": rounds, "clients-per-round": n,
                                     "num-hypotheses": 2, "mechanism": "laplace",
                                     "noise-multiplier": 5.0, "patience": 0,
                                     "out-dir": str(work / "gpfl")},
                         work / "gpfl.log")
    print(f"| run ({n} SuperNodes, {rounds} rounds) | s / round | ratio |")
    print("| --- | ---: | ---: |")
    print(f"| Flower FedAvg, NumPy client | {baseline:.2f} | 1.00 |")
    print(f"| gpfl, k = 2, Laplace ν = 5 | {ours:.2f} | {ours / baseline:.2f} |")


if __name__ == "__main__":
    main()
