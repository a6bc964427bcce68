"""The ServerApp that Flower loads (``[tool.flwr.app.components] serverapp``).

Validates the run config, builds the task, the k initial hypotheses and the
clustered strategy, and records every round into ``<out-dir>/summary.json`` and
``<out-dir>/checkpoint.npz``. With ``resume-from`` it continues a run from its
checkpoint instead. The same app runs under the Deployment Engine and the
Simulation Engine.

Each round has a deadline, ``round-timeout``: Flower's ``ServerConfig(round_timeout)``,
which its legacy round (``flwr.server.server.fit_round``) passes to every client proxy's
``fit``; under both engines the proxy is ``flwr.server.compat.grid_client_proxy.GridClientProxy``,
which makes it the instruction's TTL. The SuperLink answers an instruction that is still
unanswered at its TTL with a *Message Unavailable* error
(``flwr.server.superlink.linkstate.utils.verify_message_ids``, checked whenever the ServerApp
pulls replies, every 3 s), and refuses a reply that comes later
(``InMemoryLinkState.store_message_res``). So a round ends at most ~3 s after its deadline
with the replies that arrived.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
from flwr.common import Context
from flwr.server import Server, ServerAppComponents, ServerConfig, SimpleClientManager
from flwr.serverapp import ServerApp

from mechanisms import make_rng
from server.checkpoint import CHECKPOINT_NAME, check_identity, read_checkpoint, run_identity
from server.results import ROUND_TAG, RunRecorder
from server.settings import RunSettings
from settings import parse_optima
from strategies import ClusteredStrategy, NormLimits
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


def norm_limits(settings: RunSettings) -> NormLimits:
    """Return what the run declares about its releases (the strategy's magnitude rules)."""
    v = settings.values
    z = None
    if settings.mechanism == "gaussian":
        # Imported here: dp-accounting costs about a second, and only Gaussian runs need it.
        from mechanisms import calibrate_gaussian_noise_multiplier

        releases = v["planned-releases"] or v["num-rounds"]
        z = calibrate_gaussian_noise_multiplier(v["epsilon"], v["delta"], releases)
    return NormLimits(mechanism=settings.mechanism, clip=v["clip"], clip_mode=v["clip-mode"],
                      noise_multiplier=z)


def build_components(run_config: dict[str, Any]) -> tuple[ServerAppComponents, RunRecorder]:
    """Build the strategy and its recorder from a run config (or continue a checkpoint).

    Raises
    ------
    SettingError
        For an invalid run config.
    CheckpointError
        If ``resume-from`` names no readable checkpoint, or one of another run.
    """
    settings = RunSettings.from_run_config(run_config)
    task = load_task(settings.task_config())
    rng = make_rng(settings.seed)
    hypotheses = task.initial_hypotheses(settings.num_hypotheses, rng)
    validation = task.validation_datasets()

    def evaluate_fn(current: list[list[np.ndarray]]) -> dict[str, float]:
        return task.evaluate(current, validation)

    out_dir = (settings.out_dir or settings.resume_from
               or Path("runs") / time.strftime("%Y%m%d-%H%M%S"))
    task_info: dict[str, Any] = {"name": settings.task, "num_parameters": task.num_parameters}
    if settings.task == "synthetic":
        task_info["optima"] = parse_optima(settings.values["optima"])
    shapes = [np.shape(layer) for layer in hypotheses[0]]
    recorder = RunRecorder(out_dir, run_config, settings.num_rounds, settings.mechanism, task_info,
                           identity=run_identity(settings.values, shapes))
    strategy = ClusteredStrategy(
        initial_hypotheses=hypotheses,
        clients_per_round=settings.clients_per_round,
        min_replies=settings.min_replies,
        round_timeout=settings.round_timeout,
        release="sign" if settings.mechanism == "sign" else "parameters",
        aggregation=settings.aggregation,
        server_learning_rate=settings.server_learning_rate,
        norm_limits=norm_limits(settings),
        evaluate_fn=evaluate_fn if validation else None,
        eval_every=settings.eval_every,
        patience=settings.patience,
        rng=rng,
        on_round=recorder.on_round,
        on_stop=recorder.on_stop,
        keep_released=task.num_parameters <= 10,
    )
    recorder.attach(strategy)
    logger.info(
        "%s task=%s k=%d rounds=%d clients/round=%d min-replies=%d round-timeout=%gs "
        "mechanism=%s aggregation=%s out=%s",
        ROUND_TAG, settings.task, settings.num_hypotheses, settings.num_rounds,
        settings.clients_per_round, settings.min_replies, settings.round_timeout,
        settings.mechanism, settings.aggregation, out_dir,
    )
    remaining = settings.num_rounds
    if settings.resume_from is not None:
        state, arrays = read_checkpoint(settings.resume_from / CHECKPOINT_NAME)
        check_identity(state["identity"], recorder.identity, str(settings.resume_from))
        strategy.restore(state["strategy"], arrays)
        recorder.restore(state)
        # Flower's loop counts from 1 again; the strategy adds the restored round.
        remaining = 0 if strategy.stopped_early else max(
            0, settings.num_rounds - strategy.last_round)
        recorder.write()
        logger.info("%s resuming %s after round %d: %d rounds to go", ROUND_TAG,
                    settings.resume_from, strategy.last_round, remaining)
    config = ServerConfig(num_rounds=remaining, round_timeout=settings.round_timeout)
    # Flower's Server sends each client's instruction from a thread pool whose default size is
    # min(32, CPUs + 4): 6 on a 2-core machine, so 20 sampled clients went out in 4 waves, each
    # waiting out the 3 s polls of the SuperNode and of the grid. One thread per sampled client
    # sends them all at once (the threads only wait on the network).
    server = Server(client_manager=SimpleClientManager(), strategy=strategy)
    server.set_max_workers(settings.clients_per_round)
    components = ServerAppComponents(server=server, config=config)
    return components, recorder


def server_fn(context: Context) -> ServerAppComponents:
    """Flower's entry point: components for this run."""
    _attach_flower_logging()
    components, _ = build_components(dict(context.run_config))
    return components


app = ServerApp(server_fn=server_fn)
