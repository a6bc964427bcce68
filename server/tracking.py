"""Per-round metrics to TensorBoard or MLflow, through their own libraries (``log-to``).

The run config's ``log-to`` names where the ServerApp also writes each round's numbers:
``tensorboard:DIR`` (event files under ``DIR``, read by ``tensorboard --logdir DIR``, written
with ``torch.utils.tensorboard.SummaryWriter``) and/or ``mlflow:URI`` (a run of the MLflow
tracking server or database at ``URI``, e.g. ``mlflow:sqlite:////srv/mlflow.db``),
comma-separated.
Each validated round gives ``val/loss``, the task's metric (``val/accuracy``), each hypothesis's
users and metric (``val/hypothesis_<j>/...``); each round ``spend/median``, ``spend/max``,
``round/replies`` and ``round/declined``. The numbers are those of the round line and
``summary.json``: what the server has anyway, nothing a device did not release.

The libraries are optional (``pip install "gpfl[tracking]"``): a ``log-to`` that names one that
is not installed fails the launch's check and the ServerApp's start, naming the extra
(`settings.extras`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from settings.checks import parse_log_to

__all__ = ["Sink", "close_all", "metrics_of", "open_sinks"]

class Sink(Protocol):
    """Where one round's metrics go."""

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        """Record ``metrics`` at round ``step``."""

    def close(self) -> None:
        """Flush and close."""


class _TensorBoard:
    def __init__(self, folder: str, run_name: str) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(Path(folder) / run_name))

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        for tag, value in metrics.items():
            self.writer.add_scalar(tag, value, global_step=step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class _MLflow:
    def __init__(self, uri: str, run_name: str, params: Mapping[str, Any]) -> None:
        import mlflow

        self.client = mlflow.MlflowClient(tracking_uri=uri)
        experiment = self.client.get_experiment_by_name("gpfl")
        experiment_id = (experiment.experiment_id if experiment is not None
                         else self.client.create_experiment("gpfl"))
        self.run_id = self.client.create_run(experiment_id, run_name=run_name).info.run_id
        for key, value in params.items():
            self.client.log_param(self.run_id, key, value)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        for key, value in metrics.items():
            # MLflow's metric names allow "/" as TensorBoard's tags do.
            self.client.log_metric(self.run_id, key, float(value), step=step)

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


def open_sinks(text: str, run_name: str, params: Mapping[str, Any]) -> list[Sink]:
    """Open the sinks ``log-to`` names, for the run ``run_name`` with its ``params``.

    The libraries must be installed: the ServerApp checks that first, with the rest of what the
    run config needs (`settings.extras.check_run_extras`).
    """
    sinks: list[Sink] = []
    for kind, target in parse_log_to(text):
        sinks.append(_TensorBoard(target, run_name) if kind == "tensorboard"
                     else _MLflow(target, run_name, params))
    return sinks


def metrics_of(entry: Mapping[str, Any], privacy: Mapping[str, Any], k: int,
               metric: str) -> dict[str, float]:
    """Return one round's numbers as tags: validation, per hypothesis, spend, replies."""
    out: dict[str, float] = {"round/replies": float(entry.get("replies", 0)),
                             "round/declined": float(entry.get("declined", 0))}
    if entry.get("val_loss") is not None:
        out["val/loss"] = float(entry["val_loss"])
    values = entry.get("val_metrics") or {}
    if metric != "loss" and metric in values:
        out[f"val/{metric}"] = float(values[metric])
    for j in range(k):
        for key in ("users", metric, *(("loss",) if metric != "loss" else ())):
            value = values.get(f"hypothesis_{j}_{key}")
            if value is not None:
                out[f"val/hypothesis_{j}/{key}"] = float(value)
    for key in ("median", "max"):
        if privacy.get(key) is not None:
            out[f"spend/{key}"] = float(privacy[key])
    return out


def close_all(sinks: Sequence[Sink]) -> None:
    """Close every sink (one that fails to close does not keep the others open)."""
    for sink in sinks:
        try:
            sink.close()
        except Exception:  # a tracking backend's error must not fail the finished run
            pass
