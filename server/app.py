"""The ServerApp that Flower loads (``[tool.flwr.app.components] serverapp``).

Validates the run config, builds the task, the k initial hypotheses and the
clustered strategy, and records every round into ``<out-dir>/summary.json``.
The same app runs under the Deployment Engine and the Simulation Engine.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
from flwr.common import Context
from flwr.server import ServerAppComponents, ServerConfig
from flwr.serverapp import ServerApp

from mechanisms import make_rng
from server.results import ROUND_TAG, RunRecorder
from server.settings import RunSettings
from settings import parse_optima
from strategies import ClusteredStrategy
from tasks import load_task

logger = logging.getLogger(__name__)


def _attach_flower_logging() -> None:
    # Flower streams its own logger's records to `flwr run --stream`; route
    # this project's loggers there too so that the per-round lines are seen.
    flwr_logger = logging.getLogger("flwr")
    for name in ("server", "strategies", "mechanisms", "tasks"):
        lg = logging.getLogger(name)
        lg.setLevel(logging.INFO)
        lg.propagate = False
        lg.handlers = list(flwr_logger.handlers)


def build_components(run_config: dict[str, Any]) -> tuple[ServerAppComponents, RunRecorder]:
    """Build the strategy and its recorder from a run config."""
    settings = RunSettings.from_run_config(run_config)
    task = load_task(settings.task_config())
    rng = make_rng(settings.seed)
    hypotheses = task.initial_hypotheses(settings.num_hypotheses, rng)
    validation = task.validation_datasets()

    def evaluate_fn(current: list[list[np.ndarray]]) -> dict[str, float]:
        return task.evaluate(current, validation)

    out_dir = settings.out_dir or Path("runs") / time.strftime("%Y%m%d-%H%M%S")
    task_info: dict[str, Any] = {"name": settings.task, "num_parameters": task.num_parameters}
    if settings.task == "synthetic":
        task_info["optima"] = parse_optima(settings.values["optima"])
    recorder = RunRecorder(out_dir, run_config, settings.num_rounds, settings.mechanism, task_info)
    strategy = ClusteredStrategy(
        initial_hypotheses=hypotheses,
        clients_per_round=settings.clients_per_round,
        release="sign" if settings.mechanism == "sign" else "parameters",
        aggregation=settings.aggregation,
        server_learning_rate=settings.server_learning_rate,
        evaluate_fn=evaluate_fn if validation else None,
        eval_every=settings.eval_every,
        patience=settings.patience,
        rng=rng,
        on_round=recorder.on_round,
        keep_released=task.num_parameters <= 10,
    )
    recorder.attach(strategy)
    logger.info(
        "%s task=%s k=%d rounds=%d clients/round=%d mechanism=%s aggregation=%s out=%s",
        ROUND_TAG, settings.task, settings.num_hypotheses, settings.num_rounds,
        settings.clients_per_round, settings.mechanism, settings.aggregation, out_dir,
    )
    components = ServerAppComponents(
        strategy=strategy, config=ServerConfig(num_rounds=settings.num_rounds)
    )
    return components, recorder


def server_fn(context: Context) -> ServerAppComponents:
    """Flower's entry point: components for this run."""
    _attach_flower_logging()
    components, _ = build_components(dict(context.run_config))
    return components


app = ServerApp(server_fn=server_fn)
