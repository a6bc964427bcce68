"""Benchmark: a gpfl round against Flower's own FedAvg at scale, on the Simulation Engine.

One SuperLink running Flower's Simulation Engine with ``--users`` virtual SuperNodes serves, one
after the other and interleaved (FedAvg, gpfl, FedAvg, gpfl, ...), ``--repeats`` runs of each:

* Flower's FedAvg (``flwr.server.strategy.FedAvg``) with a NumPy linear-regression client
  (``experiments/fedavg_baseline``): the same data shape as gpfl's synthetic task, 10 samples and
  2 parameters a user, no privacy;
* gpfl: the synthetic task, k = 2, Euclidean Laplace ν = 5 (every release charged to its
  virtual device's ledger), server-side validation every round.

Both sample ``--per-round`` users a round, one local epoch. Each run's time per round is read
from Flower's own closing line ("Run finished R round(s) in T s"), so Ray's start is excluded.
Prints a Markdown table: mean and range over the repeats, and the ratio of the means.

    python -m experiments.bench_scale --users 1000 --per-round 100 --rounds 5 --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from experiments.bench_round import timed_run
from server.launcher import Federation, project_root


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=1000)
    parser.add_argument("--per-round", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="gpfl-bench-scale-"))
    root = project_root()
    policy = work / "policy.toml"
    # The virtual devices' own settings: ledgers in the work folder, a cap no run reaches.
    policy.write_text(f'ledger-dir = "{work / "ledgers"}"\ncap-d-privacy = 1e9\n')
    runs: dict[str, list[float]] = {"fedavg": [], "gpfl": []}
    with Federation(workdir=work) as fed:
        fed.extra_env["GPFL_POLICY"] = str(policy)
        fed.start_superlink(simulation_supernodes=args.users)
        for rep in range(args.repeats):
            runs["fedavg"].append(timed_run(
                fed, root / "experiments" / "fedavg_baseline",
                {"num-rounds": args.rounds, "clients-per-round": args.per_round},
                work / f"fedavg-{rep}.log"))
            runs["gpfl"].append(timed_run(
                fed, root,
                {"num-rounds": args.rounds, "clients-per-round": args.per_round,
                 "num-hypotheses": 2, "mechanism": "laplace", "noise-multiplier": 5.0,
                 "local-epochs": 1, "patience": 0, "out-dir": str(work / f"gpfl-{rep}")},
                work / f"gpfl-{rep}.log"))
            print(f"repeat {rep + 1}/{args.repeats}: FedAvg {runs['fedavg'][-1]:.2f} s/round, "
                  f"gpfl {runs['gpfl'][-1]:.2f} s/round", flush=True)
    base = statistics.mean(runs["fedavg"])
    print(f"\n| run ({args.users} virtual users, {args.per_round} a round, {args.rounds} rounds, "
          f"{args.repeats} repeats) | s / round, mean | range | ratio |")
    print("| --- | ---: | ---: | ---: |")
    for name, label in (("fedavg", "Flower FedAvg, NumPy client"),
                        ("gpfl", "gpfl, k = 2, Laplace ν = 5, validation every round")):
        values = runs[name]
        print(f"| {label} | {statistics.mean(values):.2f} | {min(values):.2f}-{max(values):.2f} "
              f"| {statistics.mean(values) / base:.2f} |")
    print(f"\nlogs in {work}")


if __name__ == "__main__":
    main()
