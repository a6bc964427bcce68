"""A run's delivered models: the task's metric per hypothesis, files in its format, loading them.

The real-process run over a tabular (torch) task is in ``tests/test_integration_tabular.py``;
here the pieces, and a run of the synthetic task (NumPy format) on the direct engine.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from deploy.cli import main as cli_main
from server.results import metric_part, round_line
from tasks import load_task
from tasks.base import BestFit, per_hypothesis
from tasks.delivered import load_delivered, validation_of, write_delivered


def test_each_hypothesis_reports_its_users_and_their_mean_metrics() -> None:
    fits = [BestFit(0, {"loss": 1.0, "accuracy": 0.5}), BestFit(0, {"loss": 3.0, "accuracy": 1.0}),
            BestFit(2, {"loss": 2.0, "accuracy": 0.25})]

    out = per_hypothesis(fits, 3, ("loss", "accuracy"))

    assert out == {"hypothesis_0_users": 2.0, "hypothesis_0_loss": 2.0,
                   "hypothesis_0_accuracy": 0.75, "hypothesis_1_users": 0.0,
                   "hypothesis_2_users": 1.0, "hypothesis_2_loss": 2.0,
                   "hypothesis_2_accuracy": 0.25}
    assert validation_of(out, 3) == [{"users": 2.0, "loss": 2.0, "accuracy": 0.75},
                                     {"users": 0.0},
                                     {"users": 1.0, "loss": 2.0, "accuracy": 0.25}]


def test_a_validated_round_line_shows_the_metric_overall_and_per_hypothesis() -> None:
    metrics = {"accuracy": 0.9371, **per_hypothesis(
        [BestFit(0, {"accuracy": 0.95}), BestFit(1, {"accuracy": 0.9})], 3, ("accuracy",))}
    record = SimpleNamespace(round=4, val_loss=0.2, val_metrics=metrics, cluster_sizes=[3, 2, 0],
                             replies=5, declined=0, dropped=[], failures=0)

    line = round_line(record, 10, {}, metric="accuracy")

    assert "round 4/10 val_loss 0.2000 val_accuracy 0.937 (h0 0.950 on 1 users, h1 0.900 on 1 " \
           "users, h2 no users) clusters" in line
    assert metric_part(metrics, "loss", 3) == ""  # a regression's metric is its loss, shown
    assert metric_part({}, "accuracy", 3) == ""  # a round not validated


@pytest.fixture(scope="module")
def tabular(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("tabular")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 2))
    y = np.where(x[:, 0] > 0, "yes", "no")
    lines = ["a,b,label", *(f"{u:.4f},{v:.4f},{lab}" for (u, v), lab in zip(x, y, strict=True))]
    (folder / "data.csv").write_text("\n".join(lines) + "\n")
    config = {"task": "tabular", "label-column": "label", "feature-columns": "a,b",
              "classes": "no,yes", "standardize": "none", "device": "cpu"}
    return folder, config


@pytest.mark.parametrize("name", ["synthetic", "tabular"])
def test_a_model_written_in_the_tasks_format_reads_back_the_same(
        name: str, tabular: tuple[Path, dict], tmp_path: Path) -> None:
    config = {"task": "synthetic"} if name == "synthetic" else tabular[1]
    task = load_task(config)
    params = task.init_parameters(np.random.default_rng(1))

    path = task.save_model(params, tmp_path / f"m{task.model_suffix}")
    back = task.load_model(path)

    assert [a.tolist() for a in back] == [a.tolist() for a in params]
    if name == "tabular":
        # A torch task's file is a state_dict: torch loads it into the task's module.
        module = task.model()
        module.load_state_dict(torch.load(path, weights_only=True))
        assert module[0].weight.detach().numpy().tolist() == params[0].tolist()


def test_a_model_of_another_shape_is_refused(tabular: tuple[Path, dict], tmp_path: Path) -> None:
    _, config = tabular
    small = load_task(config)
    wide = load_task({**config, "tabular-model": "mlp"})
    path = wide.save_model(wide.init_parameters(np.random.default_rng(0)), tmp_path / "m.pt")

    with pytest.raises(ValueError, match="not the entries of this task's model"):
        small.load_model(path)


def test_delivered_models_score_assign_and_predict(tabular: tuple[Path, dict],
                                                   tmp_path: Path) -> None:
    # Prepare: two hypotheses, the second the first's sign flipped (it predicts the opposite).
    folder, config = tabular
    task = load_task(config)
    good = [np.array([[-4.0, 0.0], [4.0, 0.0]], dtype=np.float32),
            np.zeros(2, dtype=np.float32)]
    bad = [-good[0], good[1]]
    write_delivered(tmp_path, task, {k: v for k, v in config.items() if k != "task"},
                    [bad, good], best_round=3, validation=[{"users": 1.0}, {"users": 2.0}])

    # Execute
    delivered = load_delivered(tmp_path)
    data = delivered.task.file_dataset(folder / "data.csv")
    fit = delivered.fit(data)
    labels = delivered.predict_labels(data.x, fit.hypothesis)

    # Assert: the good hypothesis fits best and predicts every label of the file.
    assert fit.hypothesis == 1 and delivered.assign(data) == 1
    assert fit.metrics[1]["accuracy"] == 1.0 and fit.metrics[0]["accuracy"] == 0.0
    assert labels == ["no" if v == 0 else "yes" for v in data.y]
    manifest = json.loads((tmp_path / "models" / "models.json").read_text())
    assert manifest["format"] == "torch" and manifest["metric"] == "accuracy"
    assert "data-path" not in manifest["task_config"]


def test_a_run_writes_models_that_load_back_as_the_summary_delivered(tmp_path: Path,
                                                                     capsys) -> None:
    from deploy.launcher import describe, launch

    result = launch(engine="direct", supernodes=4, out_dir=tmp_path / "run", echo=print,
                    run_config={"task": "synthetic", "num-rounds": 2, "num-hypotheses": 2,
                                "clients-per-round": 4, "seed": 3})
    delivered = load_delivered(tmp_path / "run")
    validation = delivered.task.validation_datasets()
    np.savez(tmp_path / "user.npz", x=validation[0].x, y=validation[0].y)
    code = cli_main(["predict", str(tmp_path / "run"), "--data", str(tmp_path / "user.npz")])
    out = capsys.readouterr().out

    assert result.status == "complete"
    models = result.summary["models"]
    assert models["metric"] == "loss" and models["best_round"] == result.summary["best_round"]
    assert sorted(p.name for p in (tmp_path / "run" / "models").iterdir()) == [
        "hypothesis-0.npz", "hypothesis-1.npz", "models.json"]
    for flat, params in zip(result.summary["hypotheses"], delivered.hypotheses, strict=True):
        assert np.concatenate([a.ravel() for a in params]).tolist() == pytest.approx(flat)
    users = sum(m["validation"]["users"] for m in models["models"])
    assert users == len(validation)
    closing = describe(result)
    assert "gpfl: delivered models (round" in closing and "gpfl predict" in closing
    assert code == 0 and "<- fits best (lowest loss)" in out
