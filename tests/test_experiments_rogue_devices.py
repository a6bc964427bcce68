"""The rogue-devices experiment: its smoke profile end to end, and its reading of the criterion."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from experiments.audits.rogue_devices import COLUMNS, best_unit, section
from experiments.cli import run_experiment
from experiments.core.tables import read_csv


def test_smoke_profile_runs_each_arm_with_and_without_a_rogue_and_reuses_its_cache(
    tmp_path: Path,
) -> None:
    out, cache = tmp_path / "out", tmp_path / "cache"

    rows = run_experiment("rogue-devices", out=out, cache=cache, profile="smoke")

    assert [(r["arm"], r["rogues"]) for r in rows] == [
        ("mean", 0), ("mean", 1), ("robust", 0), ("robust", 1)]
    written = read_csv(out / "results.csv")
    assert list(written[0]) == list(COLUMNS)
    # The rogue charges honestly: every device released every round, n/ν = 2/5 each.
    assert {(float(r["spend_median"]), float(r["spend_max"])) for r in written} == {(1.6, 1.6)}
    # The rogue's release replaced its honest one and was accepted: the same seed (data, noise,
    # devices) ends elsewhere with it than without it, and no rogue reply was dropped.
    by = {(r["arm"], r["rogues"]): r for r in written}
    for arm in ("mean", "robust"):
        assert by[arm, "1"]["last_0"] != by[arm, "0"]["last_0"]
        assert by[arm, "1"]["rogue_dropped"] == "0"
    text = "\n".join(section(written))
    assert "| robust | 1 |" in text and "Cost of robustness without rogues" in text

    again = run_experiment("rogue-devices", out=out, cache=cache, profile="smoke")
    assert again == rows  # every federation read back from the cache


def _rows(arm: str, rogues: int, hits: int, n: int = 10) -> list[dict[str, str]]:
    return [{"arm": arm, "rogues": str(rogues), "seed": str(s), "rounds": "80",
             "last_0": "0.1" if s < hits else "3.0", "last_1": "0.2",
             "delivered_0": "0.1", "delivered_1": "0.2", "honest_dropped": "0",
             "rogue_dropped": "0", "spend_median": "32", "spend_max": "32"} for s in range(n)]


def test_the_criterion_reads_overlapping_wilson_intervals() -> None:
    # 10/10 without rogues: [0.72, 1.00]; 8/10: [0.49, 0.94] overlaps; 2/10: [0.06, 0.51] not.
    rows = _rows("robust", 0, 10) + _rows("robust", 1, 8) + _rows("robust", 2, 2)
    rows += _rows("mean", 0, 5)

    text = "\n".join(section(rows))

    # The robust arm is what `gpfl launch` runs (deploy.quickstart.ROBUST_CLUSTERS).
    assert "- robust (`gpfl launch`'s), 1 rogue(s): 8/10 against 10/10 without: met" in text
    assert "- robust (`gpfl launch`'s), 2 rogue(s): 2/10 against 10/10 without: **not met**" \
        in text
    assert "| robust | 0 | 10/10 [0.72, 1.00] |" in text
    # Paired by seed: seeds 5-9 are 3.0 for the mean and 0.2 for robust: mean −1.4.
    assert "- -1.400 [" in text


def _best_unit_by_loop(total, count, direction, threshold):
    """The search as a plain double loop over angles and lengths: the reference."""
    radius = threshold * math.sqrt(count + 1) * (1 - 1e-3)
    across = total - (total @ direction) * direction
    size = np.linalg.norm(across)
    across = across / size if size > 0 else np.zeros_like(direction)
    best, score = np.zeros_like(direction), 0.0
    for theta in np.linspace(-math.pi, math.pi, 721):
        way = math.cos(theta) * direction + math.sin(theta) * across
        for length in np.linspace(1.0, 0.0, 101):
            if np.linalg.norm(total + length * way) < radius:
                if length * math.cos(theta) > score:
                    best, score = length * way, length * math.cos(theta)
                break
    return best


def test_the_rogues_unit_search_is_the_double_loops_answer() -> None:
    # 40 seeded cases: sums inside and outside the ball, counts 0-9, levels 0.1-2.
    rng = np.random.default_rng(0)
    for _ in range(40):
        direction = rng.normal(size=2)
        direction /= np.linalg.norm(direction)
        total = rng.normal(size=2) * rng.uniform(0, 3)
        count, level = int(rng.integers(0, 10)), float(rng.uniform(0.1, 2))

        found = best_unit(total, count, direction, level)

        assert found.tolist() == _best_unit_by_loop(total, count, direction, level).tolist()
