"""Server side of Algorithm 1 (Galli et al.): k hypotheses, k-means, budget-aware cluster means.

One round, as Flower's legacy ``Server.fit`` drives it::

    configure_fit   sample U clients with the strategy's own rng; send the k hypotheses
    aggregate_fit   declines apart, validate every reply (bad ones are dropped and logged),
                    k-means on the released vectors seeded with the hypotheses, then for each
                    cluster the budget-weighted mean of its members (an empty cluster keeps its
                    hypothesis); for the stochastic-sign release, a majority-vote step instead
    evaluate        server-side validation every ``eval_every`` rounds, early stop on
                    ``patience``, then one :class:`RoundRecord` for the round

Flower calls ``evaluate(0, ...)`` after ``initialize_parameters`` and then, every round,
``configure_fit`` → ``aggregate_fit`` → ``evaluate`` → ``configure_evaluate``. Round 0 is
recorded as a :class:`RoundRecord` with no replies (the initial hypotheses' validation loss,
the starting point of the patience count). After an early stop ``configure_fit`` returns no
clients, Flower skips the remaining rounds cheaply, and ``evaluate`` returns ``None`` and
records nothing for them.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import numbers
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
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

from strategies.aggregation import budget_weights, check_aggregation
from strategies.validation import check_reply, npy_view

__all__ = ["RELEASES", "ClientRecord", "ClusteredStrategy", "RoundRecord"]

_LOG = logging.getLogger(__name__)

RELEASES: tuple[str, ...] = ("parameters", "sign")
# Config keys the strategy sets itself; ``fit_config`` may not override them.
_RESERVED_CONFIG = ("num-hypotheses", "server-round")
# How long configure_fit waits for ``min_available_clients`` (Flower's own default: one day).
_WAIT_FOR_CLIENTS_S = 86_400
_NPY_TENSOR_TYPE = "numpy.ndarray"

EvaluateFn = Callable[[list[list[np.ndarray]]], Mapping[str, float]]


@dataclass(frozen=True)
class RoundRecord:
    """What happened in one round (round 0: the initial hypotheses, no replies).

    Attributes
    ----------
    round : int
        The server round (0 = before training).
    val_loss : float or None
        Validation loss of the hypotheses after this round; ``None`` if not evaluated this round.
    val_metrics : dict of str to float
        The other entries ``evaluate_fn`` returned (empty if not evaluated).
    cluster_sizes : list of int
        Usable replies assigned to each hypothesis (k entries; all zero in round 0).
    replies : int
        Usable replies aggregated (declines, dropped replies and failures excluded).
    declined : int
        Clients that declined (``declined`` = 1: their next release would pass their cap).
    dropped : list of (str, str)
        ``(node id, reason)`` of each reply that failed validation.
    failures : int
        Clients that raised or answered with an error status.
    released : list of list of float or None
        The usable released vectors (flattened, in reply order) if ``keep_released``.
    labels : list of int or None
        The hypothesis each released vector was assigned to, if ``keep_released``.
    """

    round: int
    val_loss: float | None
    val_metrics: dict[str, float]
    cluster_sizes: list[int]
    replies: int
    declined: int
    dropped: list[tuple[str, str]]
    failures: int
    released: list[list[float]] | None = None
    labels: list[int] | None = None

    def to_dict(self) -> dict[str, Any]:
        """Return the record as plain JSON-serialisable Python values."""
        out = dataclasses.asdict(self)
        out["dropped"] = [list(pair) for pair in self.dropped]
        return out


@dataclass
class ClientRecord:
    """What the server knows about one client (keyed by its node id, ``ClientProxy.cid``).

    Attributes
    ----------
    cid : str
        The node id.
    sampled : int
        Rounds it was sent the hypotheses.
    participations : int
        Usable replies of it that were aggregated.
    declines : int
        Rounds it declined.
    dropped : int
        Replies of it that failed validation.
    failures : int
        Rounds it answered with an error status.
    last_round : int
        Last round it replied in (0 = never).
    metrics : dict of str to Scalar
        The metrics of its last reply (``spend-d``, ``spend-epsilon``, ``spend-delta``,
        ``budget-epsilon``, ``sigma``, ``releases``, ...), as reported.
    """

    cid: str
    sampled: int = 0
    participations: int = 0
    declines: int = 0
    dropped: int = 0
    failures: int = 0
    last_round: int = 0
    metrics: dict[str, Scalar] = field(default_factory=dict)


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


class ClusteredStrategy(Strategy):
    """Clustered federated learning with locally private releases (Algorithm 1, server side).

    Parameters
    ----------
    initial_hypotheses : list of list of np.ndarray
        k hypotheses, each a list of L layers with the same shapes; cast to float32 (copied).
    clients_per_round : int
        U, the clients sampled each round (fewer if fewer are connected, but at least
        ``min_available_clients`` must be).
    min_available_clients : int, optional
        Clients that must be connected before a round starts; default ``clients_per_round``.
    release : {"parameters", "sign"}
        What clients release: sanitized parameters (k-means + cluster means), or stochastic
        signs of their update (majority vote; only with k = 1).
    aggregation : str
        One of :data:`strategies.AGGREGATIONS`; how the releases of a cluster are weighted.
    server_learning_rate : float
        Step of the sign release's update θ ← θ + η·sign(weighted mean of the signs).
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
    rounds_completed : int
        Rounds whose aggregation used at least one reply.
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
        min_available_clients: int | None = None,
        release: str = "parameters",
        aggregation: str = "mean",
        server_learning_rate: float = 0.01,
        evaluate_fn: EvaluateFn | None = None,
        eval_every: int = 1,
        patience: int = 0,
        fit_config: Mapping[str, Scalar] | None = None,
        rng: np.random.Generator | None = None,
        on_round: Callable[[RoundRecord], None] | None = None,
        keep_released: bool = False,
    ) -> None:
        super().__init__()
        self._shapes, self._flat = _stack_hypotheses(initial_hypotheses)
        self._sizes = [math.prod(shape) for shape in self._shapes]
        self._offsets = np.concatenate([[0], np.cumsum(self._sizes)]).astype(int).tolist()
        k = self.num_hypotheses

        clients_per_round = _check_int("clients_per_round", clients_per_round, minimum=1)
        if min_available_clients is None:
            min_available_clients = clients_per_round
        min_available_clients = _check_int(
            "min_available_clients", min_available_clients, minimum=1
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
        self.min_available_clients = min_available_clients
        self.release = release
        self.aggregation = check_aggregation(aggregation)
        self.server_learning_rate = float(server_learning_rate)
        self.eval_every = eval_every
        self.patience = patience
        self.keep_released = keep_released
        self._fit_config: dict[str, Scalar] = fit_config
        self._evaluate_fn = evaluate_fn
        self._on_round = on_round
        self._rng = rng if rng is not None else np.random.default_rng()

        self.history: list[RoundRecord] = []
        self.clients: dict[str, ClientRecord] = {}
        self.stopped_early = False
        self.rounds_completed = 0
        self.best_loss: float | None = None
        self.best_round: int | None = None
        # _flat is never modified in place (each round makes a new matrix), so keeping a
        # reference to the best one costs nothing.
        self._best_flat = self._flat
        self._stale_evaluations = 0
        self._pending: _RoundResult | None = None

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

    def _layers(self, flat: np.ndarray) -> list[list[np.ndarray]]:
        """Return each row of a (k, n) matrix as a list of layer views."""
        return [
            [
                flat[j, start:stop].reshape(shape)
                for start, stop, shape in zip(
                    self._offsets[:-1], self._offsets[1:], self._shapes, strict=True
                )
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

    # ----------------------------------------------------------------- Strategy API

    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        """Return the k hypotheses as one list (hypothesis j, layer l at index j·L + l)."""
        return self._parameters()

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        """Sample ``clients_per_round`` clients and send them the hypotheses.

        Sampling is without replacement, uniform, with the strategy's rng over the connected
        node ids in sorted order (so a fixed seed gives the same clients whatever order they
        connected in). Returns no clients after an early stop, or if ``min_available_clients``
        are not connected within a day.
        """
        if self.stopped_early:
            return []
        if not client_manager.wait_for(self.min_available_clients, timeout=_WAIT_FOR_CLIENTS_S):
            _LOG.warning(
                "round %d: fewer than %d clients connected; skipping the round",
                server_round,
                self.min_available_clients,
            )
            return []
        available = client_manager.all()
        cids = sorted(available)
        if len(cids) < self.min_available_clients:  # some left between wait_for and all()
            _LOG.warning(
                "round %d: only %d of the %d required clients connected; skipping the round",
                server_round,
                len(cids),
                self.min_available_clients,
            )
            return []
        size = min(self.clients_per_round, len(cids))
        chosen = [cids[i] for i in self._rng.choice(len(cids), size=size, replace=False)]
        config: dict[str, Scalar] = {
            "num-hypotheses": self.num_hypotheses,
            "server-round": server_round,
            **self._fit_config,
        }
        fit_ins = FitIns(parameters=parameters, config=config)
        for cid in chosen:
            self._client(cid).sampled += 1
        return [(available[cid], fit_ins) for cid in chosen]

    def aggregate_fit(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        """Validate the replies, cluster them and return the new hypotheses.

        Returns ``None`` as parameters (Flower then keeps the current ones) when no reply is
        usable. The metrics hold ``replies``, ``declined``, ``dropped``, ``failures`` and
        ``cluster-size-j`` for each hypothesis j.
        """
        k, n = self._flat.shape
        for failure in failures:
            if isinstance(failure, tuple):
                self._client(failure[0].cid).failures += 1
        candidates: list[tuple[str, FitRes]] = []
        declined = 0
        for proxy, res in results:
            record = self._client(proxy.cid)
            record.metrics = dict(res.metrics)
            record.last_round = server_round
            if res.metrics.get("declined", 0) == 1:
                declined += 1
                record.declines += 1
            else:
                candidates.append((proxy.cid, res))

        # One row per reply, filled in place: the replies' bytes are copied once, straight into
        # the matrix k-means and the weighted means work on.
        matrix = np.empty((len(candidates), n), dtype=np.float32)
        sigmas = np.empty(len(candidates), dtype=np.float64)
        dropped: list[tuple[str, str]] = []
        m = 0
        for cid, res in candidates:
            reason, sigma = self._reply_sigma(res.metrics)
            if reason is None:
                reason = self._load_reply(res.parameters, matrix[m])
            if reason is not None:
                dropped.append((cid, reason))
                self._client(cid).dropped += 1
                _LOG.warning(
                    "round %d: dropped the reply of node %s: %s", server_round, cid, reason
                )
                continue
            sigmas[m] = sigma
            self._client(cid).participations += 1
            m += 1
        released = matrix[:m]  # leading rows: still C-contiguous, no copy
        sigmas = sigmas[:m]

        labels = np.zeros(m, dtype=np.intp)
        if m == 0:
            new_flat = self._flat
            _LOG.warning(
                "round %d: no usable reply (%d declined, %d dropped, %d failures); "
                "hypotheses unchanged",
                server_round,
                declined,
                len(dropped),
                len(failures),
            )
        elif self.release == "sign":
            weights = budget_weights(sigmas, self.aggregation, self._rng).astype(np.float32)
            vote = weights @ released
            new_flat = self._flat + np.float32(self.server_learning_rate) * np.sign(vote)
        else:
            labels = self._assign(released)
            new_flat = self._cluster_means(released, sigmas, labels)

        cluster_sizes = np.bincount(labels, minlength=k).tolist()
        self._pending = _RoundResult(
            round=server_round,
            cluster_sizes=cluster_sizes,
            replies=m,
            declined=declined,
            dropped=dropped,
            failures=len(failures),
            released=released.tolist() if self.keep_released else None,
            labels=labels.tolist() if self.keep_released else None,
        )
        metrics: dict[str, Scalar] = {
            "replies": m,
            "declined": declined,
            "dropped": len(dropped),
            "failures": len(failures),
        }
        metrics.update({f"cluster-size-{j}": size for j, size in enumerate(cluster_sizes)})
        if m == 0:
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
            recorded either.
        """
        if server_round == 0:
            k = self.num_hypotheses
            result = _RoundResult(0, [0] * k, 0, 0, [], 0, None, None)
        else:
            pending, self._pending = self._pending, None
            if pending is None or pending.round != server_round:
                return None
            result = pending

        loss: float | None = None
        val_metrics: dict[str, float] = {}
        if self._evaluate_fn is not None and server_round % self.eval_every == 0:
            loss, val_metrics = self._validate(server_round)

        record = RoundRecord(
            round=server_round,
            val_loss=loss,
            val_metrics=val_metrics,
            cluster_sizes=result.cluster_sizes,
            replies=result.replies,
            declined=result.declined,
            dropped=result.dropped,
            failures=result.failures,
            released=result.released,
            labels=result.labels,
        )
        self.history.append(record)
        if self._on_round is not None:
            self._on_round(record)
        if loss is None:
            return None
        return loss, dict(val_metrics)

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

    def _reply_sigma(self, metrics: Mapping[str, Scalar]) -> tuple[str | None, float]:
        """Read the reply's ``sigma``; it must be valid unless the aggregation is ``mean``."""
        value = metrics.get("sigma")
        ok = (
            isinstance(value, int | float | np.integer | np.floating)
            and not isinstance(value, bool)
            and math.isfinite(value)
            and value >= 0
        )
        if ok:
            return None, float(value)  # type: ignore[arg-type]
        if self.aggregation == "mean":
            return None, 0.0
        return (
            f"metric 'sigma' must be a finite number >= 0 for aggregation={self.aggregation!r}, "
            f"got {value!r}",
            0.0,
        )

    def _load_reply(self, parameters: Parameters, row: np.ndarray) -> str | None:
        """Check one reply and copy it into ``row``; return why it is unusable, or None."""
        if parameters.tensor_type != _NPY_TENSOR_TYPE:
            return f"tensor_type is {parameters.tensor_type!r}, expected {_NPY_TENSOR_TYPE!r}"
        try:
            arrays = [npy_view(tensor) for tensor in parameters.tensors]
        except ValueError as exc:
            return f"unreadable array: {exc}"
        reason = check_reply(arrays, self._shapes, np.float32)
        if reason is not None:
            return reason
        for array, start, stop in zip(arrays, self._offsets[:-1], self._offsets[1:], strict=True):
            np.copyto(row[start:stop].reshape(array.shape), array)
        if self.release == "sign" and not ((row == 1.0) | (row == -1.0)).all():
            return "a sign release must hold only +1 and -1"
        return None

    def _nearest(self, released: np.ndarray, centroids: np.ndarray) -> np.ndarray:
        """Index of the nearest centroid for each released vector."""
        # ‖x − h‖² = ‖x‖² − 2x·h + ‖h‖²; ‖x‖² does not change the argmin.
        h = centroids.astype(np.float64)
        scores = np.einsum("ij,ij->i", h, h)[None, :] - 2.0 * (released @ h.T)
        return np.argmin(scores, axis=1).astype(np.intp)

    def _assign(self, released: np.ndarray) -> np.ndarray:
        """Cluster index of each released vector (centroid j is hypothesis j).

        k-means runs only over the hypotheses that attract at least one release
        at the start (nearest hypothesis). A hypothesis that attracts none is an
        empty cluster and keeps its value: scikit-learn would otherwise move an
        empty centroid onto the farthest point, which under local noise is the
        noisiest release of the round, and a hypothesis that jumps there is
        then chosen by no client again. (With ν = 5 on the synthetic task this
        relocation alone sent hypotheses 5-7 units away in most runs.)
        """
        k = self.num_hypotheses
        m = released.shape[0]
        if k == 1:
            return np.zeros(m, dtype=np.intp)
        start = self._nearest(released, self._flat)
        used = np.unique(start)
        if used.size < 2 or m <= used.size:
            return start
        sub = self._kmeans(released, self._flat[used])
        return used[sub]

    def _kmeans(self, released: np.ndarray, init: np.ndarray) -> np.ndarray:
        # Imported here: sklearn costs ~2 s to import, and only the ServerApp needs it.
        from sklearn.cluster import KMeans
        from sklearn.exceptions import ConvergenceWarning

        # tol=0: stop when the assignment stops changing (which Lloyd's algorithm reaches),
        # and it spares sklearn's np.var(X, axis=0), a temporary as large as the data.
        # copy_x=True (the default): sklearn centres a copy, so the releases stay exact.
        kmeans = KMeans(n_clusters=init.shape[0], init=init, n_init=1, tol=0.0, copy_x=True)
        with warnings.catch_warnings(record=True) as caught:
            # Fewer distinct points than clusters is expected (identical replies): log it.
            warnings.simplefilter("always", ConvergenceWarning)
            kmeans.fit(released)
        for warning in caught:
            _LOG.info("k-means: %s", warning.message)
        return np.asarray(kmeans.labels_, dtype=np.intp)

    def _cluster_means(
        self, released: np.ndarray, sigmas: np.ndarray, labels: np.ndarray
    ) -> np.ndarray:
        """Budget-weighted mean of each cluster; an empty cluster keeps its hypothesis."""
        k = self.num_hypotheses
        weights = np.zeros((k, released.shape[0]), dtype=np.float32)
        for j in range(k):
            members = np.flatnonzero(labels == j)
            if members.size:
                weights[j, members] = budget_weights(sigmas[members], self.aggregation, self._rng)
        # One (k × m)·(m × n) product in float32 (a float64 weight matrix would upcast the
        # whole m × n matrix).
        new_flat = weights @ released
        empty = ~weights.any(axis=1)
        new_flat[empty] = self._flat[empty]
        return new_flat


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
