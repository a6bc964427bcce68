"""Per-round metrics to TensorBoard and MLflow (``log-to``), read back with their own libraries."""

from __future__ import annotations

from pathlib import Path

import pytest

from deploy.cli import log_to_setting
from settings.checks import parse_log_to


@pytest.mark.parametrize(("text", "message"), [
    ("wandb:x", "each item must be tensorboard:DIR or mlflow:URI"),
    ("tensorboard", "each item must be"),
    ("tensorboard:a,tensorboard:b", "must not name a kind twice"),
])
def test_a_bad_log_to_is_refused(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_log_to(text)


def test_the_launchers_log_to_makes_the_tensorboard_folder_absolute(tmp_path: Path,
                                                                     monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)

    text = log_to_setting(["tensorboard:tb", "mlflow:sqlite:////srv/mlflow.db"])

    assert text == f"tensorboard:{tmp_path / 'tb'},mlflow:sqlite:////srv/mlflow.db"
    with pytest.raises(SystemExit, match="--log-to: each item must be"):
        log_to_setting(["neptune:x"])


def test_each_rounds_metrics_reach_tensorboard_and_mlflow(tmp_path: Path) -> None:
    # Prepare: a classifier (the fairness task, k = 2) on the direct engine, logging to both.
    from mlflow import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from deploy.launcher import launch

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    result = launch(engine="direct", supernodes=4, out_dir=tmp_path / "run", echo=print,
                    run_config={"task": "fairness", "num-rounds": 3, "num-hypotheses": 2,
                                "clients-per-round": 4, "seed": 2,
                                "log-to": f"tensorboard:{tmp_path / 'tb'},mlflow:{uri}"})
    history = result.summary["history"]

    # Execute: read the scalars back as TensorBoard and MLflow users do.
    events = EventAccumulator(str(tmp_path / "tb" / "run"))
    events.Reload()
    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("gpfl").experiment_id])
    mlflow_accuracy = client.get_metric_history(run.info.run_id, "val/accuracy")

    # Assert: every validated round's accuracy, as summary.json has it, in both; each
    # hypothesis's users and the spend too; the MLflow run finished with the federation.
    expected = [(e["round"], e["val_metrics"]["accuracy"]) for e in history]
    tensorboard_accuracy = [(s.step, s.value) for s in events.Scalars("val/accuracy")]
    assert [r for r, _ in tensorboard_accuracy] == [r for r, _ in expected] == [0, 1, 2, 3]
    assert [v for _, v in tensorboard_accuracy] == pytest.approx([v for _, v in expected])
    logged = sorted((m.step, m.value) for m in mlflow_accuracy)
    assert [r for r, _ in logged] == [0, 1, 2, 3]
    assert [v for _, v in logged] == pytest.approx([v for _, v in expected])
    assert {"val/hypothesis_0/users", "val/hypothesis_1/accuracy", "spend/max"} <= set(
        events.Tags()["scalars"])
    assert run.info.status == "FINISHED" and run.data.params["task"] == "fairness"
