"""Benchmark: a device's whole release path against drawing n float32 standard normals.

One release, as :meth:`client.numpy_client.GpflClient.fit` makes it once the model is
trained: the instruction's checks (:func:`client.release.check_instruction`), the plan
(:func:`client.release.plan_release`), the charge on a real :class:`~mechanisms.PrivacyLedger`
(in a temporary folder), and :func:`client.release.make_release` with noise from a fresh
:func:`mechanisms.device_rng` (the exact release on its grid, the float32 cast, the release
invariant). The baseline is ``rng.standard_normal(n, dtype=np.float32)`` with NumPy's
default generator. Both are timed in the same process, in alternation (a busy machine slows
both alike), for Laplace (neighbourhood calibration) and Gaussian at n = 10^6 and 10^7::

    python -m experiments.benchmarks.bench_release [--repeats 7] [--sizes 1000000 10000000]

Prints a Markdown table of medians and their ratio, then each stage's median (``--stages``).
"""

from __future__ import annotations

import argparse
import functools
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from client.policy import DevicePolicy
from client.release import check_instruction, make_release, plan_release
from client.settings import ClientSettings
from mechanisms import PrivacyLedger, cast_release, device_rng
from mechanisms.invariant import verify_release
from settings import federation_defaults

SIZES = (10**6, 10**7)
MECHANISMS: dict[str, dict[str, Any]] = {
    "laplace neighbourhood": {"mechanism": "laplace", "calibration": "neighbourhood"},
    "gaussian": {"mechanism": "gaussian"},
}


@dataclass(frozen=True)
class Row:
    """One mechanism at one size: median seconds of the release and of the normals."""

    mechanism: str
    n: int
    normals: float
    release: float
    repeats: int

    @property
    def ratio(self) -> float:
        """Release time over the normals' time."""
        return self.release / self.normals


class Device:
    """A device's settings and ledger, and one instruction of ``n`` parameters (float32)."""

    def __init__(self, request: dict[str, Any], n: int, folder: str, name: str,
                 seed: int = 0) -> None:
        node = {"partition-id": 0, "num-partitions": 1, "ledger-dir": folder}
        run = {**federation_defaults(), **request}
        self.settings = ClientSettings.resolve(run, DevicePolicy.load(node, environ={}))
        self.ledger = PrivacyLedger(Path(folder) / f"{name}.json",
                                    delta=self.settings.privacy.ledger_delta)
        rng = np.random.default_rng(seed)
        self.parameters = [rng.standard_normal(n, dtype=np.float32)]
        # The trained model (not timed: training is not part of the release).
        step = rng.standard_normal(n, dtype=np.float32) * np.float32(1e-3)
        self.updated = [self.parameters[0] + step]
        self.config = {"num-hypotheses": 1}

    def release(self) -> list[np.ndarray]:
        """Check, plan, charge and release, as the client does."""
        s = self.settings
        hypotheses = check_instruction(self.parameters, self.config, max_abs=s.max_parameter,
                                       max_hypotheses=s.max_hypotheses)
        plan = plan_release(s.privacy, hypotheses, max_abs=s.max_parameter)
        self.ledger.charge(plan.event, cap=None)
        return make_release(plan, hypotheses[0], self.updated, rng=device_rng())

    def stages(self) -> dict[str, Callable[[], object]]:
        """Each stage of :meth:`release` alone (inputs precomputed)."""
        s = self.settings
        hypotheses = check_instruction(self.parameters, self.config, max_abs=s.max_parameter,
                                       max_hypotheses=s.max_hypotheses)
        plan = plan_release(s.privacy, hypotheses, max_abs=s.max_parameter)
        reference = hypotheses[0]
        exact = plan.mechanism.sanitize_exact(reference, self.updated, rng=device_rng(),
                                              spread=plan.spread)
        released = cast_release(exact, self.updated)
        return {
            "check_instruction": lambda: check_instruction(
                self.parameters, self.config, max_abs=s.max_parameter,
                max_hypotheses=s.max_hypotheses),
            "plan_release": lambda: plan_release(s.privacy, hypotheses, max_abs=s.max_parameter),
            "ledger charge": lambda: self.ledger.charge(plan.event, cap=None),
            "sanitize_exact (noise + grid)": lambda: plan.mechanism.sanitize_exact(
                reference, self.updated, rng=device_rng(), spread=plan.spread),
            "cast_release": lambda: cast_release(exact, self.updated),
            "verify_release": lambda: verify_release(
                plan.mechanism, plan.event, reference=reference, updated=self.updated,
                released=released, exact=exact, spread=plan.spread),
        }


def _seconds(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def benchmark(sizes: Sequence[int], repeats: int) -> list[Row]:
    """Return one :class:`Row` per mechanism and size (medians of ``repeats`` alternations)."""
    normal_rng = np.random.default_rng(0)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for n in sizes:
            for label, request in MECHANISMS.items():
                device = Device(request, n, folder, f"{label} {n}")
                device.release()  # warm-up (imports, first ledger write)
                normals, releases = [], []
                for _ in range(repeats):
                    normals.append(_seconds(functools.partial(
                        normal_rng.standard_normal, n, dtype=np.float32)))
                    releases.append(_seconds(device.release))
                rows.append(Row(label, n, statistics.median(normals),
                                statistics.median(releases), repeats))
    return rows


def stage_times(n: int, repeats: int) -> dict[str, dict[str, float]]:
    """Return mechanism → stage → median seconds at ``n``."""
    out = {}
    with tempfile.TemporaryDirectory() as folder:
        for label, request in MECHANISMS.items():
            stages = Device(request, n, folder, f"stages {label}").stages()
            out[label] = {name: statistics.median(_seconds(fn) for _ in range(repeats))
                          for name, fn in stages.items()}
    return out


def markdown(rows: Sequence[Row]) -> str:
    """Render the rows as a Markdown table."""
    lines = ["| mechanism | n | normals float32 (ms) | release path (ms) | ratio |",
             "| --- | ---: | ---: | ---: | ---: |"]
    for r in rows:
        lines.append(f"| {r.mechanism} | {r.n:,} | {r.normals * 1e3:.1f} | "
                     f"{r.release * 1e3:.1f} | {r.ratio:.2f} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    """Run the benchmark and print the table (and the stages with ``--stages``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--repeats", type=int, default=7, help="timed alternations per row")
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--stages", action="store_true",
                        help="also time each stage alone at the largest size")
    args = parser.parse_args(argv)
    rows = benchmark(args.sizes, args.repeats)
    print(f"medians of {args.repeats}, in one process, alternating:")
    print(markdown(rows))
    if args.stages:
        n = max(args.sizes)
        print(f"\nstages at n = {n:,} (median of {args.repeats}, ms):")
        for label, stages in stage_times(n, args.repeats).items():
            print(f"  {label}: " + ", ".join(f"{k} {v * 1e3:.1f}" for k, v in stages.items()))


if __name__ == "__main__":
    main()
