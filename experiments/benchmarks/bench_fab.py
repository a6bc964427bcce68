"""Benchmark: what building the run's FAB costs, from the app folder and from gpfl's copy of it.

``flwr run <dir>`` builds the FAB from every file under ``dir`` before its filters drop most of
them; ``gpfl launch`` hands it the copy :func:`deploy.fab.stage_app` makes instead. Prints the
files under each folder and the CPU seconds of each step, and whether both FABs are the same.

    python -m experiments.benchmarks.bench_fab            # this checkout
    python -m experiments.benchmarks.bench_fab --app DIR
"""

from __future__ import annotations

import argparse
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from flwr.cli.build import build_fab_from_disk

from deploy.fab import stage_app
from deploy.federation import project_root

T = TypeVar("T")


def timed(step: Callable[[], T]) -> tuple[T, float]:
    """Return ``step()`` and the CPU seconds this process spent in it."""
    start = time.process_time()
    value = step()
    return value, time.process_time() - start


def files_under(folder: Path) -> int:
    """Count the files under ``folder``, links left out as Flower leaves them out."""
    return sum(1 for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def main(argv: list[str] | None = None) -> None:
    """Build the FAB both ways and print the costs."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--app", type=Path, default=project_root())
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore", DeprecationWarning)  # Flower's "gitwildmatch" patterns
    direct, direct_s = timed(lambda: build_fab_from_disk(args.app))
    with tempfile.TemporaryDirectory(prefix="gpfl-fab-") as tmp:
        staged, stage_s = timed(lambda: stage_app(args.app, Path(tmp)))
        copied, build_s = timed(lambda: build_fab_from_disk(staged))
        print("| FAB built from | files | CPU s |\n| --- | ---: | ---: |")
        print(f"| the app folder | {files_under(args.app):,} | {direct_s:.2f} |")
        print(f"| gpfl's copy (copy + build) | {files_under(staged):,} | "
              f"{stage_s:.2f} + {build_s:.2f} |")
    print(f"same FAB: {copied == direct} ({len(direct):,} bytes)")


if __name__ == "__main__":
    main()
