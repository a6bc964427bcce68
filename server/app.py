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
pulls replies, every 0.1 s: :mod:`server.polling`), and refuses a reply that comes later
(``InMemoryLinkState.store_message_res``). So a round ends about a second after its deadline
with the replies that arrived.
"""

from __future__ import annotations

import logging
import secrets
import time
from pathlib import Path
from typing import Any

import numpy as np
from flwr.common import Context
from flwr.server import ServerAppComponents, ServerConfig, SimpleClientManager
from flwr.serverapp import ServerApp

from mechanisms import make_rng
from server.checkpoint import CHECKPOINT_NAME, check_identity, read_checkpoint, run_identity
from server.legacy_server import GpflServer
from server.results import ROUND_TAG, RunRecorder
from server.settings import RunSettings
from server.tracking import open_sinks
from settings.extras import check_run_extras
from strategies import ClusteredStrategy, NormLimits
from strategies.clustering import load_kmeans
from strategies.device_keys import DeviceKeys
from strategies.divergence import Divergence
from tasks import load_task
from tasks.synthetic import SyntheticTask

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
    settings.extras.MissingExtraError
        If the task, mechanism or ``log-to`` needs an optional part not installed here.
    """
    settings = RunSettings.from_run_config(run_config)
    # The task, mechanism and log-to this ServerApp serves need their optional parts here.
    check_run_extras(settings.values)
    task = load_task(settings.task_config())
    rng = make_rng(settings.seed)
    hypotheses = task.initial_hypotheses(settings.num_hypotheses, rng)
    validation = task.validation_datasets()

    def evaluate_fn(current: list[list[np.ndarray]]) -> dict[str, float]:
        return task.evaluate(current, validation)

    out_dir = (settings.out_dir or settings.resume_from
               or Path("runs") / time.strftime("%Y%m%d-%H%M%S"))
    task_info: dict[str, Any] = {"name": settings.task, "num_parameters": task.num_parameters}
    if isinstance(task, SyntheticTask) and task.num_parameters <= 10_000:
        # The task's own optima (repeated by optima-repeat); a model of millions of parameters
        # (a benchmark's) keeps them out of summary.json, which every round rewrites.
        task_info["optima"] = task.optima.tolist()
    shapes = [np.shape(layer) for layer in hypotheses[0]]
    identity = run_identity(settings.values, shapes)
    checkpoint = None
    if settings.resume_from is not None:
        checkpoint = read_checkpoint(settings.resume_from / CHECKPOINT_NAME)
    # Devices tag their releases with this id and report only this federation's spend; it is
    # random (another federation's devices never hear it) and survives a resume.
    saved_identity = checkpoint[0]["identity"] if checkpoint is not None else {}
    if checkpoint is None or "federation-id" in saved_identity:
        identity["federation-id"] = saved_identity.get("federation-id") or secrets.token_hex(16)
    # What rebuilds the task where its models are loaded: its own settings, not this side's
    # data file or device.
    task_config = {key: settings.values[key] for key in type(task).run_config_keys
                   if key in settings.values and key not in ("data-path", "device")}
    # log-to: TensorBoard or MLflow beside summary.json; a missing library fails here, at start.
    sinks = open_sinks(settings.values["log-to"], Path(out_dir).name,
                       {"task": settings.task, "num-hypotheses": settings.num_hypotheses,
                        "mechanism": settings.mechanism, "num-rounds": settings.num_rounds})
    recorder = RunRecorder(out_dir, run_config, settings.num_rounds, settings.mechanism, task_info,
                           identity=identity, task=task, task_config=task_config, sinks=sinks)
    limits = norm_limits(settings)
    strategy_args: dict[str, Any] = dict(
        initial_hypotheses=hypotheses,
        clients_per_round=settings.clients_per_round,
        min_replies=settings.min_replies,
        round_timeout=settings.round_timeout,
        release="sign" if settings.mechanism == "sign" else "parameters",
        aggregation=settings.aggregation,
        cluster_aggregator=settings.values["cluster-aggregator"],
        persistence_threshold=settings.values["persistence-threshold"],
        server_learning_rate=settings.server_learning_rate,
        server_update=settings.server_update,
        norm_limits=limits,
        evaluate_fn=evaluate_fn if validation else None,
        eval_every=settings.eval_every,
        patience=settings.patience,
        divergence=Divergence(settings.values["divergence-factor"],
                              settings.values["divergence-validations"]),
        rng=rng,
        device_keys=DeviceKeys(settings.seed, settings.values["sample-by"],
                               timeout=settings.round_timeout,
                               identity=settings.values["node-identity"]),
        on_round=recorder.on_round,
        on_stop=recorder.on_stop,
        keep_released=task.num_parameters <= 10,
        fit_config={"federation-id": identity["federation-id"]}
        if "federation-id" in identity else None,
    )
    secure = settings.values["aggregation-privacy"] == "secure-clusters"
    strategy: ClusteredStrategy
    if secure:
        # The server sees only per-cluster sums, through Flower's SecAgg+ (server.secure_round).
        from server.secure_round import TERMS
        from strategies.secure import SecureClustersStrategy

        strategy = SecureClustersStrategy(
            terms=TERMS, clip=settings.values["clip"],
            share_noise_multiplier=limits.noise_multiplier or 0.0, **strategy_args)
    else:
        strategy = ClusteredStrategy(**strategy_args)
    recorder.attach(strategy)
    logger.info(
        "%s task=%s k=%d rounds=%d clients/round=%d min-replies=%d round-timeout=%gs "
        "mechanism=%s privacy=%s aggregation=%s clusters=%s persistence=%g update=%s out=%s",
        ROUND_TAG, settings.task, settings.num_hypotheses, settings.num_rounds,
        settings.clients_per_round, settings.min_replies, settings.round_timeout,
        settings.mechanism,
        (f"secure-clusters(min-cohort={settings.values['min-cohort']})" if secure
         else "per-device"),
        settings.aggregation, settings.values["cluster-aggregator"],
        settings.values["persistence-threshold"], settings.server_update.rule, out_dir,
    )
    remaining = settings.num_rounds
    if settings.resume_from is not None and checkpoint is not None:
        state, arrays = checkpoint
        check_identity(state["identity"], recorder.identity, str(settings.resume_from))
        strategy.restore(state["strategy"], arrays)
        recorder.restore(state, arrays)
        # Flower's loop counts from 1 again; the strategy adds the restored round.
        remaining = 0 if strategy.stopped_early else max(
            0, settings.num_rounds - strategy.last_round)
        recorder.write()
        logger.info("%s resuming %s after round %d: %d rounds to go", ROUND_TAG,
                    settings.resume_from, strategy.last_round, remaining)
    config = ServerConfig(num_rounds=remaining, round_timeout=settings.round_timeout)
    # Flower's Server sends each client's instruction from a thread pool whose default size is
    # min(32, CPUs + 4): 6 on a 2-core machine, so 20 sampled clients went out in 4 waves, each
    # waiting out the polls of the SuperNode and of the grid. One thread per sampled client
    # sends them all at once (the threads only wait on the network); on the Simulation Engine
    # GpflServer caps the pool per CPU instead.
    server: GpflServer
    if secure:
        from server.secure_round import SecureServer

        server = SecureServer(min_cohort=settings.values["min-cohort"],
                              round_timeout=settings.round_timeout, out_dir=Path(out_dir),
                              client_manager=SimpleClientManager(), strategy=strategy)
    else:
        server = GpflServer(client_manager=SimpleClientManager(), strategy=strategy)
    server.set_max_workers(settings.clients_per_round)
    server.on_end = recorder.on_end
    if settings.num_hypotheses > 1 and remaining > 0:
        # k-means runs from the first aggregation on; its import (1-2 s) belongs to the start,
        # not to round 1 (Flower times the rounds from after server_fn returns).
        load_kmeans()
    components = ServerAppComponents(server=server, config=config)
    return components, recorder


def server_fn(context: Context) -> ServerAppComponents:
    """Flower's entry point: components for this run."""
    _attach_flower_logging()
    components, _ = build_components(dict(context.run_config))
    return components


app = ServerApp(server_fn=server_fn)
