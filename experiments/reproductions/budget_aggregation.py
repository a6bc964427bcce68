r"""Compare aggregations for three clients with personalized budgets ε = (1, 5, 10).

Wu et al. (Appl. Sci. 2023) report that weighting clients by their noise (B: α_i ∝ 1/σ_i) and
probability-based selection (C) are at least as accurate as the arithmetic mean (A) when
budgets differ. This runs the real ServerApp/ClientApp on Flower's Simulation Engine: the
synthetic task with one optimum θ* = (5, 6) and one hypothesis, three clients whose Gaussian
mechanisms are calibrated to ε_i ∈ {1, 5, 10} (δ = 1e-5) over the run's releases, every client
every round, for each aggregation and seed. It is an `experiments.core.runner.Experiment` run by the
common runner (finished federations cached and reused, one progress line each, ``results.csv``
with the validation RMSE and the distance of the final model to θ*); it then prints a Markdown
table (mean ± std over seeds).

    python -m experiments.reproductions.budget_aggregation --seeds 0 1 2 \
        --out runs/budget-aggregation
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from experiments.core.common import DEFAULT_CACHE, Context, FederationSpec
from experiments.core.runner import Cell, Experiment, run
from settings import AGGREGATIONS

NAME = "budget-aggregation"
OPTIMUM = np.array([5.0, 6.0])
COLUMNS = ("aggregation", "seed", "val_rmse", "distance")


def run_config(aggregation: str, seed: int, rounds: int) -> dict[str, object]:
    """Return the run config of one configuration."""
    return {
        "optima": "5,6", "num-hypotheses": 1, "num-rounds": rounds, "clients-per-round": 3,
        "mechanism": "gaussian", "client-epsilons": "1,5,10", "delta": 1e-5, "clip": 2.0,
        "local-epochs": 5, "learning-rate": 0.1, "samples-per-user": 50, "patience": 0,
        "aggregation": aggregation, "seed": seed, "data-seed": seed,
    }


def grid(ctx: Context, rounds: int = 30) -> list[Cell]:
    """Every aggregation for every seed (default seeds 0, 1, 2), ``rounds`` rounds each."""
    seeds = ctx.seeds if ctx.seeds is not None else [0, 1, 2]
    return [Cell.of(FederationSpec(f"{NAME} {aggregation} seed={seed}",
                                   run_config(aggregation, seed, rounds), 3),
                    aggregation=aggregation, seed=seed)
            for aggregation in AGGREGATIONS for seed in seeds]


def measure(cell: Cell, summary: dict[str, Any]) -> dict[str, Any]:
    """Return the row: the best validation RMSE and the final model's distance to θ*."""
    final = np.asarray(summary["hypotheses"][0])
    return {**cell.keys, "val_rmse": summary["best_val_loss"],
            "distance": float(np.linalg.norm(final - OPTIMUM))}


def sd(values: list[float]) -> float:
    """Return the sample standard deviation (0 for a single value)."""
    return statistics.stdev(values) if len(values) > 1 else 0.0


def table(rows: list[dict[str, Any]]) -> list[str]:
    """Markdown lines: each aggregation's validation RMSE and ‖θ − θ*‖, mean ± std over seeds."""
    seeds = len({r["seed"] for r in rows})
    lines = [f"| aggregation | validation RMSE | ‖θ − θ*‖ | (ε = 1, 5, 10; {seeds} seeds)",
             "| --- | ---: | ---: | |"]
    for aggregation in dict.fromkeys(r["aggregation"] for r in rows):
        of = [r for r in rows if r["aggregation"] == aggregation]
        rmse = [float(r["val_rmse"]) for r in of]
        dist = [float(r["distance"]) for r in of]
        lines.append(f"| {aggregation} | {statistics.mean(rmse):.3f} ± {sd(rmse):.3f} | "
                     f"{statistics.mean(dist):.3f} ± {sd(dist):.3f} | |")
    return lines


EXPERIMENT = Experiment(NAME, COLUMNS, grid, measure, shown=("val_rmse", "distance"),
                        report=table, paper="002 §5 (three clients)")


def main(argv: list[str] | None = None) -> None:
    """Run every aggregation for every seed with the common runner; print the table."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--out", type=Path, default=Path("runs/budget-aggregation"))
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE,
                        help=f"finished federations, reused (default {DEFAULT_CACHE})")
    args = parser.parse_args(argv)
    ctx = Context(name=NAME, out=args.out, cache=args.cache, seeds=args.seeds)
    experiment = Experiment(NAME, COLUMNS, functools.partial(grid, rounds=args.rounds),
                            measure, shown=EXPERIMENT.shown, report=table, paper=EXPERIMENT.paper)
    started = time.monotonic()
    rows = run(experiment, ctx)
    ctx.write_meta(started, {"rows": len(rows), "rounds": args.rounds})
    print("\n" + "\n".join(table(rows)))


if __name__ == "__main__":
    main()
