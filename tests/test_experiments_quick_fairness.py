"""The fairness, personalized-budgets and scale experiments, run for real on the Simulation Engine.

The other experiments are in ``test_experiments_quick.py`` (its docstring says how they run);
this file is apart so that the two files run side by side on two pytest workers (~9 minutes).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments.benchmarks import scale
from tests.test_experiments_quick import _cell, _figures, _run, root

pytestmark = [pytest.mark.integration, pytest.mark.slow]
__all__ = ["root"]  # the module-scoped fixture: this file's own temporary root


@pytest.mark.timeout(600)
def test_fairness_personalization_closes_the_opportunity_gap(root: Path) -> None:
    rows = _run(root, "fairness")
    synthetic = [r for r in rows if r["dataset"] == "synthetic"]
    digits = [r for r in rows if r["dataset"] == "digits"]
    eo1 = _cell(synthetic, "equal_opportunity_difference", nu=1.0, k=1)
    eo2 = _cell(synthetic, "equal_opportunity_difference", nu=1.0, k=2)
    odds1 = _cell(synthetic, "equalized_odds_difference", nu=1.0, k=1)
    odds2 = _cell(synthetic, "equalized_odds_difference", nu=1.0, k=2)
    # 004 Fig. 2.7: the personalized model is fairer. One model mislabels the minority (its
    # labels follow the opposite rule): gaps ~0.3-0.4; two models serve both groups: < 0.1.
    # The device sample differs between runs, so this is one draw of a random outcome: at the
    # smoke profile's 60 rounds k = 2's gap was 0.005-0.08 in 4 runs and k = 1's 0.29-0.35
    # (`fairness.PROFILES` says why 20 rounds were too few: 0.01-0.40).
    assert eo2 < eo1 - 0.1 and odds2 < odds1 - 0.1, (eo1, eo2, odds1, odds2)
    # 004 Fig. 2.8 on 8×8 digits, parity labels flipped for the rotated 20 %, without noise:
    # one model must serve two opposite labelling rules, so two models beat one. In our quick
    # run (ν ∈ {0.1, 1, 2, 4}) k = 2 reached 0.97-0.98 against 0.94-0.95 and its equalized-odds
    # gap was 0.01-0.06 against 0.09-0.19 at every ν; k = 2 split the users 8:2 every time.
    acc1 = _cell(digits, "accuracy", nu=0.0, k=1)
    acc2 = _cell(digits, "accuracy", nu=0.0, k=2)
    digits_odds1 = _cell(digits, "equalized_odds_difference", nu=0.0, k=1)
    digits_odds2 = _cell(digits, "equalized_odds_difference", nu=0.0, k=2)
    assert acc2 > acc1 > 0.8, (acc1, acc2)
    assert digits_odds2 < digits_odds1, (digits_odds1, digits_odds2)
    assert _figures(root, "fairness") == ["figure2_7_fairness.png",
                                          "figure2_8_fairness_digits.png"]


@pytest.mark.timeout(450)
def test_personalized_budgets_weighted_and_probability_beat_the_mean(root: Path) -> None:
    rows = _run(root, "personalized-budgets")
    assert {r["panel"] for r in rows} == {"digits-iid-gaussian"}
    by = {m: [float(r["accuracy"]) for r in rows if r["method"] == m] for m in "ABC"}
    assert all(len(v) == 1 for v in by.values()), by
    (a,), (b,), (c,) = by["A"], by["B"], by["C"]
    # 002 (IID, Gaussian, ε = (1, 1, 10) per round): B (weights ∝ 1/σ) and C (selection with
    # P ∝ 1/σ) average less noise than A. Two of three clients release with σ 6.4× that of the
    # third, so A's aggregate is ~2.3× noisier than B's; after 10 rounds A is at 0.15-0.25 and
    # B, C at 0.35-0.55 in our runs (3 seeds of an in-process replica, 1 real run), so the
    # ordering holds with a wide margin. A weighting ∝ σ instead of 1/σ would favour the
    # noisy clients and put B below A.
    assert b > a and c > a, by
    assert a < 0.9, "the noise must matter, else the comparison says nothing"
    # Per-round budgets compose: the ledgers report the ε = 10 clients' 10 releases at
    # ε ≈ 52.6 (RDP at δ = 0.002), far above the nominal 10.
    assert all(float(r["max_epsilon"]) > 10 * 1.5 for r in rows), rows


@pytest.mark.timeout(300)
def test_scale_thousand_users_hundred_per_round(root: Path) -> None:
    rows = _run(root, "scale")
    (row,) = rows
    assert int(row["users"]) >= 1000 and int(row["clients_per_round"]) == 100
    # Every round asked for ran, and the per-round time (from the rounds' log lines) is
    # consistent: rounds per minute is its inverse, and the rounds fit in the launch's wall time.
    rounds = scale.PROFILES["smoke"]["rounds"]
    assert int(row["rounds"]) == rounds >= 2
    per_round = float(row["seconds_per_round"])
    assert float(row["rounds_per_minute"]) * per_round == pytest.approx(60.0, rel=1e-4)
    assert 0 < per_round * (rounds - 1) < float(row["wall_s"])
    # The whole tree is measured: the launcher alone (this process) is one process, the
    # SuperLink, the simulation process and Ray's are more, and together well over 200 MiB.
    assert int(row["peak_processes"]) >= 4 and float(row["peak_rss_mb"]) > 200
