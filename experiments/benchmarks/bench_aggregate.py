"""Benchmark ``ClusteredStrategy.aggregate_fit``: time and peak memory of one round.

U replies of n float32 parameters drawn around k well-separated centres (k = 5), aggregated
with k = 5 hypotheses and the budget-aware weights (``aggregation = weighted``), in two arms
(``--arms``), each the very ``aggregate_fit`` a ServerApp runs:

``mean``
    the papers' clusters (k-means, budget-weighted cluster means; the app's default);
``robust``
    ``gpfl launch``'s robust clusters (:data:`deploy.quickstart.ROBUST_CLUSTERS`:
    ``clipped-mean`` and the persistence test at ``persistence-threshold = 3``).

Prints a Markdown table per arm and, with both, the ratio robust / mean of their CPU times.

Time: CPU time (``time.process_time``: the process's own, whatever else the machine runs) and
wall time, each the best of ``--repeats`` calls (the strategy is rebuilt before each, so every
call screens and clusters the same replies from the same hypotheses, with empty persistence
sums). Run it with ``OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1`` to compare one core's work.

Peak memory, two ways:

* ``tracemalloc``: the peak of traced allocations during one call minus what was allocated
  before it. NumPy reports its array buffers to tracemalloc, so this counts every array the
  call makes (ours and scikit-learn's), but not BLAS/OpenMP scratch space.
* ``RSS`` (Linux only): in a fresh child process (``spawn``) that has built the replies, the
  peak resident set size during one call (``VmHWM``, reset just before the call through
  ``/proc/self/clear_refs``) minus the resident set size before it. It counts everything the
  process touched (BLAS and OpenMP buffers, the interpreter), at page granularity.

Run: ``python -m experiments.benchmarks.bench_aggregate [--replies 100 --params 1000000 --repeats 3
--arms mean,robust --no-memory]``.
"""

from __future__ import annotations

import argparse
import gc
import multiprocessing as mp
import sys
import time
import tracemalloc
from collections.abc import Mapping
from typing import Any

import numpy as np
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters
from flwr.server.client_proxy import ClientProxy

from deploy.quickstart import ROBUST_CLUSTERS
from experiments.core.in_process import NodeProxy
from strategies import ClusteredStrategy

K = 5
#: The arms: run settings on top of the weighted cluster means (see the module notes).
ARMS: dict[str, Mapping[str, Any]] = {
    "mean": {"cluster-aggregator": "mean", "persistence-threshold": 0.0},
    "robust": ROBUST_CLUSTERS,
}


def make_replies(
    replies: int, params: int, seed: int = 0
) -> tuple[list[np.ndarray], list[tuple[ClientProxy, FitRes]]]:
    """Return (k initial hypotheses, U serialised replies around k separated centres)."""
    rng = np.random.default_rng(seed)
    centres = (10.0 * np.arange(K, dtype=np.float32))[:, None] + rng.standard_normal(
        (K, params), dtype=np.float32
    )
    results: list[tuple[ClientProxy, FitRes]] = []
    for i in range(replies):
        vector = centres[i % K] + rng.standard_normal(params, dtype=np.float32)
        sigma = 0.5 + (i % 3)
        res = FitRes(
            status=Status(code=Code.OK, message=""),
            parameters=ndarrays_to_parameters([vector]),
            num_examples=1,
            # Laplace with a fixed calibration declares σ; the magnitude rules are then the
            # absolute cap and the relative rule (the Gaussian bound would need real releases).
            metrics={"declined": 0, "sigma": sigma, "mechanism": "laplace",
                     "client-name": f"client-{i}"},
        )
        results.append((NodeProxy(str(i)), res))
    # Start each hypothesis near its centre, perturbed: k-means has work to do.
    hypotheses = centres + np.float32(3.0) * rng.standard_normal((K, params), dtype=np.float32)
    return list(hypotheses), results


def _strategy(hypotheses: list[np.ndarray], clients: int, arm: str = "mean"
              ) -> ClusteredStrategy:
    settings = ARMS[arm]
    return ClusteredStrategy(
        initial_hypotheses=[[h] for h in hypotheses],
        clients_per_round=clients,
        aggregation="weighted",
        cluster_aggregator=settings["cluster-aggregator"],
        persistence_threshold=settings["persistence-threshold"],
        rng=np.random.default_rng(1),
    )


def replies_nbytes(results: list[tuple[ClientProxy, FitRes]]) -> int:
    """Bytes of the replies' serialised tensors (what the server has received)."""
    return sum(len(t) for _, res in results for t in res.parameters.tensors)


def time_aggregate(
    hypotheses: list[np.ndarray], results: list[tuple[ClientProxy, FitRes]], repeats: int,
    arm: str = "mean",
) -> tuple[float, float, list[int]]:
    """Best CPU time and best wall time of ``repeats`` calls, and the cluster sizes found."""
    best_cpu = best_wall = float("inf")
    sizes: list[int] = []
    for _ in range(repeats):
        strategy = _strategy(hypotheses, len(results), arm)
        gc.collect()
        cpu, wall = time.process_time(), time.perf_counter()
        _, metrics = strategy.aggregate_fit(1, results, [])
        best_cpu = min(best_cpu, time.process_time() - cpu)
        best_wall = min(best_wall, time.perf_counter() - wall)
        sizes = [int(metrics[f"cluster-size-{j}"]) for j in range(K)]
    return best_cpu, best_wall, sizes


def traced_peak(hypotheses: list[np.ndarray], results: list[tuple[ClientProxy, FitRes]],
                arm: str = "mean") -> int:
    """Peak traced allocation of one call above what was allocated before it."""
    strategy = _strategy(hypotheses, len(results), arm)
    gc.collect()
    tracemalloc.start()
    before, _ = tracemalloc.get_traced_memory()
    strategy.aggregate_fit(1, results, [])
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak - before


def _proc_status_bytes(field: str) -> int:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024  # "VmHWM:  123 kB"
    raise KeyError(field)


def _rss_child(replies: int, params: int, arm: str, queue: mp.Queue) -> None:
    hypotheses, results = make_replies(replies, params)
    strategy = _strategy(hypotheses, len(results), arm)
    import sklearn.cluster  # noqa: F401  (imported before the baseline, as in a warm server)

    gc.collect()
    # Linux: writing 5 to clear_refs resets the peak RSS (VmHWM) to the current RSS, so the
    # peak below is the call's own. (getrusage's ru_maxrss cannot be reset and, after fork and
    # exec, starts from the parent's RSS.)
    with open("/proc/self/clear_refs", "w", encoding="ascii") as clear_refs:
        clear_refs.write("5")
    before = _proc_status_bytes("VmRSS")
    strategy.aggregate_fit(1, results, [])
    queue.put(_proc_status_bytes("VmHWM") - before)


def rss_delta(replies: int, params: int, arm: str = "mean") -> int | None:
    """Peak RSS of a fresh process during one call minus its RSS before (Linux only)."""
    if not sys.platform.startswith("linux"):
        return None
    ctx = mp.get_context("spawn")
    queue: mp.Queue = ctx.Queue()
    child = ctx.Process(target=_rss_child, args=(replies, params, arm, queue))
    child.start()
    delta = int(queue.get())
    child.join()
    return delta


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark and print a Markdown table per arm (and their CPU-time ratio)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replies", type=int, default=100, help="U, replies per round")
    parser.add_argument("--params", type=int, default=1_000_000, help="n, parameters per model")
    parser.add_argument("--repeats", type=int, default=3, help="timing: best of this many")
    parser.add_argument("--arms", default="mean,robust",
                        help=f"comma-separated, of {', '.join(ARMS)}")
    parser.add_argument("--no-memory", action="store_true", help="time only")
    args = parser.parse_args(argv)
    arms = [a for a in args.arms.split(",") if a]
    unknown = sorted(set(arms) - set(ARMS))
    if unknown:
        parser.error(f"--arms: unknown {', '.join(unknown)}; known: {', '.join(ARMS)}")

    import sklearn.cluster  # noqa: F401  (keep its ~2 s import out of the timing)

    hypotheses, results = make_replies(args.replies, args.params)
    size = replies_nbytes(results)
    mib = 2.0**20
    cpu: dict[str, float] = {}
    for arm in arms:
        seconds, wall, sizes = time_aggregate(hypotheses, results, args.repeats, arm)
        cpu[arm] = seconds
        print(f"aggregate_fit, arm {arm} ({dict(ARMS[arm])}): U={args.replies} replies, "
              f"n={args.params} float32, k={K}, aggregation=weighted")
        print(f"cluster sizes found: {sizes} (expected {args.replies // K} each)\n")
        print("| measure | value | / replies' size |")
        print("| --- | ---: | ---: |")
        print(f"| CPU time (best of {args.repeats}) | {seconds:.3f} s | |")
        print(f"| wall time (best of {args.repeats}) | {wall:.3f} s | |")
        print(f"| replies' size | {size / mib:.0f} MiB | 1.00 |")
        if not args.no_memory:
            traced = traced_peak(hypotheses, results, arm)
            print(f"| peak extra memory, tracemalloc | {traced / mib:.0f} MiB | "
                  f"{traced / size:.2f} |")
            rss = rss_delta(args.replies, args.params, arm)
            if rss is not None:
                print(f"| peak extra memory, RSS (child) | {rss / mib:.0f} MiB | "
                      f"{rss / size:.2f} |")
        print()
    if "mean" in cpu and "robust" in cpu:
        print(f"robust / mean, CPU time: {cpu['robust']:.3f} s / {cpu['mean']:.3f} s = "
              f"{cpu['robust'] / cpu['mean']:.2f}")


if __name__ == "__main__":
    main()
