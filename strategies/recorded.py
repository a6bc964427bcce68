"""A run's bookkeeping: server-side validation, patience, one record per round, per-device records.

:class:`RecordedStrategy` is the part of :class:`~strategies.clustered.ClusteredStrategy` that
does not depend on how the hypotheses are trained. Flower calls ``evaluate(0, ...)`` after
``initialize_parameters`` and then, every round, ``configure_fit`` → ``aggregate_fit`` →
``evaluate`` → ``configure_evaluate``. ``aggregate_fit`` (the subclass's) leaves a
:class:`RoundResult` in ``_pending``; ``evaluate`` validates the hypotheses when due, updates the
patience and turns the result into a :class:`~strategies.records.RoundRecord`. Round 0 is
recorded with no replies (the initial hypotheses' validation loss, the starting point of the
patience count). There is no federated evaluation: ``configure_evaluate`` sends nothing.

Resuming: Flower counts rounds from 1 again after a restart; ``_round`` maps Flower's round ``i``
to ``round_offset + i``, and ``_records_state`` / ``_load_records`` carry the bookkeeping in and
out of a checkpoint.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from abc import abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from flwr.common import EvaluateIns, EvaluateRes, Parameters, Scalar
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import Strategy

from strategies.divergence import Divergence
from strategies.records import ClientRecord, RoundRecord

__all__ = ["EvaluateFn", "RecordedStrategy", "RoundResult"]

_LOG = logging.getLogger(__name__)

EvaluateFn = Callable[[list[list[np.ndarray]]], Mapping[str, float]]
# Flower's types for the (unused) federated evaluation.
_EvaluateResults = list[tuple[ClientProxy, EvaluateRes]]
_EvaluateFailures = list[tuple[ClientProxy, EvaluateRes] | BaseException]


@dataclass
class RoundResult:
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
    asked: list[str] = field(default_factory=list)


class RecordedStrategy(Strategy):
    """Validation on the server, early stop on patience, and the records of a run.

    Parameters
    ----------
    evaluate_fn : callable or None
        ``evaluate_fn(hypotheses) -> {"loss": ..., ...}``: validation on held-out users.
    eval_every : int
        Validate after every ``eval_every``-th round (and always in round 0); the caller checks
        it (an integer ≥ 1), as it checks ``patience`` (an integer ≥ 0).
    patience : int
        Stop after this many consecutive validations without a new best loss (0 = never).
    on_round : callable or None
        Called with each :class:`RoundRecord` as soon as it is complete.
    divergence : Divergence or None
        When a run of bad validations ends the run as diverged
        (:class:`~strategies.divergence.Divergence`; default: the settings' defaults).

    Attributes
    ----------
    history : list of RoundRecord
        One record per round that trained, plus round 0.
    clients : dict of str to ClientRecord
        Per node id, every client ever sampled.
    stopped_early : bool
        Whether the patience ran out.
    rounds_completed : int
        Rounds whose aggregation changed the hypotheses (the subclass counts them).
    last_round : int
        The last round recorded (0 before any; the restored round after a restore).
    best_loss : float or None
        Lowest validation loss so far; ``best_round`` is the round it was reached in.
    incomplete_reason : str or None
        Why the run stopped before its last round (too few devices, or diverged), if it did.
    diverged : bool
        Whether it stopped because its hypotheses left what the devices or the validation data
        support (:mod:`strategies.divergence`); not resumable.

    Notes
    -----
    A subclass provides ``num_hypotheses``, ``hypotheses`` and ``_keep_best`` (remember the
    current hypotheses as the best ones), and sets ``_pending`` in ``aggregate_fit``.
    """

    def __init__(
        self,
        *,
        evaluate_fn: EvaluateFn | None,
        eval_every: int,
        patience: int,
        on_round: Callable[[RoundRecord], None] | None,
        divergence: Divergence | None = None,
    ) -> None:
        super().__init__()
        self.eval_every = eval_every
        self.patience = patience
        self._evaluate_fn = evaluate_fn
        self._on_round = on_round
        self.history: list[RoundRecord] = []
        self.clients: dict[str, ClientRecord] = {}
        self.stopped_early = False
        self.rounds_completed = 0
        self.last_round = 0
        self.round_offset = 0
        self._restored = False
        self.best_loss: float | None = None
        self.best_round: int | None = None
        self._stale_evaluations = 0
        self._pending: RoundResult | None = None
        self.divergence = divergence or Divergence()
        self.incomplete_reason: str | None = None
        self.diverged = False

    @property
    @abstractmethod
    def num_hypotheses(self) -> int:
        """K, the number of hypotheses."""

    @property
    @abstractmethod
    def hypotheses(self) -> list[list[np.ndarray]]:
        """The current hypotheses, as ``evaluate_fn`` takes them."""

    @abstractmethod
    def _keep_best(self) -> None:
        """Remember the current hypotheses as the best ones (a new best validation loss)."""

    def _after_record(self) -> None:
        """Act on the round just recorded, before it is reported (and checkpointed)."""

    def _client(self, cid: str) -> ClientRecord:
        record = self.clients.get(cid)
        if record is None:
            record = self.clients[cid] = ClientRecord(cid=cid)
        return record

    def _round(self, server_round: int) -> int:
        """Return the run's round for Flower's ``server_round`` (Flower restarts at 1)."""
        return self.round_offset + server_round

    # ----------------------------------------------------------------- Strategy API

    def configure_evaluate(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager,
    ) -> list[tuple[ClientProxy, EvaluateIns]]:
        """Return no clients: validation is done on the server (``evaluate``)."""
        return []

    def aggregate_evaluate(
        self, server_round: int, results: _EvaluateResults, failures: _EvaluateFailures,
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
            recorded either. After a restore Flower's round 0 is the restored round, already
            recorded: ``None``.
        """
        t = self._round(server_round)
        if server_round == 0:
            if self._restored:
                return None
            k = self.num_hypotheses
            result = RoundResult(0, [0] * k, 0, 0, [], 0, None, None, [], [], None, 0)
        else:
            pending, self._pending = self._pending, None
            if pending is None or pending.round != t:
                return None
            result = pending

        loss: float | None = None
        val_metrics: dict[str, float] = {}
        if self._evaluate_fn is not None and t % self.eval_every == 0:
            loss, val_metrics = self._validate(t)

        # A RoundRecord is the RoundResult plus the validation (fields taken as they are).
        outcome = {f.name: getattr(result, f.name) for f in dataclasses.fields(result)}
        record = RoundRecord(**{**outcome, "round": t}, val_loss=loss, val_metrics=val_metrics)
        self.history.append(record)
        self.last_round = t
        if loss is not None and not self.diverged:
            # Before on_round: the summary and the round line of this round say "diverged".
            reason = self.divergence.check(self.history, self.clients)
            if reason is not None:  # the run ends here (configure_fit: no clients)
                self.incomplete_reason, self.diverged = reason, True
        self._after_record()
        if self._on_round is not None:
            self._on_round(record)
        if loss is None:
            return None
        return loss, dict(val_metrics)

    # ----------------------------------------------------------------- checkpoint state

    def _records_state(self) -> dict[str, Any]:
        """Return the bookkeeping part of a checkpoint, as plain JSON values."""
        return {
            "round": self.last_round,
            "rounds_completed": self.rounds_completed,
            "best_loss": self.best_loss,
            "best_round": self.best_round,
            "stale_evaluations": self._stale_evaluations,
            "stopped_early": self.stopped_early,
            "clients": [record.to_dict() for record in self.clients.values()],
            "history": [record.to_dict() for record in self.history],
        }

    def _load_records(self, state: Mapping[str, Any]) -> None:
        """Put back :meth:`_records_state`: Flower's round i becomes ``state["round"] + i``."""
        self.last_round = self.round_offset = int(state["round"])
        self._restored = True
        self.rounds_completed = int(state["rounds_completed"])
        self.best_loss = state["best_loss"]
        self.best_round = state["best_round"]
        self._stale_evaluations = int(state["stale_evaluations"])
        self.stopped_early = bool(state["stopped_early"])
        self.clients = {c["cid"]: ClientRecord.from_dict(c) for c in state["clients"]}
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
            self._keep_best()
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
