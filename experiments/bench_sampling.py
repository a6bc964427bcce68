"""Benchmark: Euclidean Laplace sampling against drawing the standard normals alone.

``sample_euclidean_laplace(n, ε, rng)`` draws n standard normals, one Gamma radius,
one dot product and one in-place scaling; the goal is at most 1.1x the time of
``rng.standard_normal(n)``. Prints a Markdown table (best of several repeats)::

    python -m experiments.bench_sampling [--repeats 15]
"""

from __future__ import annotations

import argparse
import functools
import timeit
from collections.abc import Callable, Sequence

import numpy as np

from mechanisms import sample_euclidean_laplace

SIZES = (10**3, 10**4, 10**5, 10**6)


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


if __name__ == "__main__":
    main()
