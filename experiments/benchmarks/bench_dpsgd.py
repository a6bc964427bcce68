r"""Benchmark: a device's DP-SGD epoch against Opacus's ``make_private`` epoch, same model, batch.

Ours is :func:`tasks.dpsgd.train_record_level`, the function a record-level release trains
with (:func:`client.record_release.release_record`), with noise from a fresh
:func:`mechanisms.device_rng` as the client draws it: Opacus's per-sample gradients, the
clipping and float64 batch sum of :mod:`tasks.clipped_sum`, the device's Gaussian noise
(NumPy, float64) and the exact rounding of each noisy sum onto its public grid. Opacus's is
``PrivacyEngine().make_private`` (Poisson sampling, its DP-SGD optimizer with torch's float32
noise, ``secure_mode`` off as in its examples) and one pass over its data loader. Both build
the model from the same starting parameters and wrap it for per-sample gradients inside the
timed call; both run Opacus's epoch: T = ⌈records / batch⌉ Poisson batches at rate 1/T (an
expected ``--batch`` records or a little fewer), at C = 1 and ν = 1. A plain epoch (no
per-sample gradients, no noise, batches of ``--batch``) shows what DP costs at all. The
three alternate in one process (a busy machine slows all alike); medians, the median of each
alternation's own ratio, and the best times::

    python -m experiments.benchmarks.bench_dpsgd [--repeats 15] [--batch 32] [--users 4] \
        [--threads 1]

The digits task's CNN (83,562 parameters); ``--users 4`` gives partition 0 360 records.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from mechanisms import device_rng
from mechanisms.record_clipping import split_noise
from tasks.digits import DigitsTask
from tasks.dpsgd import RecordTraining, train_record_level
from tasks.torch_support import from_arrays

STRATEGIES = ("fixed", "quantile", "oso")


@dataclass(frozen=True)
class Result:
    """Median seconds of one epoch of each kind, for one clipping strategy of ours."""

    strategy: str
    records: int
    batch: int
    steps: int
    ours: float
    opacus: float
    plain: float
    repeats: int
    paired: float
    best_ours: float
    best_opacus: float

    @property
    def ratio(self) -> float:
        """Our median epoch over Opacus's."""
        return self.ours / self.opacus


class Epochs:
    """The three epochs on one device's data, from one starting model."""

    def __init__(self, users: int, batch: int, strategy: str) -> None:
        self.task = DigitsTask(users=users)
        self.data = self.task.client_dataset(0, users)
        self.params = self.task.init_parameters(np.random.default_rng(0))
        self.x, self.y = self.task._tensors(self.data, torch.device("cpu"))
        self.batch = batch
        # As Opacus's Poisson data loader makes an epoch of a loader of batches of ``batch``:
        # ⌈records / batch⌉ steps at rate 1 / steps.
        self.steps = math.ceil(len(self.data) / batch)
        self.rate = 1.0 / self.steps
        self.training = RecordTraining(
            strategy=strategy, split=split_noise(strategy, 1.0), sampling_rate=self.rate,
            steps=self.steps, expected_batch=batch, clip=1.0, learning_rate=0.1)

    def ours(self) -> None:
        """One epoch of the device's DP-SGD (the production function)."""
        train_record_level(self.task, self.params, self.data, self.training, device_rng())

    def opacus(self) -> None:
        """Wrap with ``make_private`` and run one epoch of its Poisson batches."""
        from opacus import PrivacyEngine

        model = from_arrays(self.task.model(), self.params)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = DataLoader(TensorDataset(self.x, self.y), batch_size=self.batch)
        with warnings.catch_warnings():
            # Its secure-RNG notice, and the hook notice on the first layer (as in ours).
            warnings.simplefilter("ignore")
            model, optimizer, loader = PrivacyEngine().make_private(
                module=model, optimizer=optimizer, data_loader=loader, noise_multiplier=1.0,
                max_grad_norm=1.0, poisson_sampling=True)
            for x, y in loader:
                optimizer.zero_grad()
                F.cross_entropy(model(x), y).backward()
                optimizer.step()

    def plain(self) -> None:
        """One epoch of SGD without DP, batches of the expected size."""
        model = from_arrays(self.task.model(), self.params)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in DataLoader(TensorDataset(self.x, self.y), batch_size=self.batch,
                               shuffle=True):
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()


def _seconds(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def benchmark(strategies: Sequence[str], *, users: int, batch: int,
              repeats: int) -> list[Result]:
    """Return one :class:`Result` per strategy (medians of ``repeats`` alternations)."""
    results = []
    for strategy in strategies:
        epochs = Epochs(users, batch, strategy)
        kinds = {"ours": epochs.ours, "opacus": epochs.opacus, "plain": epochs.plain}
        for fn in kinds.values():
            fn()  # warm-up: imports, first allocations
        times: dict[str, list[float]] = {name: [] for name in kinds}
        for _ in range(repeats):
            for name, fn in kinds.items():
                times[name].append(_seconds(fn))
        # Each alternation's own ratio too: a load spike slows one pair, not the median.
        paired = statistics.median(o / p for o, p in zip(times["ours"], times["opacus"],
                                                          strict=True))
        results.append(Result(strategy, len(epochs.data), batch, epochs.steps,
                              statistics.median(times["ours"]),
                              statistics.median(times["opacus"]),
                              statistics.median(times["plain"]), repeats, paired,
                              min(times["ours"]), min(times["opacus"])))
    return results


def markdown(results: Sequence[Result]) -> str:
    """Render the results as a Markdown table."""
    lines = ["| clipping | records | batch | steps | plain (ms) | Opacus make_private (ms) "
             "| ours (ms) | ours / Opacus | paired ratio | best: Opacus, ours (ms) |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in results:
        lines.append(f"| {r.strategy} | {r.records} | {r.batch} | {r.steps} | "
                     f"{r.plain * 1e3:.1f} | {r.opacus * 1e3:.1f} | {r.ours * 1e3:.1f} | "
                     f"{r.ratio:.2f} | {r.paired:.2f} | {r.best_opacus * 1e3:.1f}, "
                     f"{r.best_ours * 1e3:.1f} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    """Run the benchmark and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--repeats", type=int, default=15, help="timed alternations")
    parser.add_argument("--batch", type=int, default=32, help="expected batch size")
    parser.add_argument("--users", type=int, default=4,
                        help="digits users (partition 0's records: 1438 / users)")
    parser.add_argument("--strategies", nargs="+", default=["fixed"], choices=STRATEGIES)
    parser.add_argument("--threads", type=int, default=1, help="torch's intra-op threads")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    results = benchmark(args.strategies, users=args.users, batch=args.batch,
                        repeats=args.repeats)
    print(f"medians of {args.repeats}, in one process, alternating; "
          f"{torch.get_num_threads()} torch thread(s):")
    print(markdown(results))


if __name__ == "__main__":
    main()
