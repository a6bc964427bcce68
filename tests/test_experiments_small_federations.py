"""The small-federations experiment: its smoke profile end to end, its table, its intervals."""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments.cli import run_experiment
from experiments.core.tables import read_csv
from experiments.reproductions.small_federations import COLUMNS, section, wilson


def test_wilson_intervals_by_hand() -> None:
    # p = 1/2, n = 20, z = 1.96: centre (0.5 + 0.0960) / 1.1921 = 0.5, half-width
    # 1.96 · sqrt(0.0125 + 0.0024) / 1.1921 = 0.2007. 0/20: centre = half = 0.0806.
    assert wilson(10, 20) == pytest.approx((0.2993, 0.7007), abs=1e-4)
    assert wilson(0, 20) == pytest.approx((0.0, 0.1611), abs=1e-4)
    assert wilson(20, 20) == pytest.approx((0.8389, 1.0), abs=1e-4)


def test_smoke_profile_runs_every_arm_charges_each_round_and_reuses_its_cache(
    tmp_path: Path,
) -> None:
    out, cache = tmp_path / "out", tmp_path / "cache"

    rows = run_experiment("small-federations", out=out, cache=cache, profile="smoke")

    # 4 devices, 8 rounds, 2 seeds, three arms (the guard alone runs at 4 devices).
    assert [(r["arm"], r["seed"]) for r in rows] == [
        (arm, seed) for arm in ("papers", "papers+reseed", "gpfl") for seed in (0, 1)]
    written = read_csv(out / "results.csv")
    assert list(written[0]) == list(COLUMNS)
    # Every device released in every round, n/ν = 2/5 each: 8 · 0.4 = 3.2, whatever the update.
    assert {(float(r["spend_median"]), float(r["spend_max"])) for r in written} == {(3.2, 3.2)}
    text = "\n".join(section(written))
    assert "| 4 | gpfl | 2 |" in text and "not measured" in text  # 8 rounds: no horizon reached

    again = run_experiment("small-federations", out=out, cache=cache, profile="smoke")
    assert again == rows  # every federation read back from the cache
