"""The personalized-budgets section says what its rows say: the readings' noise, B untested."""

from __future__ import annotations

import pytest

from experiments.reproductions.personalized_budgets_report import ours, readings, uniform_claims

PANEL = "digits-iid-gaussian"


def _rows(composed_sigma: tuple[float, float]) -> list[dict[str, str]]:
    """Two seeds of A and B in both readings; the per-round clients' σ are (0.9, 0.18)."""
    settings = {
        "per-round": ("10,10,100", ("52.5521", "749.46"), ("0.9", "0.18")),
        "composed": ("50,50,500", ("50", "500"), tuple(str(s) for s in composed_sigma)),
    }
    rows = []
    for (accounting, (budgets, spend, sigma)), aggregation, seed in (
            (s, a, seed) for s in settings.items() for a in ("mean", "weighted")
            for seed in (0, 1)):
        rows.append({"panel": PANEL, "accounting": accounting, "setting": "personalized",
                     "budgets": budgets, "aggregation": aggregation, "seed": str(seed),
                     "accuracy": "0.8", "rounds": "10", "min_epsilon": spend[0],
                     "max_epsilon": spend[1], "max_sigma": sigma[0], "min_sigma": sigma[1]})
    return rows


def test_readings_average_the_runs_spends_and_noise() -> None:
    by = readings(_rows((0.93, 0.225)), PANEL)

    assert by["per-round", "10,10,100"].spend == (52.5521, 749.46)
    assert by["composed", "50,50,500"].sigma == (0.93, 0.225)
    assert by["composed", "50,50,500"].rounds == 10


def test_more_noise_under_the_composed_totals_is_said() -> None:
    # 0.93 / 0.9 = 1.03 (within 5 %), 0.225 / 0.18 = 1.25.
    text = "\n".join(ours(_rows((0.93, 0.225))))

    assert "ε_i = (10, 10, 100), 002's (1, 1, 10) ×10, per release" in text
    assert "to 52.6 for the smallest budget and 749 for the largest" in text
    assert "1.03× that noise (the same within 5 %)" in text
    assert "1.25× that noise (25 % more)" in text
    assert "not the `per-round` rows under another name" in text
    assert "the same noise on every release" not in text


def test_equal_noise_under_both_readings_is_said() -> None:
    text = "\n".join(ours(_rows((0.9, 0.18))))

    assert "Both readings thus put the same noise on every release" in text


@pytest.mark.parametrize(("aggregations", "untested"), [
    (("mean", "weighted"), "runs A and B only, so C on it is untested here"),
    (("mean",), "runs A only, so B and C on it are untested here"),
])
def test_an_aggregation_not_run_is_named_untested(aggregations: tuple[str, ...],
                                                  untested: str) -> None:
    rows = [r for r in _rows((0.9, 0.18)) if r["aggregation"] in aggregations]

    text = "\n".join(ours(rows))

    assert f"{PANEL} {untested}" in text
    assert "The budgets are not 002's." in text
    assert "At the budgets above 002's the formal guarantee is void (no client of those rows " \
           "spends less than ε = 50 over the run" in text


def test_the_void_guarantee_is_said_of_the_scaled_budgets_only() -> None:
    # 002's own (1, 1, 10) spend ε = 4 over the run: the scaled rows' guarantee is still void,
    # and 002's own rows do not hide it.
    own = [{**r, "budgets": "1,1,10", "accounting": "per-round", "min_epsilon": "4.04",
            "max_epsilon": "52.6"} for r in _rows((0.9, 0.18)) if r["accounting"] == "per-round"]
    text = "\n".join(ours(_rows((0.9, 0.18)) + own))

    assert "Among the rows are 002's own budgets" in text
    assert "spends less than ε = 50 over the run" in text


@pytest.mark.parametrize(("high", "verdict"), [("0.7", "supported"), ("0.2", "contradicted")])
def test_the_uniform_budgets_claim_pairs_the_largest_with_the_smallest(high: str,
                                                                      verdict: str) -> None:
    rows = [{"panel": PANEL, "accounting": "per-round", "setting": "uniform", "budgets": b,
             "aggregation": "mean", "seed": str(seed), "accuracy": acc}
            for seed, jitter in ((0, "1"), (1, "2"), (2, "3"))
            for b, acc in (("1", f"0.3{jitter}"), ("5", "0.5"), ("10", f"{high}{jitter}"))]

    (line,) = uniform_claims(rows)

    assert "(ε = 10 − ε = 1)" in line
    assert verdict in line
