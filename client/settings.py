"""What one client applies: the run config's request, bounded by the device's policy.

The run config is written by whoever starts the run, which local privacy treats as the adversary:
here it only *asks*. :meth:`ClientSettings.resolve` reads the request leniently (keys that are
not the federation's are ignored and logged), then applies the stricter of request and device
bound to every shared setting (:mod:`settings.schema`), and refuses a request the policy forbids
with :class:`~client.policy.PolicyDecline` before anything is computed.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from client.policy import DevicePolicy, PolicyDecline
from settings import SETTINGS, SettingError, check_run_config
from settings.extras import extras_for_device, missing_modules
from settings.rules import check_secure_clusters

__all__ = ["ClientSettings", "PrivacySettings"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PrivacySettings:
    """The mechanism and budget one client applies (request and policy combined).

    Attributes
    ----------
    mechanism, calibration : str
        The requested mechanism (allowed by the policy) and Laplace calibration.
    noise_multiplier, d_epsilon, public_radius : float
        Laplace: ν (neighbourhood), ε per unit distance and the radius charged (fixed).
    least_radius : float
        Laplace neighbourhood: the device's least protected radius (noise ≥ ν·least_radius).
    per_layer : bool
        Laplace: one noise vector per layer.
    epsilon, delta : float
        Gaussian/sign: the (ε, δ) target the planned releases are calibrated to.
    ledger_delta : float
        The device's δ: its ledger composes Gaussian and sign releases into ε at this δ.
    clip, clip_mode, planned_releases
        Gaussian/sign clipping and calibration.
    cap_d_privacy, cap_epsilon : float
        The caps, each in its family's unit (Σ ε·r; the ε charged, min of RDP's and
        PLD's, at ``ledger_delta``).
    cap_record_epsilon : float
        The cap of the record-level family (dpsgd): RDP ε at ``ledger_delta``, its own unit.
    record : RecordSettings or None
        The record-level request as applied (mechanism ``dpsgd``), else ``None``.
    """

    mechanism: str
    calibration: str
    noise_multiplier: float
    d_epsilon: float
    public_radius: float
    least_radius: float
    per_layer: bool
    epsilon: float
    delta: float
    ledger_delta: float
    clip: float
    clip_mode: str
    planned_releases: int
    cap_d_privacy: float
    cap_epsilon: float
    cap_record_epsilon: float = 0.0
    record: RecordSettings | None = None

    def cap(self, family: str) -> float | None:
        """Return the cap of an event family (d-privacy, rdp, record; none has none)."""
        if family == "d-privacy":
            return self.cap_d_privacy
        if family == "rdp":
            return self.cap_epsilon
        if family == "record":
            return self.cap_record_epsilon
        return None


@dataclass(frozen=True)
class RecordSettings:
    """What a record-level (dpsgd) release applies: the request, bounded by the policy.

    ``noise_multiplier`` is the larger of the request and the device's least; ``relation`` is
    the device's own (``neighbouring``); the rest are the request's public values.
    """

    clipping: str
    sampling_rate: float
    steps: int
    noise_multiplier: float
    clip: float
    target_quantile: float
    clip_rate: float
    lr_rate: float
    query_ratio: float
    loss_clip: float
    relation: str


@dataclass(frozen=True)
class ClientSettings:
    """Everything a client applies in one round, validated."""

    local_epochs: int
    learning_rate: float
    batch_size: int
    privacy: PrivacySettings
    ledger_path: Path
    train_seed: int | None
    noise_seed: int | None
    device: str
    max_parameter: float
    max_hypotheses: int
    max_instruction_values: int
    partition_id: int
    num_partitions: int
    name: str
    #: ``secure-clusters``: the round's release is a share of a SecAgg+ sum (client.secure).
    aggregation_privacy: str = "per-device"
    #: The fewest devices a secure sum may hold: the larger of the request and the device's.
    min_cohort: int = 3

    @property
    def secure(self) -> bool:
        """Whether the run asks for secure clusters (per-cluster sums through SecAgg+)."""
        return self.aggregation_privacy == "secure-clusters"

    @classmethod
    def resolve(cls, run_config: Mapping[str, Any], policy: DevicePolicy) -> ClientSettings:
        """Combine the run config's request with the device's policy.

        Raises
        ------
        PolicyDecline
            The request is invalid or forbidden by the policy (the message names the setting,
            the value and the policy's rule; it holds no private data).
        """
        ignored = sorted(k for k in run_config if SETTINGS.get(k) is not None
                         and SETTINGS[k].owner == "device")
        if ignored:
            logger.warning("ignoring device settings in the run config (only the device sets "
                           "them): %s", ", ".join(ignored))
        try:
            request = check_run_config(run_config, ignore_foreign=True)
        except SettingError as err:
            raise PolicyDecline(f"invalid request: {err}") from None
        if policy.partition_id >= policy.num_partitions:
            raise PolicyDecline(
                f"partition-id must be < num-partitions, got partition-id={policy.partition_id}, "
                f"num-partitions={policy.num_partitions}"
            )
        # Before anything else of the task: a task the device does not serve is never built,
        # so none of its code runs and none of its data is read.
        policy.check_task(request["task"])
        mechanism = request["mechanism"]
        if mechanism not in policy.mechanisms:
            raise PolicyDecline(
                f"declined by policy: mechanism={mechanism!r} is not among this device's "
                f"mechanisms ({','.join(policy.mechanisms)})"
            )
        # An optional part this device lacks (Opacus for dpsgd, pandas for tabular): declined
        # before the task is built. A fact of the installation, the same whatever the data.
        for extra, feature, _ in extras_for_device(request):
            if missing_modules(extra):
                raise PolicyDecline(f"declined: {feature} needs the optional part gpfl[{extra}], "
                                    "which this device does not have")
        per_client = request["client-epsilons"]
        if per_client:
            # Personalized budgets where node configs cannot be given (the Simulation
            # Engine): partition p asks for the (p mod len)-th value.
            values = [float(v) for v in per_client.split(",")]
            request["epsilon"] = values[policy.partition_id % len(values)]

        def applied(name: str) -> Any:
            return SETTINGS[name].combine(request[name], policy.bound(name))

        planned = request["planned-releases"] or request["num-rounds"]
        privacy = PrivacySettings(
            mechanism=mechanism,
            calibration=request["calibration"],
            noise_multiplier=applied("noise-multiplier"),
            d_epsilon=applied("d-epsilon"),
            public_radius=applied("public-radius"),
            least_radius=float(policy["least-radius"]),
            per_layer=request["per-layer"],
            epsilon=applied("epsilon"),
            delta=applied("delta"),
            ledger_delta=policy.bound("delta"),
            clip=request["clip"],
            clip_mode=request["clip-mode"],
            planned_releases=planned,
            cap_d_privacy=applied("cap-d-privacy"),
            cap_epsilon=applied("cap-epsilon"),
            cap_record_epsilon=applied("cap-record-epsilon"),
            record=RecordSettings(
                clipping=request["record-clipping"],
                sampling_rate=request["record-sampling-rate"],
                steps=request["record-steps"],
                noise_multiplier=applied("record-noise-multiplier"),
                clip=request["record-clip"],
                target_quantile=request["record-target-quantile"],
                clip_rate=request["record-clip-rate"],
                lr_rate=request["record-lr-rate"],
                query_ratio=request["record-query-ratio"],
                loss_clip=request["record-loss-clip"],
                relation=str(policy["neighbouring"]),
            ) if mechanism == "dpsgd" else None,
        )
        if request["aggregation-privacy"] == "secure-clusters":
            try:
                # A Gaussian share, one slot mean per cluster: what the run may not change.
                check_secure_clusters(request)
            except SettingError as err:
                raise PolicyDecline(f"invalid request: {err}") from None
            # Every device's share must be the run's σ (the central guarantee sums m equal
            # discrete Gaussians): a device whose own bound is stricter cannot take part.
            for name in ("epsilon", "delta"):
                if applied(name) != request[name]:
                    raise PolicyDecline(
                        f"declined by policy: secure-clusters adds the run's noise share on "
                        f"every device, and this device's {name} bound "
                        f"({policy.bound(name)!r}) is stricter than the run's {name}="
                        f"{request[name]!r}")
        seed = request["seed"]
        return cls(
            local_epochs=request["local-epochs"],
            learning_rate=request["learning-rate"],
            batch_size=request["batch-size"],
            privacy=privacy,
            ledger_path=policy.ledger_path,
            train_seed=seed if seed >= 0 else None,
            noise_seed=policy.noise_seed,
            device=str(policy["device"]),
            max_parameter=float(policy["max-parameter"]),
            max_hypotheses=int(policy["max-hypotheses"]),
            max_instruction_values=int(policy["max-instruction-values"]),
            partition_id=policy.partition_id,
            num_partitions=policy.num_partitions,
            name=policy.client_name,
            aggregation_privacy=request["aggregation-privacy"],
            min_cohort=int(applied("min-cohort")),
        )
