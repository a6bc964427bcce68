"""The gpfl NumPyClient: Algorithm 1's client side and Algorithm 2 (SanitizeUpdate).

Flower builds a new client object (in a new process, under the Deployment
Engine) for every message, so nothing lives on the object between rounds: the
privacy ledger is on the device's disk and everything else is recomputed.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
from flwr.client import NumPyClient

from client.settings import ClientSettings, PrivacySettings
from mechanisms import (
    BudgetExceededError,
    EuclideanLaplace,
    GaussianMechanism,
    Mechanism,
    NoMechanism,
    PrivacyLedger,
    Spend,
    StochasticSign,
)
from tasks import Task

logger = logging.getLogger(__name__)

Arrays = list[np.ndarray]


def build_mechanism(privacy: PrivacySettings) -> Mechanism:
    """Make the mechanism the client's privacy settings name."""
    if privacy.mechanism == "laplace":
        if privacy.calibration == "neighbourhood":
            return EuclideanLaplace(
                calibration="neighbourhood",
                noise_multiplier=privacy.noise_multiplier,
                per_layer=privacy.per_layer,
            )
        return EuclideanLaplace(
            calibration="fixed",
            epsilon=privacy.epsilon,
            public_radius=privacy.public_radius,
            per_layer=privacy.per_layer,
        )
    if privacy.mechanism in ("gaussian", "sign"):
        cls = GaussianMechanism if privacy.mechanism == "gaussian" else StochasticSign
        return cls(
            clip=privacy.clip,
            clip_mode=privacy.clip_mode,
            epsilon=privacy.epsilon,
            delta=privacy.delta,
            planned_releases=privacy.planned_releases,
        )
    return NoMechanism()


def derive_rng(seed: int | None, *keys: int) -> np.random.Generator:
    """Return a generator for one purpose of one client in one round.

    ``seed=None`` gives OS entropy (the default: noise must not be predictable);
    a fixed seed is for experiments and makes every stream reproducible.
    """
    if seed is None:
        return np.random.default_rng()
    return np.random.default_rng(np.random.SeedSequence([seed, *keys]))


def spend_metrics(spend: Spend) -> dict[str, float | int]:
    """Return the public spend report of a client (see docs/ARCHITECTURE.md)."""
    return {
        "spend-d": float(spend.d_privacy),
        "spend-epsilon": float(spend.epsilon),
        "spend-delta": float(spend.delta),
        "releases": int(spend.releases),
        "declines": int(spend.declines),
    }


class GpflClient(NumPyClient):
    """Choose the best hypothesis, train it locally, sanitize, release.

    Parameters
    ----------
    task : Task
        The learning task (data, model, loss, local training).
    settings : ClientSettings
        Validated client settings (training, privacy, ledger path).
    """

    def __init__(self, task: Task, settings: ClientSettings) -> None:
        self.task = task
        self.settings = settings
        self.mechanism = build_mechanism(settings.privacy)
        # Opening the ledger reads (and validates) the file: a corrupt ledger
        # stops the client here, before it trains or releases anything.
        self.ledger = PrivacyLedger(settings.ledger_path, delta=settings.privacy.delta)

    def get_parameters(self, config: dict[str, Any]) -> Arrays:
        """Return nothing: the server initialises the hypotheses."""
        return []

    def _split(self, parameters: Arrays, config: dict[str, Any]) -> list[Arrays]:
        k = int(config.get("num-hypotheses", 1))
        if k < 1 or len(parameters) % k:
            raise ValueError(
                f"received {len(parameters)} arrays, not divisible into num-hypotheses={k}"
            )
        layers = len(parameters) // k
        return [list(parameters[j * layers:(j + 1) * layers]) for j in range(k)]

    def fit(
        self, parameters: Arrays, config: dict[str, Any]
    ) -> tuple[Arrays, int, dict[str, Any]]:
        """Train the best-fitting hypothesis and release it sanitized.

        Returns the released arrays, a constant sample count of 1 (the real
        count is not revealed) and public metrics; no cluster id is sent.
        A client whose next release would pass its cap declines: it returns
        no arrays and ``declined=1``.
        """
        s = self.settings
        server_round = int(config.get("server-round", 0))
        hypotheses = self._split(parameters, config)
        data = self.task.client_dataset(s.partition_id, s.num_partitions)
        losses = [self.task.loss(h, data) for h in hypotheses]
        best = int(np.argmin(losses))
        trained = self.task.train(
            hypotheses[best],
            data,
            epochs=s.local_epochs,
            learning_rate=s.learning_rate,
            batch_size=s.batch_size,
            rng=derive_rng(s.seed, s.partition_id, server_round, 0),
            device=s.device,
        )
        reference = hypotheses[best]
        event = self.mechanism.event(reference, trained)
        public = {k: float(v) for k, v in self.mechanism.public_metrics(reference, trained).items()}
        if s.privacy.mechanism == "laplace" and s.privacy.calibration == "neighbourhood":
            # Under the neighbourhood calibration σ is a function of ‖δ‖: declaring
            # it would publish ‖δ‖ exactly. Only data-independent σ are declared.
            public.pop("sigma", None)
        base: dict[str, Any] = {"mechanism": s.privacy.mechanism, "client-name": s.name, **public}
        try:
            # Charged (and on disk) before anything leaves the device.
            spend = self.ledger.charge(event, cap=s.privacy.cap, round=server_round)
        except BudgetExceededError as err:
            spend = self.ledger.record_decline()
            logger.warning("%s declines round %d: %s", s.name, server_round, err)
            return [], 1, {**base, "declined": 1, **spend_metrics(spend)}
        released = self.mechanism.sanitize(
            reference, trained, rng=derive_rng(s.seed, s.partition_id, server_round, 1)
        )
        return released, 1, {**base, "declined": 0, **spend_metrics(spend)}

    def evaluate(
        self, parameters: Arrays, config: dict[str, Any]
    ) -> tuple[float, int, dict[str, Any]]:
        """Loss of the best hypothesis on the local data (not used by default)."""
        hypotheses = self._split(parameters, config)
        data = self.task.client_dataset(self.settings.partition_id, self.settings.num_partitions)
        return float(min(self.task.loss(h, data) for h in hypotheses)), 1, {}
