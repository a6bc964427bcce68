"""The record-clipping experiment (OSO vs grid searches at one budget) runs and reports.

The smoke profile: both tasks, central and federated, ε = 5, 2×2 grids, 8 DP-SGD steps, one
seed (about 15 s on 2 cores). The accuracies of so short runs are not compared; what is checked
is the budget rule every comparison rests on: a grid's g² runs share one (ε, δ), so each of its
runs gets a larger ν than the single OSO run, and composing the grid's runs gives back ε.
"""

from __future__ import annotations

import csv
from typing import Any

import numpy as np
import pytest

from experiments.cli import run_experiment
from experiments.reproductions.record_clipping import (
    EXPERIMENT,
    PROFILES,
    calibrated_noise,
    one_run,
    strategies,
)


@pytest.fixture(scope="module")
def rows(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, str]]:
    root = tmp_path_factory.mktemp("record-clipping")
    run_experiment("record-clipping", out=root / "out", cache=root / "cache", profile="smoke")
    with open(root / "out" / "results.csv", newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def test_every_strategy_runs_on_both_tasks_and_settings(rows: list[dict[str, str]]) -> None:
    p = PROFILES["smoke"]
    assert strategies("smoke") == ("fixed-grid-2", "quantile-grid-2", "oso", "oso-fast")
    assert strategies("full") == ("fixed-grid-5", "quantile-grid-5", "fixed-grid-7",
                                  "quantile-grid-7", "oso", "oso-fast")
    assert len(rows) == 2 * 2 * len(strategies("smoke"))
    assert {(r["task"], r["setting"]) for r in rows} == {
        (t, s) for t in p["tasks"] for s in p["settings"]}
    for r in rows:
        assert 0.0 <= float(r["accuracy"]) <= 1.0 and float(r["clip"]) > 0
        grid_runs = 4 if "-grid-" in r["strategy"] else 1
        assert int(r["runs"]) == grid_runs


def test_a_grid_pays_for_its_runs(rows: list[dict[str, str]]) -> None:
    nus = {r["strategy"]: float(r["noise_multiplier"]) for r in rows}
    assert nus["fixed-grid-2"] == nus["quantile-grid-2"] > nus["oso"] == nus["oso-fast"]
    import dp_accounting
    from dp_accounting.rdp import RdpAccountant

    p = PROFILES["smoke"]
    runs = p["grids"][0] ** 2
    nu = calibrated_noise(5.0, p["rate"], p["steps"] * runs)
    step = dp_accounting.PoissonSampledDpEvent(p["rate"], dp_accounting.GaussianDpEvent(nu))
    one_run = dp_accounting.SelfComposedDpEvent(step, p["steps"])
    composed = RdpAccountant().compose(dp_accounting.SelfComposedDpEvent(one_run, runs))
    assert composed.get_epsilon(1e-5) == pytest.approx(5.0, rel=1e-3)


def test_the_report_section_has_the_table(rows: list[dict[str, str]]) -> None:
    text = "\n".join(EXPERIMENT.report(rows))
    assert "| digits | central | 5 |" in text and "| breast-cancer | federated | 5 |" in text
    # The sizes of the profile the rows come from, and why they answer the question.
    assert "T = 8 DP-SGD steps at q = 0.1" in text and "They still answer the question" in text


class _Trace:
    def __init__(self, clip: float, lr: float) -> None:
        self.clips, self.learning_rates = [clip, 2.0 * clip], [lr, 3.0 * lr]


class _Task:
    def init_parameters(self, rng: np.random.Generator) -> list[np.ndarray]:
        return [np.zeros(3)]


def test_every_federated_release_starts_from_the_configured_clip_and_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Prepare: the trainer replaced by one that records where each release starts and ends
    # it elsewhere (C doubled, the step tripled).
    import tasks.dpsgd

    starts: list[tuple[float, float]] = []

    def train(task: object, params: list[np.ndarray], data: object, training: Any,
              rng: np.random.Generator) -> tuple[list[np.ndarray], _Trace]:
        starts.append((training.clip, training.learning_rate))
        return [p + 1.0 for p in params], _Trace(training.clip, training.learning_rate)

    monkeypatch.setattr(tasks.dpsgd, "train_record_level", train)
    data = {"silos": [list(range(40))] * 4}
    p = {"rounds": 3, "steps": 6, "rate": 0.1}

    # Execute
    params, clip, lr = one_run(_Task(), data, "federated", "oso", 1.0, 0.5, 0.2, 0.5, 0, p)

    # Assert: 4 silos × 3 rounds, each release from C_0 = 0.5 and ρ_0 = 0.2, as a gpfl device's
    # release starts from the request; what is returned is where the last round's releases ended.
    assert starts == [(0.5, 0.2)] * 12
    assert (clip, lr) == (1.0, pytest.approx(0.6))
    np.testing.assert_array_equal(params[0], np.full(3, 3.0))
