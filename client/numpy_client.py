"""The gpfl NumPyClient: Algorithm 1's client side and Algorithm 2 (SanitizeUpdate).

Everything the server sends (the run config, the instruction, the hypotheses) is treated as
chosen by an adversary; the device's policy (:mod:`client.policy`) bounds what is done with it.
One ``fit``:

1. combine the run config's request with the policy; a forbidden request is declined before
   anything is computed (:class:`~client.policy.PolicyDecline`: nothing charged, a log line, and
   ``declined-by = "policy"`` in the reply);
2. check the instruction (k hypotheses of the task's shapes, finite float values no larger
   than the device's ``max-parameter``): a malformed one is refused with a clear error, nothing
   computed, charged or released;
3. choose the best hypothesis on the local data, train it, charge the release to the ledger
   (declining when the cap would be passed), sanitize with noise from the device's own entropy,
   reply with the release and public metrics only.

Nothing data-dependent leaves uncharged: ``evaluate`` answers nothing, and any failure in step 3
reaches the server as one fixed message (the details stay in the device's log).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np
from flwr.client import NumPyClient

from client.policy import DevicePolicy, PolicyDecline
from client.settings import ClientSettings, PrivacySettings
from mechanisms import (
    BudgetExceededError,
    EuclideanLaplace,
    GaussianMechanism,
    LedgerCorruptError,
    Mechanism,
    NoMechanism,
    PrivacyLedger,
    Spend,
    StochasticSign,
    device_rng,
    hypotheses_diameter,
    seeded_rng,
)
from tasks import Task

__all__ = ["RELEASE_FAILED", "GpflClient", "InstructionError", "ReleaseFailedError"]

logger = logging.getLogger(__name__)

Arrays = list[np.ndarray]

#: The only text a failure of the private part of a round sends to the server.
RELEASE_FAILED = (
    "gpfl: the device could not complete this round; the details are in the device's log"
)


class InstructionError(ValueError):
    """The server's instruction is malformed (public data only); nothing was computed."""


class ReleaseFailedError(RuntimeError):
    """A failure while private data was in use; its message is always :data:`RELEASE_FAILED`."""

    def __init__(self) -> None:
        super().__init__(RELEASE_FAILED)


def build_mechanism(privacy: PrivacySettings) -> Mechanism:
    """Make the mechanism the client's applied privacy settings name."""
    if privacy.mechanism == "laplace":
        if privacy.calibration == "neighbourhood":
            return EuclideanLaplace(
                calibration="neighbourhood",
                noise_multiplier=privacy.noise_multiplier,
                per_layer=privacy.per_layer,
            )
        return EuclideanLaplace(
            calibration="fixed",
            epsilon=privacy.d_epsilon,
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


def train_rng(seed: int | None, *keys: int) -> np.random.Generator:
    """Return the generator of local training (batch order); the run's seed fixes it.

    Training randomness is not privacy noise: the release's guarantee holds for any
    deterministic training, so the federation may fix it. The noise never uses it.
    """
    if seed is None:
        return np.random.default_rng()
    return np.random.default_rng(np.random.SeedSequence([seed, *keys]))


def spend_metrics(spend: Spend) -> dict[str, float | int]:
    """Return the public spend report: exact sums of the charged costs."""
    return {
        "spend-d": float(spend.d_privacy),
        "spend-epsilon": float(spend.epsilon),
        "spend-delta": float(spend.delta),
        "releases": int(spend.releases),
        "declines": int(spend.declines),
    }


def split_hypotheses(
    parameters: Arrays,
    config: dict[str, Any],
    shapes: list[tuple[int, ...]],
    max_abs: float = float("inf"),
) -> list[Arrays]:
    """Check the server's instruction and split it into k hypotheses of the task's shapes.

    Parameters
    ----------
    parameters : list of np.ndarray
        The k × L arrays the server sent.
    config : dict
        The instruction's config (``num-hypotheses``).
    shapes : list of tuple of int
        The task's layer shapes.
    max_abs : float
        The largest magnitude a value may have (the device's ``max-parameter``).

    Raises
    ------
    InstructionError
        A count that does not divide into ``num-hypotheses``, a shape that is not the task's,
        a non-float dtype, a non-finite value or one beyond ``max_abs`` (the message holds
        public values only).
    """
    k = config.get("num-hypotheses", 1)
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise InstructionError(f"num-hypotheses must be an integer >= 1, got {k!r}")
    layers = len(shapes)
    if len(parameters) != k * layers:
        raise InstructionError(
            f"expected num-hypotheses={k} x {layers} arrays, got {len(parameters)} arrays"
        )
    hypotheses = []
    for j in range(k):
        arrays = parameters[j * layers:(j + 1) * layers]
        for i, (array, shape) in enumerate(zip(arrays, shapes, strict=True)):
            if not isinstance(array, np.ndarray) or array.shape != tuple(shape):
                got = getattr(array, "shape", type(array).__name__)
                raise InstructionError(
                    f"hypothesis {j}, layer {i}: expected shape {tuple(shape)}, got {got}"
                )
            if not np.issubdtype(array.dtype, np.floating):
                raise InstructionError(
                    f"hypothesis {j}, layer {i}: expected floating-point values, got {array.dtype}"
                )
            if not np.isfinite(array).all():
                raise InstructionError(f"hypothesis {j}, layer {i}: non-finite values")
            largest = float(np.abs(array).max()) if array.size else 0.0
            if largest > max_abs:
                raise InstructionError(
                    f"hypothesis {j}, layer {i}: a value of magnitude {largest:.3g} is beyond "
                    f"this device's max-parameter={max_abs:g}"
                )
        hypotheses.append(list(arrays))
    return hypotheses


class GpflClient(NumPyClient):
    """Choose the best hypothesis, train it locally, sanitize, release.

    Parameters
    ----------
    task : Task or callable
        The learning task (data, model, loss, local training), or a function that builds it.
    run_config : dict
        The run config as the server sent it (a request).
    policy : DevicePolicy
        The device's own settings and bounds.
    """

    def __init__(self, task: Task | Callable[[], Task], run_config: dict[str, Any],
                 policy: DevicePolicy) -> None:
        # A factory is called on first use, after the policy accepted the run: a declined run
        # builds no task, so no plugin code runs and no data is read.
        self._task = task
        self.run_config = run_config
        self.policy = policy

    @property
    def task(self) -> Task:
        """The learning task, built on first use when given as a factory."""
        if not isinstance(self._task, Task):
            self._task = self._task()
        return self._task

    def get_parameters(self, config: dict[str, Any]) -> Arrays:
        """Return nothing: the server initialises the hypotheses."""
        return []

    def _decline(self, reason: str, by: str, spend: Spend | None) -> tuple[Arrays, int, dict]:
        metrics: dict[str, Any] = {
            "client-name": self.policy.client_name,
            "declined": 1,
            "declined-by": by,
            "decline-reason": reason,
        }
        if spend is not None:
            metrics.update(spend_metrics(spend))
        return [], 1, metrics

    def fit(
        self, parameters: Arrays, config: dict[str, Any]
    ) -> tuple[Arrays, int, dict[str, Any]]:
        """Train the best-fitting hypothesis and release it sanitized.

        Returns the released arrays, a constant sample count of 1 (the real count is not
        revealed) and public metrics; no cluster id is sent. A request the policy forbids, or
        a release that would pass the cap, is declined: no arrays and ``declined=1``.
        """
        try:
            s = ClientSettings.resolve(self.run_config, self.policy)
        except PolicyDecline as decline:
            logger.warning("%s declines: %s", self.policy.client_name, decline)
            return self._decline(str(decline), "policy", None)
        server_round = config.get("server-round", 0)
        if isinstance(server_round, bool) or not isinstance(server_round, int) or server_round < 0:
            raise InstructionError(f"server-round must be an integer >= 0, got {server_round!r}")
        hypotheses = split_hypotheses(parameters, config, self.task.parameter_shapes,
                                      max_abs=float(self.policy["max-parameter"]))
        try:
            # Opening the ledger reads and validates it: a corrupt or vanished ledger stops
            # the client here, before it trains or releases anything.
            ledger = PrivacyLedger(s.ledger_path, delta=s.privacy.ledger_delta)
        except LedgerCorruptError:
            logger.exception("%s: the privacy ledger is unusable; nothing is released", s.name)
            raise ReleaseFailedError() from None
        try:
            return self._release(s, ledger, hypotheses, server_round)
        except ReleaseFailedError:
            raise
        except Exception:
            # Private data was in use: the text of any error could carry it. The device keeps
            # the details; the server learns only that the round failed.
            logger.exception("%s: round %d failed", s.name, server_round)
            raise ReleaseFailedError() from None

    def _release(
        self, s: ClientSettings, ledger: PrivacyLedger, hypotheses: list[Arrays],
        server_round: int,
    ) -> tuple[Arrays, int, dict[str, Any]]:
        mechanism = build_mechanism(s.privacy)
        data = self.task.client_dataset(s.partition_id, s.num_partitions)
        losses = [self.task.loss(h, data) for h in hypotheses]
        best = int(np.argmin(losses))
        trained = self.task.train(
            hypotheses[best],
            data,
            epochs=s.local_epochs,
            learning_rate=s.learning_rate,
            batch_size=s.batch_size,
            rng=train_rng(s.train_seed, s.partition_id, server_round),
            device=s.device,
        )
        reference = hypotheses[best]
        # The release is centred on a hypothesis chosen with private data: mechanisms whose
        # guarantee depends on it (Gaussian) calibrate to the hypotheses' public spread.
        spread = hypotheses_diameter(hypotheses)
        event = mechanism.event(reference, trained)
        public = {
            k: float(v)
            for k, v in mechanism.public_metrics(reference, trained, spread=spread).items()
        }
        if s.privacy.mechanism == "laplace" and s.privacy.calibration == "neighbourhood":
            # Under the neighbourhood calibration σ is a function of ‖δ‖: declaring it would
            # publish ‖δ‖ exactly. Only data-independent σ are declared.
            public.pop("sigma", None)
        base: dict[str, Any] = {"mechanism": s.privacy.mechanism, "client-name": s.name, **public}
        try:
            # Charged (and on disk) before anything leaves the device.
            spend = ledger.charge(event, cap=s.privacy.cap(event.family), round=server_round)
        except BudgetExceededError as err:
            spend = ledger.record_decline()
            logger.warning("%s declines round %d: %s", s.name, server_round, err)
            reason = f"the next release would pass this device's {event.family} cap"
            _, _, metrics = self._decline(reason, "budget", spend)
            return [], 1, {**base, **metrics}
        if s.noise_seed is None:
            rng = device_rng()
        else:
            # Opted in by the device (experiments): keyed by the device's own release count,
            # never by anything the server chose.
            rng = seeded_rng(s.noise_seed, s.partition_id, spend.releases)
        released = mechanism.sanitize(reference, trained, rng=rng, spread=spread)
        return released, 1, {**base, "declined": 0, **spend_metrics(spend)}

    def evaluate(
        self, parameters: Arrays, config: dict[str, Any]
    ) -> tuple[float, int, dict[str, Any]]:
        """Answer nothing data-dependent: a local loss would leave the device uncharged.

        The server validates on its own held-out users; a federated evaluation would need a
        privatized, charged statistic, which gpfl does not offer.
        """
        logger.info("%s: evaluate refused (a local loss is private)", self.policy.client_name)
        return 0.0, 0, {"client-name": self.policy.client_name, "refused": 1}
