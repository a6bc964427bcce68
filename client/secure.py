"""Secure clusters on the device: SecAgg+ with a cohort check, and the share a device sends.

With ``aggregation-privacy = "secure-clusters"`` a round is Flower's SecAgg+ protocol: four
messages (setup, share keys, collect masked vectors, unmask), handled by Flower's own
``secaggplus_mod``. :func:`secure_clusters_mod` wraps it in the device's rules:

* **Setup.** The device declines (an error reply: for the protocol, a dropout; nothing charged)
  unless the round's cohort and SecAgg+'s reconstruction threshold both reach its
  ``min-cohort``, every weight is 1 (``max_weight``; each device counts once) and the announced
  quantization and clipping ranges encode its integers exactly
  (:class:`mechanisms.distributed.SecureTerms`).
* **Collect masked vectors.** The device declines unless at least ``min-cohort`` − 1 other
  devices sent it key shares: its masked vector is summed with theirs only. Then its client
  (:class:`client.numpy_client.GpflClient`) runs the round with the terms the mod stored
  (:data:`ROUND_RECORD`): it charges the ledger, trains and returns its share
  (:func:`make_share`), which ``secaggplus_mod`` quantizes (exactly), masks and sends.
* A training message that does not come through SecAgg+ reaches the client without the terms:
  a run that asks for secure clusters is then declined, nothing is released in the clear.

What the server learns of a device in this mode: that it took part in each stage, its public
metrics (spend in this federation, mechanism parameters), and the masked vector, which alone is
uniformly random; with the masks removed, the sum. docs/TRUST.md says what each guarantee
assumes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, Context, Message
from flwr.app.message_type import MessageType
from flwr.client.mod import secaggplus_mod
from flwr.clientapp.typing import ClientAppCallable
from flwr.common.secure_aggregation.secaggplus_constants import (
    RECORD_KEY_CONFIGS,
    RECORD_KEY_STATE,
    Key,
    Stage,
)

from client.policy import DevicePolicy, PolicyDecline
from client.settings import ClientSettings
from mechanisms import calibrate_gaussian_noise_multiplier, clip_l2
from mechanisms.distributed import (
    SecureTerms,
    SecureTermsError,
    SlotLayout,
    bounded_rounding,
    central_noise_multiplier,
    discrete_gaussian,
    encode,
    local_noise_multiplier,
    slot_signal,
    verify_share,
)
from mechanisms.events import DistributedGaussianEvent

__all__ = ["ROUND_RECORD", "SecureDecline", "SecurePlan", "make_share", "plan_share",
           "round_terms", "secure_clusters_mod"]

logger = logging.getLogger(__name__)

#: The context record where the mod leaves a collect stage's terms for the client (removed
#: once the stage is answered).
ROUND_RECORD = "gpfl-secure-round"


class SecureDecline(RuntimeError):
    """A device declines a SecAgg+ stage: the error reply makes it a dropout of the round."""


def round_terms(context: Context) -> SecureTerms | None:
    """Return the SecAgg+ terms the mod stored for this message, or None (not through SecAgg+)."""
    record = context.state.config_records.get(ROUND_RECORD)
    if record is None:
        return None
    return SecureTerms(_int(record, "target-range"), _float(record, "clipping-range"),
                       _int(record, "mod-range"))


def _int(record: ConfigRecord, key: str) -> int:
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise SecureDecline(f"declined: SecAgg+'s {key} must be an integer, got {value!r}")
    return value


def _float(record: ConfigRecord, key: str) -> float:
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SecureDecline(f"declined: SecAgg+'s {key} must be a number, got {value!r}")
    return float(value)


def _min_cohort(ctxt: Context) -> int:
    policy = DevicePolicy.load(ctxt.node_config)
    try:
        return ClientSettings.resolve(dict(ctxt.run_config), policy).min_cohort
    except PolicyDecline as decline:
        raise SecureDecline(str(decline)) from None


def _check_setup(configs: ConfigRecord, min_cohort: int) -> None:
    sample = _int(configs, Key.SAMPLE_NUMBER)
    threshold = _int(configs, Key.THRESHOLD)
    if sample < min_cohort or threshold < min_cohort:
        raise SecureDecline(
            f"declined: a secure sum of {sample} devices with SecAgg+ threshold {threshold}; "
            f"this device needs min-cohort={min_cohort} for both")
    if _float(configs, Key.MAX_WEIGHT) != 1.0:
        raise SecureDecline(
            f"declined: SecAgg+ max_weight={configs[Key.MAX_WEIGHT]!r}; every device of a "
            "secure cluster sum counts once (max_weight=1)")
    try:
        SecureTerms(_int(configs, Key.TARGET_RANGE), _float(configs, Key.CLIPPING_RANGE),
                    _int(configs, Key.MOD_RANGE))
    except SecureTermsError as err:
        raise SecureDecline(f"declined: {err}") from None


def secure_clusters_mod(msg: Message, ctxt: Context, call_next: ClientAppCallable) -> Message:
    """Route a SecAgg+ training message through Flower's mod with the device's cohort rules."""
    ctxt.state.config_records.pop(ROUND_RECORD, None)
    if (msg.metadata.message_type != MessageType.TRAIN
            or RECORD_KEY_CONFIGS not in msg.content.config_records):
        return call_next(msg, ctxt)
    try:
        _check_stage(msg, ctxt)
    except SecureDecline as decline:
        # The device's own line: a decline here is before anything is computed or charged.
        logger.warning("gpfl device: run %s: declines a SecAgg+ stage (%s); nothing charged",
                       ctxt.run_id, decline)
        raise
    try:
        return secaggplus_mod(msg, ctxt, call_next)
    finally:
        ctxt.state.config_records.pop(ROUND_RECORD, None)


def _check_stage(msg: Message, ctxt: Context) -> None:
    """Apply the device's rules to a SecAgg+ stage; at the collect stage, store its terms."""
    configs = msg.content.config_records[RECORD_KEY_CONFIGS]
    stage = configs.get(Key.STAGE)
    if stage == Stage.SETUP:
        _check_setup(configs, _min_cohort(ctxt))
    elif stage == Stage.COLLECT_MASKED_VECTORS:
        sources = configs.get(Key.SOURCE_LIST, [])
        participants = (len(set(sources)) if isinstance(sources, list) else 0) + 1
        min_cohort = _min_cohort(ctxt)
        if participants < min_cohort:
            raise SecureDecline(
                f"declined: {participants} devices exchanged keys with this one (itself "
                f"included); min-cohort={min_cohort}")
        state = ctxt.state.config_records.get(RECORD_KEY_STATE)
        if state is None:
            raise SecureDecline("declined: a masked vector asked for before the SecAgg+ setup")
        ctxt.state.config_records[ROUND_RECORD] = ConfigRecord({
            "target-range": _int(state, "target_range"),
            "clipping-range": _float(state, "clipping_range"),
            "mod-range": _int(state, "mod_range"),
        })


@dataclass(frozen=True)
class SecurePlan:
    """A secure round's public decisions: the event charged, σ, the layout and the terms."""

    event: DistributedGaussianEvent
    sigma: float
    layout: SlotLayout
    terms: SecureTerms
    clip: float
    metrics: dict[str, Any]


def plan_share(s: ClientSettings, hypotheses: list[list[np.ndarray]],
               terms: SecureTerms) -> SecurePlan:
    """Return the share's plan from public values: the run's (ε, δ), k, the model's size.

    σ = z·2B with z the Gaussian calibration of the run's (ε, δ) over its planned releases:
    one device's vector alone is then exactly as private as today's Gaussian release (the
    local floor), and the sum of ``min-cohort`` shares is far more (the central guarantee).
    """
    p = s.privacy
    z = calibrate_gaussian_noise_multiplier(p.epsilon, p.delta, p.planned_releases)
    bound = terms.bound
    layout = SlotLayout(len(hypotheses), sum(int(np.size(a)) for a in hypotheses[0]))
    sigma = z * 2.0 * bound
    central = central_noise_multiplier(sigma, bound, s.min_cohort, layout.dimension)
    event = DistributedGaussianEvent(local_noise_multiplier(sigma, bound),
                                     central_noise_multiplier=central, cohort=s.min_cohort)
    metrics = {"noise-multiplier": event.noise_multiplier,
               "central-noise-multiplier": central, "min-cohort": s.min_cohort,
               "clip": p.clip}
    return SecurePlan(event, sigma, layout, terms, p.clip, metrics)


def make_share(plan: SecurePlan, reference: list[np.ndarray], updated: list[np.ndarray],
               slot: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Return the one float64 array the device hands to SecAgg+ (its share, encoded).

    The update (model minus the picked hypothesis) is clipped to ``clip`` in L2, rounded to
    integers of norm at most B, put in ``slot`` with the count B, and the discrete Gaussian
    share is added; :func:`mechanisms.distributed.verify_share` checks the result against the
    charge before it is encoded.
    """
    delta = [np.asarray(u, dtype=np.float64) - np.asarray(r, dtype=np.float64)
             for u, r in zip(updated, reference, strict=True)]
    clipped = np.concatenate([a.ravel() for a in clip_l2(delta, plan.clip)])
    bound = plan.terms.bound
    q = bounded_rounding(clipped, plan.clip, bound, rng)
    signal = slot_signal(q, slot, plan.layout, bound)
    share = signal + discrete_gaussian(plan.sigma, plan.layout.dimension)
    verify_share(plan.event, signal, share, layout=plan.layout, bound=bound)
    return [encode(share, plan.terms)]
