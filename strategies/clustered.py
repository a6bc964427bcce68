"""Server side of Algorithm 1 (Galli et al.): k hypotheses, k-means, budget-aware cluster means.

One round, as Flower's legacy ``Server.fit`` drives it::

    configure_fit   sample up to U of the connected clients with the strategy's own rng (waiting
                    at most ``round_timeout`` for ``min_replies`` of them); send the k hypotheses
    aggregate_fit   screen every reply (strategies.intake: declines apart; bad replies dropped,
                    failed and missing devices named and logged), then, with at least
                    ``min_replies`` usable replies, k-means on the released vectors seeded with
                    the hypotheses and for each cluster the budget-weighted mean of its members
                    (an empty cluster keeps its hypothesis); for the stochastic-sign release, a
                    majority-vote step instead
    evaluate        server-side validation every ``eval_every`` rounds, early stop on
                    ``patience``, then one :class:`RoundRecord` for the round

Flower calls ``evaluate(0, ...)`` after ``initialize_parameters`` and then, every round,
``configure_fit`` → ``aggregate_fit`` → ``evaluate`` → ``configure_evaluate``. Round 0 is
recorded as a :class:`RoundRecord` with no replies (the initial hypotheses' validation loss,
the starting point of the patience count). After an early stop, or once too few devices are
connected to start a round, ``configure_fit`` returns no clients, Flower skips the remaining
rounds cheaply, and ``evaluate`` returns ``None`` and records nothing for them.

The round's deadline is Flower's (``ServerConfig(round_timeout=...)``, which the Deployment
Engine turns into each instruction's TTL); a device that misses it is reported by Flower as a
failure, which :class:`~strategies.proxies.TracedProxy` attributes to the device.

Resuming: :meth:`ClusteredStrategy.state` captures everything the strategy needs to continue
(hypotheses, best ones, records, rng state, name bindings) and :meth:`ClusteredStrategy.restore`
puts it back; Flower then counts rounds from 1 again, and the strategy maps its round ``i`` to
``restored round + i``.
"""

from __future__ import annotations

import logging
import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.common import (
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    Parameters,
    Scalar,
    ndarrays_to_parameters,
)
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import Strategy

from strategies.aggregation import check_aggregation, cluster_means, sign_step
from strategies.clustering import assign_clusters
from strategies.intake import ReplyScreen
from strategies.norms import NormLimits
from strategies.proxies import TracedProxy
from strategies.records import ClientRecord, RoundRecord

__all__ = ["RELEASES", "ClientRecord", "ClusteredStrategy", "RoundRecord"]

_LOG = logging.getLogger(__name__)

RELEASES: tuple[str, ...] = ("parameters", "sign")
# Config keys the strategy sets itself; ``fit_config`` may not override them.
_RESERVED_CONFIG = ("num-hypotheses", "server-round")
#: How long the first round waits for ``clients_per_round`` devices (beyond ``min_replies``):
#: devices started together register within seconds, and a federation smaller than
#: ``clients_per_round`` should not wait a whole round timeout to find that out.
_FORMING_GRACE_S = 15.0
#: Version of :meth:`ClusteredStrategy.state`'s layout.
STATE_VERSION = 1

EvaluateFn = Callable[[list[list[np.ndarray]]], Mapping[str, float]]


@dataclass
class _RoundResult:
    """aggregate_fit's outcome, kept until evaluate() of the same round writes the record."""

    round: int
    cluster_sizes: list[int]
    replies: int
    declined: int
    dropped: list[tuple[str, str]]
    failures: int
    released: list[list[float]] | None
    labels: list[int] | None
    missing: list[str]
    failed: list[tuple[str, str]]
    kept: str | None
    sampled: int


class ClusteredStrategy(Strategy):
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
        Seconds ``configure_fit`` waits for ``min_replies`` clients to connect; if fewer are
        connected then, the run stops (``incomplete_reason`` says why). In the first round of
        this process, while the federation forms, it first waits up to 15 s (at most
        ``round_timeout``) for ``clients_per_round`` of them. The replies' deadline is Flower's
        own round timeout.
    release : {"parameters", "sign"}
        What clients release: sanitized parameters (k-means + cluster means), or stochastic
        signs of their update (majority vote; only with k = 1).
    aggregation : str
        One of :data:`strategies.AGGREGATIONS`; how the releases of a cluster are weighted.
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
    fit_config : dict, optional
        Extra entries sent in every ``FitIns.config``.
    rng : np.random.Generator, optional
        Drives client sampling and the ``probability`` aggregation; default: seeded by the OS.
    on_round : callable, optional
        Called with each :class:`RoundRecord` as soon as it is complete.
    on_stop : callable, optional
        Called with ``incomplete_reason`` when the run stops for lack of devices.
    keep_released : bool
        Store each round's released vectors (and their cluster) in the record, e.g. to plot a
        2-parameter task. It costs m·n Python floats per round: only for small models.

    Attributes
    ----------
    hypotheses : list of list of np.ndarray
        The current k hypotheses (a fresh copy at each access).
    best_hypotheses : list of list of np.ndarray
        The hypotheses with the lowest validation loss so far (the current ones if never
        validated).
    history : list of RoundRecord
        One record per round that trained, plus round 0.
    clients : dict of str to ClientRecord
        Per node id, every client ever sampled.
    stopped_early : bool
        Whether the patience ran out.
    incomplete_reason : str or None
        Why the run stopped before its last round (too few devices), if it did.
    rounds_completed : int
        Rounds whose aggregation changed the hypotheses.
    last_round : int
        The last round recorded (0 before any; the restored round after :meth:`restore`).
    best_loss : float or None
        Lowest validation loss so far; ``best_round`` is the round it was reached in.

    Raises
    ------
    ValueError
        If a parameter is out of range (the message names it), the hypotheses are empty or
        inconsistent, or ``release="sign"`` is asked with more than one hypothesis.
    """

    def __init__(
        self,
        *,
        initial_hypotheses: Sequence[Sequence[np.ndarray]],
        clients_per_round: int,
        min_replies: int = 1,
        round_timeout: float = 60.0,
        release: str = "parameters",
        aggregation: str = "mean",
        server_learning_rate: float = 0.01,
        norm_limits: NormLimits | None = None,
        evaluate_fn: EvaluateFn | None = None,
        eval_every: int = 1,
        patience: int = 0,
        fit_config: Mapping[str, Scalar] | None = None,
        rng: np.random.Generator | None = None,
        on_round: Callable[[RoundRecord], None] | None = None,
        on_stop: Callable[[str], None] | None = None,
        keep_released: bool = False,
    ) -> None:
        super().__init__()
        self._shapes, self._flat = _stack_hypotheses(initial_hypotheses)
        k = self.num_hypotheses

        clients_per_round = _check_int("clients_per_round", clients_per_round, minimum=1)
        min_replies = _check_int("min_replies", min_replies, minimum=1)
        if isinstance(round_timeout, bool) or not isinstance(round_timeout, int | float) or not (
            math.isfinite(round_timeout) and round_timeout > 0
        ):
            raise ValueError(
                f"round_timeout must be a positive number of seconds, got "
                f"round_timeout={round_timeout!r}"
            )
        if release not in RELEASES:
            raise ValueError(
                f"release must be one of {', '.join(RELEASES)}; got release={release!r}"
            )
        if release == "sign" and k != 1:
            raise ValueError(
                "release='sign' updates a single model: num-hypotheses must be 1, "
                f"got num-hypotheses={k}"
            )
        if not (math.isfinite(server_learning_rate) and server_learning_rate > 0):
            raise ValueError(
                "server_learning_rate must be positive and finite, "
                f"got server_learning_rate={server_learning_rate!r}"
            )
        eval_every = _check_int("eval_every", eval_every, minimum=1)
        patience = _check_int("patience", patience, minimum=0)
        fit_config = dict(fit_config or {})
        clash = sorted(set(fit_config) & set(_RESERVED_CONFIG))
        if clash:
            raise ValueError(f"fit_config may not set {', '.join(clash)}: the strategy sets them")

        self.clients_per_round = clients_per_round
        self.min_replies = min_replies
        self.round_timeout = float(round_timeout)
        self.release = release
        self.aggregation = check_aggregation(aggregation)
        self.server_learning_rate = float(server_learning_rate)
        self.eval_every = eval_every
        self.patience = patience
        self.keep_released = keep_released
        self._fit_config: dict[str, Scalar] = fit_config
        self._evaluate_fn = evaluate_fn
        self._on_round = on_round
        self._on_stop = on_stop
        self._rng = rng if rng is not None else np.random.default_rng()
        limits = norm_limits or NormLimits(mechanism="sign" if release == "sign" else "laplace")
        self._screen = ReplyScreen(self._shapes, release=release,
                                   need_sigma=self.aggregation != "mean", limits=limits)

        self.history: list[RoundRecord] = []
        self.clients: dict[str, ClientRecord] = {}
        self.stopped_early = False
        self.incomplete_reason: str | None = None
        self.rounds_completed = 0
        self.last_round = 0
        self.round_offset = 0
        self._restored = False
        self.best_loss: float | None = None
        self.best_round: int | None = None
        # _flat is never modified in place (each round makes a new matrix), so keeping a
        # reference to the best one costs nothing.
        self._best_flat = self._flat
        self._stale_evaluations = 0
        self._pending: _RoundResult | None = None
        self._client_manager: ClientManager | None = None
        self._sampled: tuple[int, list[str]] = (-1, [])
        self._forming = True  # the first configure_fit of this process: devices still joining

    def __repr__(self) -> str:
        return (
            f"ClusteredStrategy(num_hypotheses={self.num_hypotheses}, "
            f"clients_per_round={self.clients_per_round}, release={self.release!r}, "
            f"aggregation={self.aggregation!r})"
        )

    # ----------------------------------------------------------------- state views

    @property
    def num_hypotheses(self) -> int:
        """K, the number of hypotheses."""
        return int(self._flat.shape[0])

    @property
    def hypotheses(self) -> list[list[np.ndarray]]:
        """The current k hypotheses, k lists of L float32 arrays (a fresh copy)."""
        return [[layer.copy() for layer in layers] for layers in self._layers(self._flat)]

    @property
    def best_hypotheses(self) -> list[list[np.ndarray]]:
        """The hypotheses that reached ``best_loss`` (a fresh copy)."""
        return [[layer.copy() for layer in layers] for layers in self._layers(self._best_flat)]

    @property
    def shapes(self) -> list[tuple[int, ...]]:
        """The layer shapes of one hypothesis."""
        return list(self._shapes)

    def _layers(self, flat: np.ndarray) -> list[list[np.ndarray]]:
        """Return each row of a (k, n) matrix as a list of layer views."""
        offsets = self._screen.offsets
        return [
            [
                flat[j, start:stop].reshape(shape)
                for start, stop, shape in zip(offsets[:-1], offsets[1:], self._shapes, strict=True)
            ]
            for j in range(flat.shape[0])
        ]

    def _parameters(self) -> Parameters:
        return ndarrays_to_parameters([a for layers in self._layers(self._flat) for a in layers])

    def _client(self, cid: str) -> ClientRecord:
        record = self.clients.get(cid)
        if record is None:
            record = self.clients[cid] = ClientRecord(cid=cid)
        return record

    def _round(self, server_round: int) -> int:
        """Return the run's round for Flower's ``server_round`` (Flower restarts at 1)."""
        return self.round_offset + server_round

    # ----------------------------------------------------------------- Strategy API

    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        """Return the k hypotheses as one list (hypothesis j, layer l at index j·L + l)."""
        return self._parameters()

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        """Sample up to ``clients_per_round`` connected clients and send them the hypotheses.

        Sampling is without replacement, uniform, with the strategy's rng over the connected
        node ids in sorted order (so a fixed seed gives the same clients whatever order they
        connected in). Waits at most ``round_timeout`` for clients to connect (see the class
        notes). Returns no clients after an early stop, or when fewer than ``min_replies`` are
        connected: the run then stops, with ``incomplete_reason`` saying so.
        """
        t = self._round(server_round)
        if self.stopped_early or self.incomplete_reason is not None:
            return []
        self._client_manager = client_manager
        connected = client_manager.num_available()
        if self._forming and connected < self.clients_per_round:
            grace = min(self.round_timeout, _FORMING_GRACE_S)
            _LOG.info("round %d: %d devices connected; waiting up to %g s for "
                      "clients-per-round=%d", t, connected, grace, self.clients_per_round)
            client_manager.wait_for(self.clients_per_round, timeout=math.ceil(grace))
            connected = client_manager.num_available()
        self._forming = False
        if connected < self.min_replies:
            _LOG.info("round %d: %d devices connected; waiting up to %g s for min-replies=%d",
                      t, connected, self.round_timeout, self.min_replies)
            client_manager.wait_for(self.min_replies, timeout=math.ceil(self.round_timeout))
        available = client_manager.all()
        cids = sorted(available)
        if len(cids) < self.min_replies:
            self.incomplete_reason = (
                f"round {t}: too few devices: {len(cids)} connected, "
                f"min-replies={self.min_replies}"
            )
            _LOG.error("%s; the run stops here (resume it once devices are back)",
                       self.incomplete_reason)
            if self._on_stop is not None:
                self._on_stop(self.incomplete_reason)
            return []
        size = min(self.clients_per_round, len(cids))
        if size < self.clients_per_round:
            _LOG.info("round %d: sampling %d devices, fewer than clients-per-round=%d: only %d "
                      "are connected", t, size, self.clients_per_round, len(cids))
        chosen = [cids[i] for i in self._rng.choice(len(cids), size=size, replace=False)]
        config: dict[str, Scalar] = {
            "num-hypotheses": self.num_hypotheses,
            "server-round": t,
            **self._fit_config,
        }
        fit_ins = FitIns(parameters=parameters, config=config)
        for cid in chosen:
            self._client(cid).sampled += 1
        self._sampled = (t, chosen)
        return [(TracedProxy(available[cid]), fit_ins) for cid in chosen]

    def aggregate_fit(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        """Screen the replies, cluster them and return the new hypotheses.

        Returns ``None`` as parameters (Flower then keeps the current ones) when fewer than
        ``min_replies`` replies are usable. The metrics hold ``replies``, ``declined``,
        ``dropped``, ``failures``, ``missing`` and ``cluster-size-j`` for each hypothesis j.
        """
        t = self._round(server_round)
        k = self.num_hypotheses
        sampled = self._sampled[1] if self._sampled[0] == t else []
        connected = (set(self._client_manager.all()) if self._client_manager is not None
                     else None)
        intake = self._screen.screen(t, results, failures, sampled=sampled, connected=connected,
                                     hypotheses=self._flat, record=self._client)
        released, sigmas = intake.released, intake.sigmas
        m = released.shape[0]

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
            labels = assign_clusters(released, self._flat)
            new_flat = cluster_means(released, sigmas, labels, self._flat, self.aggregation,
                                     self._rng)
        if kept is None and not np.isfinite(new_flat).all():
            # Unreachable with screened replies (see strategies.norms); a last guard that the
            # hypotheses never hold a NaN or an inf.
            kept = "the aggregate was not finite"
            _LOG.error("round %d: %s; hypotheses unchanged", t, kept)
            new_flat, labels = self._flat, np.zeros(m, dtype=np.intp)

        cluster_sizes = (np.bincount(labels, minlength=k).tolist() if kept is None
                         else [0] * k)
        self._pending = _RoundResult(
            round=t,
            cluster_sizes=cluster_sizes,
            replies=m,
            declined=intake.declined,
            dropped=intake.dropped,
            failures=intake.failures,
            released=released.tolist() if self.keep_released else None,
            labels=labels.tolist() if self.keep_released else None,
            missing=intake.missing,
            failed=intake.failed,
            kept=kept,
            sampled=len(sampled),
        )
        metrics: dict[str, Scalar] = {
            "replies": m,
            "declined": intake.declined,
            "dropped": len(intake.dropped),
            "failures": intake.failures,
            "missing": len(intake.missing),
        }
        metrics.update({f"cluster-size-{j}": size for j, size in enumerate(cluster_sizes)})
        if kept is not None:
            return None, metrics
        self._flat = new_flat
        self.rounds_completed += 1
        return self._parameters(), metrics

    def configure_evaluate(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, EvaluateIns]]:
        """Return no clients: validation is done on the server (``evaluate``)."""
        return []

    def aggregate_evaluate(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, EvaluateRes]],
        failures: list[tuple[ClientProxy, EvaluateRes] | BaseException],
    ) -> tuple[float | None, dict[str, Scalar]]:
        """Return nothing: there is no federated evaluation."""
        return None, {}

    def evaluate(
        self, server_round: int, parameters: Parameters
    ) -> tuple[float, dict[str, Scalar]] | None:
        """Validate the hypotheses (when due), update the patience and record the round.

        The strategy's own hypotheses are validated (``parameters`` is what ``aggregate_fit``
        returned, so the same values). Round 0 and every ``eval_every``-th round are validated.

        Returns
        -------
        tuple of (float, dict) or None
            ``(loss, other metrics)`` when validated; ``None`` otherwise, and for rounds that
            did not train (after an early stop, or skipped for lack of clients), which are not
            recorded either. After :meth:`restore` Flower's round 0 is the restored round,
            already recorded: ``None``.
        """
        t = self._round(server_round)
        if server_round == 0:
            if self._restored:
                return None
            k = self.num_hypotheses
            result = _RoundResult(0, [0] * k, 0, 0, [], 0, None, None, [], [], None, 0)
        else:
            pending, self._pending = self._pending, None
            if pending is None or pending.round != t:
                return None
            result = pending

        loss: float | None = None
        val_metrics: dict[str, float] = {}
        if self._evaluate_fn is not None and t % self.eval_every == 0:
            loss, val_metrics = self._validate(t)

        record = RoundRecord(
            round=t,
            val_loss=loss,
            val_metrics=val_metrics,
            cluster_sizes=result.cluster_sizes,
            replies=result.replies,
            declined=result.declined,
            dropped=result.dropped,
            failures=result.failures,
            released=result.released,
            labels=result.labels,
            missing=result.missing,
            failed=result.failed,
            kept=result.kept,
            sampled=result.sampled,
        )
        self.history.append(record)
        self.last_round = t
        if self._on_round is not None:
            self._on_round(record)
        if loss is None:
            return None
        return loss, dict(val_metrics)

    # ----------------------------------------------------------------- checkpoint state

    def state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """Everything needed to continue this run after round ``last_round``.

        Returns
        -------
        state : dict
            Plain JSON values: the round, counters, best loss and round, the patience count,
            whether the run stopped early, the rng's ``bit_generator.state``, every client's
            record, the name bindings, the norm reference and the round records.
        arrays : dict of str to np.ndarray
            ``hypotheses`` and ``best_hypotheses``, each (k, n) float32.
        """
        state: dict[str, Any] = {
            "version": STATE_VERSION,
            "round": self.last_round,
            "shapes": [list(shape) for shape in self._shapes],
            "rounds_completed": self.rounds_completed,
            "best_loss": self.best_loss,
            "best_round": self.best_round,
            "stale_evaluations": self._stale_evaluations,
            "stopped_early": self.stopped_early,
            "rng": self._rng.bit_generator.state,
            "clients": [record.to_dict() for record in self.clients.values()],
            "screen": self._screen.to_dict(),
            "history": [record.to_dict() for record in self.history],
        }
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
        if shapes != self._shapes or flat.shape != self._flat.shape or best.shape != flat.shape:
            raise ValueError(
                f"the checkpoint holds {flat.shape[0]} hypotheses of layer shapes {shapes}, this "
                f"run has {self.num_hypotheses} of {self._shapes}"
            )
        if not (np.isfinite(flat).all() and np.isfinite(best).all()):
            raise ValueError("the checkpoint's hypotheses are not finite")
        rng_state = state["rng"]
        if rng_state.get("bit_generator") != type(self._rng.bit_generator).__name__:
            raise ValueError(f"the checkpoint's rng is {rng_state.get('bit_generator')!r}, this "
                             f"run's is {type(self._rng.bit_generator).__name__!r}")
        self._rng.bit_generator.state = rng_state
        self._flat, self._best_flat = flat.copy(), best.copy()
        self.last_round = self.round_offset = int(state["round"])
        self._restored = True
        self.rounds_completed = int(state["rounds_completed"])
        self.best_loss = state["best_loss"]
        self.best_round = state["best_round"]
        self._stale_evaluations = int(state["stale_evaluations"])
        self.stopped_early = bool(state["stopped_early"])
        self.incomplete_reason = None
        self.clients = {c["cid"]: ClientRecord.from_dict(c) for c in state["clients"]}
        self._screen.load_dict(state["screen"])
        self.history = [RoundRecord.from_dict(r) for r in state["history"]]
        self._pending = None

    # ----------------------------------------------------------------- helpers

    def _validate(self, server_round: int) -> tuple[float, dict[str, float]]:
        """Run evaluate_fn and update best loss / patience."""
        assert self._evaluate_fn is not None
        out = dict(self._evaluate_fn(self.hypotheses))
        if "loss" not in out:
            raise ValueError(f"evaluate_fn must return a 'loss' entry, got keys {sorted(out)}")
        loss = float(out.pop("loss"))
        val_metrics = {key: float(value) for key, value in out.items()}

        # A NaN loss is never an improvement (and never becomes the best).
        if math.isfinite(loss) and (self.best_loss is None or loss < self.best_loss):
            self.best_loss = loss
            self.best_round = server_round
            self._best_flat = self._flat
            self._stale_evaluations = 0
        else:
            self._stale_evaluations += 1
            if self.patience and self._stale_evaluations >= self.patience:
                self.stopped_early = True
                _LOG.info(
                    "round %d: early stop, no better validation loss in %d evaluations "
                    "(best %s in round %s)",
                    server_round,
                    self._stale_evaluations,
                    self.best_loss,
                    self.best_round,
                )
        return loss, val_metrics


def _check_int(name: str, value: object, *, minimum: int) -> int:
    """Return ``value`` as an int if it is an integer >= ``minimum``, else raise ValueError."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {name}={value!r}")
    return int(value)


def _stack_hypotheses(
    hypotheses: Sequence[Sequence[np.ndarray]],
) -> tuple[list[tuple[int, ...]], np.ndarray]:
    """Check the k hypotheses and return (layer shapes, k × n float32 matrix)."""
    if len(hypotheses) == 0:
        raise ValueError("initial_hypotheses must hold at least one hypothesis, got none")
    first = [np.asarray(layer) for layer in hypotheses[0]]
    if not first:
        raise ValueError("initial_hypotheses[0] has no layers")
    shapes = [layer.shape for layer in first]
    n = sum(math.prod(shape) for shape in shapes)
    if n == 0:
        raise ValueError("initial_hypotheses[0] has no parameters (all layers are empty)")
    flat = np.empty((len(hypotheses), n), dtype=np.float32)
    for j, layers in enumerate(hypotheses):
        arrays = [np.asarray(layer) for layer in layers]
        if [a.shape for a in arrays] != shapes:
            raise ValueError(
                f"initial_hypotheses[{j}] has layer shapes {[a.shape for a in arrays]}, "
                f"expected {shapes} like initial_hypotheses[0]"
            )
        if any(not np.issubdtype(a.dtype, np.number) for a in arrays):
            raise ValueError(f"initial_hypotheses[{j}] has non-numeric layers")
        flat[j] = np.concatenate([a.ravel() for a in arrays])
        if not np.isfinite(flat[j]).all():
            raise ValueError(f"initial_hypotheses[{j}] has non-finite values")
    return shapes, flat
