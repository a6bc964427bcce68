"""Benchmark: Euclidean Laplace sampling against drawing the standard normals alone.

``sample_euclidean_laplace(n, ε, rng)`` draws n standard normals, one Gamma radius,
one dot product and one in-place scaling: it should take at most 1.1x the time of
``rng.standard_normal(n)``. Prints a Markdown table (best of several repeats)::

    python -m experiments.benchmarks.bench_sampling [--repeats 15]

Then, at n = 10^6, the client's path (a fresh generator seeded with 128 bits from
the OS CSPRNG for every release, :func:`mechanisms.device_rng`) against one
generator reused for every release (the path before devices drew their own noise):
both times, best of the repeats, and their ratio.
"""

from __future__ import annotations

import argparse
import functools
import timeit
from collections.abc import Callable, Sequence

import numpy as np

from mechanisms import device_rng, sample_euclidean_laplace

SIZES = (10**3, 10**4, 10**5, 10**6)
DEVICE_RNG_SIZE = 10**6


def best_time(fn: Callable[[], object], number: int, repeats: int) -> float:
    """Best (smallest) mean seconds per call over ``repeats`` rounds of ``number`` calls."""
    return min(timeit.repeat(fn, number=number, repeat=repeats)) / number


def benchmark(sizes: Sequence[int], repeats: int, seed: int = 0) -> list[tuple[int, float, float]]:
    """Return ``(n, normals seconds, ours seconds)`` for each size.

    The two are timed in alternation, round by round, so that a busy machine
    slows both alike.
    """
    rng = np.random.default_rng(seed)
    rows = []
    for n in sizes:
        number = max(1, 200_000 // n)
        normals, ours = [], []
        draw_normals = functools.partial(rng.standard_normal, n)
        draw_ours = functools.partial(sample_euclidean_laplace, n, 1.0, rng)
        for _ in range(repeats):
            normals.append(best_time(draw_normals, number, 1))
            ours.append(best_time(draw_ours, number, 1))
        rows.append((n, min(normals), min(ours)))
    return rows


def benchmark_device_rng(n: int, repeats: int, seed: int = 0) -> tuple[float, float]:
    """Return ``(reused seconds, fresh seconds)`` per release of ``n`` coordinates.

    "reused": one generator for every release. "fresh": :func:`device_rng` makes a
    new CSPRNG-seeded generator for each release, and its cost is part of the
    release. Timed in alternation, best of ``repeats`` rounds, as in
    :func:`benchmark`.
    """
    rng = np.random.default_rng(seed)
    number = max(1, 200_000 // n)

    def reused() -> object:
        return sample_euclidean_laplace(n, 1.0, rng)

    def fresh() -> object:
        return sample_euclidean_laplace(n, 1.0, device_rng())

    reused_times, fresh_times = [], []
    for _ in range(repeats):
        reused_times.append(best_time(reused, number, 1))
        fresh_times.append(best_time(fresh, number, 1))
    return min(reused_times), min(fresh_times)


def markdown(rows: Sequence[tuple[int, float, float]]) -> str:
    """Render the rows as a Markdown table."""
    lines = ["| n | normals (ms) | ours (ms) | ratio |", "| ---: | ---: | ---: | ---: |"]
    for n, normals, ours in rows:
        lines.append(f"| {n:,} | {normals * 1e3:.4f} | {ours * 1e3:.4f} | {ours / normals:.3f} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    """Run the benchmark and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--repeats", type=int, default=15, help="timing rounds per size")
    args = parser.parse_args(argv)
    print(markdown(benchmark(SIZES, args.repeats)))
    reused, fresh = benchmark_device_rng(DEVICE_RNG_SIZE, args.repeats)
    print()
    print(f"n = {DEVICE_RNG_SIZE:,}, best of {args.repeats}:")
    print(f"  one reused generator:                {reused * 1e3:.3f} ms per release")
    print(f"  device_rng() per release (CSPRNG):   {fresh * 1e3:.3f} ms per release")
    print(f"  ratio fresh / reused:                {fresh / reused:.3f}")


if __name__ == "__main__":
    main()
