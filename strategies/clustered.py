"""Server side of Algorithm 1 (Galli et al.): k hypotheses, k-means, budget-aware cluster means.

One round, as Flower's legacy ``Server.fit`` drives it::

    configure_fit   sample up to U of the connected clients with the strategy's own rng (waiting
                    at most ``round_timeout`` for ``min_replies`` of them); send the k hypotheses
    aggregate_fit   screen every reply (strategies.intake: declines apart; bad replies dropped,
                    failed and missing devices named); with ``min_replies`` usable replies,
                    set aside devices whose releases lean one way round after round
                    (strategies.persistence), cluster and aggregate (strategies.robust), then
                    the server update (strategies.server_update); sign: a majority vote
    evaluate        server-side validation every ``eval_every`` rounds, early stop on
                    ``patience``, then one :class:`RoundRecord` for the round (inherited from
                    :class:`~strategies.recorded.RecordedStrategy`)

The math is pure functions on NumPy arrays; this class converts Flower's messages to a (m, n)
float32 matrix and back, and orchestrates. After an early stop or without a quorum,
``configure_fit`` returns no clients. The round's deadline is each instruction's TTL; a device
that misses it is a failure (:class:`~strategies.proxies.TracedProxy`).
Resuming: :meth:`ClusteredStrategy.state` captures what the strategy needs to continue (not past
re-seedings), :meth:`~ClusteredStrategy.restore` puts it back; Flower's round i is then round+i.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from flwr.common import FitIns, FitRes, Parameters, Scalar, ndarrays_to_parameters
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy

from settings import SETTINGS
from settings.rules import check_sign_single_model
from strategies.aggregation import check_aggregation, sign_step
from strategies.device_keys import DeviceKeys, seed_of
from strategies.divergence import Divergence
from strategies.geometry import CountSketch
from strategies.hypotheses import check_saved, split_layers, stack_hypotheses
from strategies.intake import ReplyScreen, pushed_away
from strategies.norms import NormLimits
from strategies.persistence import Persistence, set_aside_persistent, sketch_seed
from strategies.proxies import TracedProxy
from strategies.recorded import EvaluateFn, RecordedStrategy, RoundResult
from strategies.records import ClientRecord, RoundRecord
from strategies.robust import check_cluster_aggregator, cluster_and_aggregate, trimmed
from strategies.sampling import check_sampling, responsive, sample_devices
from strategies.server_update import ServerUpdate

__all__ = ["RELEASES", "ClientRecord", "ClusteredStrategy", "RoundRecord"]

_LOG = logging.getLogger(__name__)

RELEASES: tuple[str, ...] = ("parameters", "sign")
# Config keys the strategy sets itself; ``fit_config`` may not override them.
_RESERVED_CONFIG = ("num-hypotheses", "server-round")
#: Version of :meth:`ClusteredStrategy.state`'s layout, and its keys in the order written.
STATE_VERSION = 1
# The run settings' defaults are the declarations' (settings.declarations), never restated here.
_DEFAULTS = {s.name: s.default for s in SETTINGS.values() if s.owner != "device"}
_STATE_KEYS = ("version", "round", "shapes", "rounds_completed", "best_loss", "best_round",
               "stale_evaluations", "stopped_early", "rng", "clients", "screen", "history",
               "draw_seed")


class ClusteredStrategy(RecordedStrategy):
    """Clustered federated learning with locally private releases (Algorithm 1, server side).

    Parameters
    ----------
    initial_hypotheses : list of list of np.ndarray
        k hypotheses, each a list of L layers with the same shapes; cast to float32 (copied).
    clients_per_round : int
        U, the clients sampled each round (fewer if fewer are connected; the log says so).
    min_replies : int
        Usable replies a round needs to change the hypotheses (fewer: they are kept, and the
        record says why). A round starts only once this many clients are connected.
    round_timeout : float
        Seconds ``configure_fit`` waits for ``min_replies`` clients (fewer: the run stops, and
        ``incomplete_reason`` says why); in this process's first round it first waits up to 15 s
        for ``clients_per_round`` of them. The replies' deadline is Flower's round timeout.
    release : {"parameters", "sign"}
        Sanitized parameters (k-means + cluster means), or stochastic signs (only with k = 1).
    aggregation, cluster_aggregator : str
        How a cluster's releases are weighted (:data:`strategies.AGGREGATIONS`); what each
        cluster becomes (:data:`strategies.robust.CLUSTER_AGGREGATORS`).
    persistence_threshold : float
        c of :mod:`strategies.persistence` (0: off).
    server_learning_rate : float
        Step of the sign release's update θ ← θ + η·sign(weighted mean of the signs).
    norm_limits : NormLimits, optional
        The run's mechanism and clipping, which bound a release's magnitude
        (:mod:`strategies.norms`); default: Laplace (relative rule and absolute cap only).
    evaluate_fn : callable, optional
        ``evaluate_fn(hypotheses) -> {"loss": ..., ...}``: validation on held-out users.
    eval_every : int
        Validate after every ``eval_every``-th round (and always in round 0).
    patience : int
        Stop after this many consecutive validations without a new best loss (0 = never).
    divergence : Divergence, optional
        When bad validations end the run as diverged (default: the settings').
    fit_config : dict, optional
        Extra entries sent in every ``FitIns.config``.
    rng : np.random.Generator, optional
        Drives ``probability``; without ``device_keys`` it seeds the draw (read, not drawn).
    device_keys : DeviceKeys, optional
        Keys each round's draw of devices (:mod:`strategies.device_keys`); default: node ids.
    on_round, on_stop : callable, optional
        Called with each complete :class:`RoundRecord`; with ``incomplete_reason`` when the run
        stops for lack of devices.
    keep_released : bool
        Store each round's releases (and clusters) in the records: small models only.
    server_update : ServerUpdate, optional
        The step to the cluster means and the re-seeding (default: the settings').

    Attributes
    ----------
    hypotheses, best_hypotheses : list of list of np.ndarray
        The current k hypotheses, and those of the lowest validation loss so far (copies).
    incomplete_reason, diverged
        Why the run stopped before its last round (too few devices, or diverged), if it did.
    history, clients, stopped_early, rounds_completed, last_round, best_loss, best_round
        The run's records (inherited).

    Raises
    ------
    ValueError
        For a parameter out of range (named), bad hypotheses, or "sign" with k > 1.
    """

    def __init__(
        self,
        *,
        initial_hypotheses: Sequence[Sequence[np.ndarray]],
        clients_per_round: int,
        min_replies: int = _DEFAULTS["min-replies"],
        round_timeout: float = _DEFAULTS["round-timeout"],
        release: str = "parameters",
        aggregation: str = _DEFAULTS["aggregation"],
        cluster_aggregator: str = _DEFAULTS["cluster-aggregator"],
        persistence_threshold: float = _DEFAULTS["persistence-threshold"],
        server_learning_rate: float = _DEFAULTS["server-learning-rate"],
        norm_limits: NormLimits | None = None,
        evaluate_fn: EvaluateFn | None = None,
        eval_every: int = _DEFAULTS["eval-every"],
        patience: int = _DEFAULTS["patience"], divergence: Divergence | None = None,
        fit_config: Mapping[str, Scalar] | None = None,
        rng: np.random.Generator | None = None, device_keys: DeviceKeys | None = None,
        on_round: Callable[[RoundRecord], None] | None = None,
        on_stop: Callable[[str], None] | None = None,
        keep_released: bool = False, server_update: ServerUpdate | None = None,
    ) -> None:
        self._shapes, self._flat = stack_hypotheses(initial_hypotheses)
        k = self.num_hypotheses

        clients_per_round, min_replies, round_timeout = check_sampling(
            clients_per_round, min_replies, round_timeout)
        if release not in RELEASES:
            raise ValueError(f"release must be one of {', '.join(RELEASES)}; got "
                             f"release={release!r}")
        check_sign_single_model(release, k)  # release "sign" is the sign mechanism's
        # Bounds are the settings' declarations (a NumPy scalar is read as its Python value).
        eval_every, patience, server_learning_rate, persistence_threshold = (
            SETTINGS[key].parse(v.item() if isinstance(v, np.generic) else v)
            for key, v in (("eval-every", eval_every), ("patience", patience),
                           ("server-learning-rate", server_learning_rate),
                           ("persistence-threshold", persistence_threshold)))
        fit_config = dict(fit_config or {})
        clash = sorted(set(fit_config) & set(_RESERVED_CONFIG))
        if clash:
            raise ValueError(f"fit_config may not set {', '.join(clash)}: the strategy sets them")

        super().__init__(evaluate_fn=evaluate_fn, eval_every=eval_every, patience=patience,
                         on_round=on_round, divergence=divergence)
        self.clients_per_round, self.min_replies = clients_per_round, min_replies
        self.round_timeout = round_timeout
        self.release = release
        self.aggregation = check_aggregation(aggregation)
        self.cluster_aggregator = check_cluster_aggregator(cluster_aggregator)
        self.server_learning_rate = server_learning_rate
        self.keep_released = keep_released
        self.server_update = server_update or ServerUpdate()
        self._reseeded: dict[int, int] = {}  # hypothesis -> round of its last re-seeding
        self._inert = None if self.cluster_aggregator == "mean" else trimmed  # (m) -> c
        self._fit_config: dict[str, Scalar] = fit_config
        self._on_stop = on_stop
        self._rng = rng if rng is not None else np.random.default_rng()
        self.device_keys = device_keys or DeviceKeys(seed_of(self._rng))
        # The persistence test's sketch hashes from the rng's state, without drawing from it: a
        # run with a fixed seed is reproducible (experiments); a deployment's rng comes from the
        # OS's entropy, so no device can aim at the sketch's kernel (strategies.persistence).
        self._persistence = Persistence(persistence_threshold,
                                        sketch=CountSketch(seed=sketch_seed(self._rng)))
        limits = norm_limits or NormLimits(mechanism="sign" if release == "sign" else "laplace")
        self._screen = ReplyScreen(self._shapes, release=release, limits=limits, need_sigma=(
            self.aggregation != "mean"), by_key=self.device_keys.identity == "key")

        # _flat is never modified in place, so keeping a reference to the best one is free.
        self._best_flat = self._flat
        self._sampled: tuple[int, list[str], list[str]] = (-1, [], [])  # round, ids, keys
        self._forming = True  # the first configure_fit of this process: devices still joining

    def __repr__(self) -> str:
        return (f"ClusteredStrategy(num_hypotheses={self.num_hypotheses}, "
                f"clients_per_round={self.clients_per_round}, release={self.release!r}, "
                f"aggregation={self.aggregation!r})")

    # ----------------------------------------------------------------- state views

    @property
    def num_hypotheses(self) -> int:
        """K, the number of hypotheses."""
        return int(self._flat.shape[0])

    @property
    def hypotheses(self) -> list[list[np.ndarray]]:
        """The current k hypotheses, k lists of L float32 arrays (a fresh copy)."""
        return [[a.copy() for a in layers] for layers in split_layers(self._flat, self._shapes)]

    @property
    def best_hypotheses(self) -> list[list[np.ndarray]]:
        """The hypotheses that reached ``best_loss`` (a fresh copy)."""
        return [[a.copy() for a in h] for h in split_layers(self._best_flat, self._shapes)]

    @property
    def shapes(self) -> list[tuple[int, ...]]:
        """The layer shapes of one hypothesis."""
        return list(self._shapes)

    @property
    def norm_limits(self) -> NormLimits:
        """The magnitude rules the screening applies (``norm_limits``, or its default)."""
        return self._screen.limits

    @property
    def persistence_threshold(self) -> float:
        """The threshold c of :mod:`strategies.persistence` (0: off)."""
        return self._persistence.threshold

    def _parameters(self) -> Parameters:
        layers = split_layers(self._flat, self._shapes)
        return ndarrays_to_parameters([a for hypothesis in layers for a in hypothesis])

    def _keep_best(self) -> None:
        self._best_flat = self._flat

    def _after_record(self) -> None:  # ``plateau``: the next round starts from the best ones
        if self.release != "sign" and self.server_update.restores(
                self.history, self._reseeded, self.best_round):
            self._flat = self._best_flat.copy()

    # ----------------------------------------------------------------- Strategy API

    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        """Return the k hypotheses as one list (hypothesis j, layer l at index j·L + l)."""
        return self._parameters()

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        """Sample up to ``clients_per_round`` connected clients and send them the hypotheses.

        Without replacement, keyed on the seed, the round and the devices' keys, waiting at most
        ``round_timeout`` (:func:`strategies.sampling.sample_devices`). No clients after an early
        stop or without ``min_replies`` devices (``incomplete_reason`` says so).
        """
        t = self._round(server_round)
        if self.stopped_early or self.incomplete_reason is not None:
            return []
        available, chosen = sample_devices(
            client_manager, self._rng, server_round=t, clients_per_round=self.clients_per_round,
            min_replies=self.min_replies, round_timeout=self.round_timeout, forming=self._forming,
            records=self.clients, keys=self.device_keys, names=self._screen.names,
            excluded=self._screen.names.superseded() | {
                cid for cid, r in self.clients.items() if r.name in self._persistence.set_aside})
        self._forming = False
        if not chosen:
            self.incomplete_reason = (
                f"round {t}: too few devices: {len(available)} connected, "
                f"{len(responsive(available, self.clients))} answered their last round, "
                f"min-replies={self.min_replies}")
            _LOG.error("%s; the run stops here (resume it once devices are back)",
                       self.incomplete_reason)
            if self._on_stop is not None:
                self._on_stop(self.incomplete_reason)
            return []
        config: dict[str, Scalar] = {"num-hypotheses": self.num_hypotheses, "server-round": t,
                                     **self._fit_config}
        # The strategy's own hypotheses (they differ from ``parameters`` after a restore).
        fit_ins = FitIns(parameters=self._parameters(), config=config)
        for cid in chosen:
            self._client(cid).sampled += 1
        self._sampled = (t, chosen, [self.device_keys.current.get(c, f"node:{c}") for c in chosen])
        return [(TracedProxy(available[cid]), fit_ins) for cid in chosen]

    def aggregate_fit(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        """Screen the replies, cluster them and return the new hypotheses (None: too few).

        Metrics: ``replies``, ``declined``, ``dropped``, ``failures``, ``missing`` and
        ``cluster-size-j`` for each hypothesis j.
        """
        t = self._round(server_round)
        k = self.num_hypotheses
        sampled = self._sampled[1] if self._sampled[0] == t else []
        # The screening's one pass over the releases also measures what the robust clusters
        # (the Gram matrix) and the persistence test (the sketch) need (strategies.geometry).
        intake = self._screen.screen(
            t, results, failures, sampled=sampled, hypotheses=self._flat, record=self._client,
            gram=self.cluster_aggregator == "clipped-mean",
            sketch=self._persistence.sketch if self._persistence.threshold > 0 else None)
        if self.release != "sign":
            set_aside_persistent(t, intake, self._flat, self._persistence, self._screen.names,
                                 self._client)
        released, sigmas = intake.released, intake.sigmas
        m = released.shape[0]
        pushed = pushed_away(t, intake, self.clients)
        if pushed is not None:  # the run ends after this round (configure_fit: no clients)
            self.incomplete_reason, self.diverged = pushed, True

        labels = np.zeros(m, dtype=np.intp)
        kept: str | None = None
        new_flat = self._flat
        if m < self.min_replies:
            kept = (f"{m} usable replies, fewer than min-replies={self.min_replies} "
                    f"({intake.declined} declined, {len(intake.dropped)} dropped, "
                    f"{intake.failures} failed, {len(intake.missing)} missing)")
            _LOG.warning("round %d: %s; hypotheses unchanged", t, kept)
        elif self.release == "sign":
            new_flat = sign_step(self._flat, released, sigmas, self.aggregation, self._rng,
                                 self.server_learning_rate)
        else:
            labels, means = cluster_and_aggregate(
                released, sigmas, self._flat, aggregation=self.aggregation,
                cluster_aggregator=self.cluster_aggregator, rng=self._rng, trust=intake.trust,
                geometry=intake.geometry)
            new_flat, _ = self.server_update.apply(self._flat, means, released, labels,
                                                   self.history, t, self._reseeded, self._inert)
        if kept is None and not np.isfinite(new_flat).all():
            # Unreachable with screened replies (see strategies.norms); a last guard that the
            # hypotheses never hold a NaN or an inf.
            kept = "the aggregate was not finite"
            _LOG.error("round %d: %s; hypotheses unchanged", t, kept)
            new_flat, labels = self._flat, np.zeros(m, dtype=np.intp)

        cluster_sizes = (np.bincount(labels, minlength=k).tolist() if kept is None
                         else [0] * k)
        self._pending = RoundResult(
            round=t, cluster_sizes=cluster_sizes, replies=m, declined=intake.declined,
            dropped=intake.dropped, failures=intake.failures,
            released=released.tolist() if self.keep_released else None,
            labels=labels.tolist() if self.keep_released else None,
            missing=intake.missing, failed=intake.failed, kept=kept,
            sampled=len(sampled), asked=self._sampled[2] if sampled else [],
        )
        metrics: dict[str, Scalar] = {
            "replies": m, "declined": intake.declined, "dropped": len(intake.dropped),
            "failures": intake.failures, "missing": len(intake.missing)}
        metrics.update({f"cluster-size-{j}": size for j, size in enumerate(cluster_sizes)})
        if kept is not None:
            return None, metrics
        self._flat = new_flat
        self.rounds_completed += 1
        return self._parameters(), metrics

    # ----------------------------------------------------------------- checkpoint state

    def state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """Everything needed to continue this run after round ``last_round``.

        Returns
        -------
        state : dict
            Plain JSON values: the round, counters, best loss and round, the patience count,
            whether the run stopped early, the rng's ``bit_generator.state``, the devices'
            draw seed (so a resumed run asks whom the run would have asked), every client's
            record, the name bindings, the norm reference, the persistence sums and the round
            records.
        arrays : dict of str to np.ndarray
            ``hypotheses`` and ``best_hypotheses``, each (k, n) float32.
        """
        state: dict[str, Any] = {
            "version": STATE_VERSION,
            "shapes": [list(shape) for shape in self._shapes],
            "rng": self._rng.bit_generator.state,
            "screen": {**self._screen.to_dict(), "persistence": self._persistence.to_dict()},
            "draw_seed": self.device_keys.seed,
            **self._records_state(),
        }
        # The key order of checkpoints written before the bookkeeping moved to RecordedStrategy.
        state = {key: state[key] for key in _STATE_KEYS}
        return state, {"hypotheses": self._flat.copy(), "best_hypotheses": self._best_flat.copy()}

    def restore(self, state: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> None:
        """Continue from :meth:`state`: Flower's round i becomes round ``state["round"] + i``.

        A run that stopped for lack of devices is continued (the reason is cleared); one that
        stopped early stays stopped.

        Raises
        ------
        ValueError
            If the state is of another layout, another number of hypotheses or other shapes,
            or its rng is of another kind than this strategy's.
        """
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"checkpoint state version {state.get('version')!r}, expected "
                             f"{STATE_VERSION}")
        shapes = [tuple(shape) for shape in state["shapes"]]
        flat = np.asarray(arrays["hypotheses"], dtype=np.float32)
        best = np.asarray(arrays["best_hypotheses"], dtype=np.float32)
        check_saved(shapes, flat, best, like=self._flat, like_shapes=self._shapes)
        rng_state = state["rng"]
        if rng_state.get("bit_generator") != type(self._rng.bit_generator).__name__:
            raise ValueError(f"the checkpoint's rng is {rng_state.get('bit_generator')!r}, this "
                             f"run's is {type(self._rng.bit_generator).__name__!r}")
        self._rng.bit_generator.state = rng_state
        self.device_keys.seed = int(state.get("draw_seed", self.device_keys.seed))
        self._flat, self._best_flat = flat.copy(), best.copy()
        self._load_records(state)
        self.incomplete_reason = None
        self._screen.load_dict(state["screen"])
        self._persistence.load_dict(state["screen"].get("persistence", {}))

