"""Record-level releases (mechanism ``dpsgd``): plan and charge from public values, train, check.

The device trains its chosen hypothesis with DP-SGD (:mod:`tasks.dpsgd`) and releases the
model; the guarantee protects each of its records, under the relation the device declared
(``neighbouring``: add/remove, or replace-one at twice the sensitivity).

Order, as for the device-level mechanisms (:mod:`client.numpy_client`):

1. :func:`plan_record_release` (public values only): the event of the release, i.e. T
   Poisson-sampled steps at rate q with noise multiplier ν (the device's least or more), each
   strategy's extra query inside ν (:func:`mechanisms.record_clipping.split_noise`), and with
   k >= 2 hypotheses one report-noisy-min. A bad request is a
   :class:`~client.policy.PolicyDecline`.
2. The ledger charges the event (its own ``record`` family and cap) before data is read.
3. :func:`release_record`: choose the hypothesis by a report-noisy-min over the clipped
   per-record losses (each record's loss clipped to [0, L]; the vector of the k sums has L2
   sensitivity L·√k and gets N(0, (ν·L·√k)²) on every coordinate: a Gaussian query of noise
   multiplier ν, charged), train with DP-SGD, and check the release
   (:func:`verify_record_release`) before it leaves.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from client.policy import PolicyDecline
from client.settings import ClientSettings
from mechanisms import RecordLevelEvent
from mechanisms.grid import grid_spacing, on_grid
from mechanisms.invariant import ReleaseRefused, lower_tail_factor
from mechanisms.record_accounting import record_epsilon
from mechanisms.record_clipping import NoiseSplit, split_noise

__all__ = ["RecordPlan", "plan_record_release", "release_record", "verify_record_release"]

Arrays = list[np.ndarray]

#: No per-step noise σ = ν_g·C may exceed this (the release must stay finite in float32).
MAX_STEP_NOISE = 1e30


@dataclass(frozen=True)
class RecordPlan:
    """A record-level release decided from public values: its charge and how it is trained."""

    event: RecordLevelEvent
    split: NoiseSplit
    strategy: str
    metrics: dict[str, float] = field(default_factory=dict)


def plan_record_release(s: ClientSettings, hypotheses: Sequence[Arrays]) -> RecordPlan:
    """Return the release's plan, or decline (:class:`PolicyDecline`) before anything is read."""
    record = s.privacy.record
    if record is None:
        raise PolicyDecline("declined: mechanism dpsgd without its record-level settings")
    nu = record.noise_multiplier
    try:
        split = split_noise(record.clipping, nu, record.query_ratio)
    except ValueError as err:
        raise PolicyDecline(f"declined: the record-level request cannot be split: {err}") from None
    sigma = split.gradient * record.clip
    # OSO and quantile move C by a factor of at most exp(rate) per step.
    growth = math.exp(min(record.clip_rate * record.steps, 700.0))
    if not (sigma > 0.0 and math.isfinite(sigma)) or sigma * growth > MAX_STEP_NOISE:
        raise PolicyDecline(
            f"declined: with record-clip={record.clip!r}, record-noise-multiplier={nu!r} and "
            f"record-clip-rate={record.clip_rate!r} the step noise could reach "
            f"{sigma * growth:.3g}; nothing was computed")
    k = len(hypotheses)
    _check_grids(record, split, sigma, growth, k, sum(a.size for a in hypotheses[0]),
                 extra_query=record.clipping != "fixed")
    event = RecordLevelEvent(record.sampling_rate, nu, record.steps, record.relation,
                             nu if k >= 2 else 0.0)
    own = record_epsilon([event], s.privacy.ledger_delta)
    metrics = {
        "budget-epsilon": own, "budget-delta": s.privacy.ledger_delta,
        "sigma": sigma, "record-noise-multiplier": nu,
        "record-sampling-rate": record.sampling_rate, "record-steps": float(record.steps),
        "record-sensitivity": event.sensitivity_factor * record.clip,
    }
    return RecordPlan(event=event, split=split, strategy=record.clipping, metrics=metrics)


#: The least noise multiplier of a DP-SGD query that a float-safe release accepts: a noisy
#: sum of B clipped terms spans about 16·B/ν grid steps, which must stay far below 2^49 for a
#: batch of up to 2^29 records.
MIN_QUERY_NOISE_MULTIPLIER = 2.0**-15


def _check_grids(record: Any, split: NoiseSplit, sigma: float, growth: float, k: int,
                 dims: int, *, extra_query: bool) -> None:
    """Decline unless every noisy query of the release has a grid that fits (public values).

    The clip moves within a factor ``growth`` of its start either way; each query's noisy
    sum must be roundable exactly onto the grid of its σ (:mod:`mechanisms.grid`).
    """
    queries = [("record-clip", split.gradient, sigma / growth, dims),
               ("record-clip", split.gradient, sigma * growth, dims)]
    if extra_query:
        queries += [("record-noise-multiplier", split.secondary, split.secondary, 1),
                    ("record-noise-multiplier", split.secondary, split.secondary, dims)]
    if k >= 2:
        queries.append(("record-loss-clip", record.noise_multiplier,
                        record.noise_multiplier * record.loss_clip * math.sqrt(k), k))
    for name, multiplier, scale, size in queries:
        try:
            if multiplier < MIN_QUERY_NOISE_MULTIPLIER:
                raise ValueError(f"a query's noise multiplier {multiplier:.3g} is below "
                                 f"{MIN_QUERY_NOISE_MULTIPLIER:.3g}")
            grid_spacing(scale, size)
        except ValueError as err:
            raise PolicyDecline(f"declined: with {name}={getattr(record, _FIELDS[name])!r} no "
                                f"floating-point-safe release fits ({err}); nothing was "
                                "computed") from None


#: The record settings named in a decline, by setting name.
_FIELDS = {"record-noise-multiplier": "noise_multiplier", "record-loss-clip": "loss_clip",
           "record-clip": "clip"}


def choose_noisy_min(losses: np.ndarray, loss_clip: float, noise_multiplier: float,
                     rng: np.random.Generator) -> int:
    """Report-noisy-min over the k sums of per-record losses clipped to [0, ``loss_clip``].

    The vector of sums has add/remove L2 sensitivity ``loss_clip``·√k; each coordinate gets
    N(0, (ν·loss_clip·√k)²), a Gaussian query of noise multiplier ν (the argmin is
    post-processing). A non-finite loss counts as ``loss_clip``.
    """
    k = losses.shape[0]
    clipped = np.clip(np.nan_to_num(losses, nan=loss_clip, posinf=loss_clip), 0.0, loss_clip)
    sums = clipped.sum(axis=1)
    sigma = noise_multiplier * loss_clip * math.sqrt(k)
    # The exact noisy sums on the public grid of σ (mechanisms.grid); the argmin is
    # post-processing of them.
    noise = np.asarray(rng.standard_normal(k), dtype=np.float64) * sigma
    noisy = on_grid([sums, noise], grid_spacing(sigma, k))
    return int(np.argmin(noisy))


def release_record(
    task: Any, s: ClientSettings, plan: RecordPlan, hypotheses: list[Arrays], data: Any,
    rng: np.random.Generator, on_choice: Callable[[int], None] | None = None,
) -> tuple[Arrays, dict[str, float]]:
    """Choose (paid), train with DP-SGD, check; return the release and its public metrics.

    ``on_choice`` is told the index of the hypothesis trained from, for the device's own log
    (the release and its metrics do not carry it).
    """
    from tasks.dpsgd import RecordTraining, per_record_losses, train_record_level

    record = s.privacy.record
    assert record is not None
    best = 0
    if plan.event.selection_noise_multiplier > 0.0:
        losses = per_record_losses(task, hypotheses, data, device=s.device)
        best = choose_noisy_min(losses, record.loss_clip, plan.event.selection_noise_multiplier,
                                rng)
    if on_choice is not None:
        on_choice(best)
    training = RecordTraining(
        strategy=plan.strategy, split=plan.split, sampling_rate=record.sampling_rate,
        steps=record.steps, expected_batch=s.batch_size, clip=record.clip,
        learning_rate=s.learning_rate, target_quantile=record.target_quantile,
        clip_rate=record.clip_rate, lr_rate=record.lr_rate)
    released, trace = train_record_level(task, hypotheses[best], data, training, rng,
                                         device=s.device)
    verify_record_release(plan, trace, reference=hypotheses[best], released=released)
    metrics = {"record-clip-final": trace.clips[-1], "record-lr-final": trace.learning_rates[-1]}
    return released, metrics


def verify_record_release(plan: RecordPlan, trace: Any, *, reference: Arrays,
                          released: Arrays) -> None:
    """Refuse a record-level release that does not carry the noise its charge paid for.

    Independently of the trainer's arithmetic: the charged event is a record-level one with a
    positive, finite ν; the split's combined multiplier is at least ν (so the extra queries
    are inside the charge); exactly the charged number of steps ran; every step's gradient
    noise had σ >= ν_g·C_t for the C_t the trace reports, and an energy ‖noise‖² not below the
    1e-9 lower tail of σ²·χ²_n; the release has the model's shapes and is finite.

    Raises
    ------
    ReleaseRefused
    """
    event = plan.event
    if type(event) is not RecordLevelEvent:
        raise ReleaseRefused(f"{type(event).__name__} is not a record-level event")
    nu = event.noise_multiplier
    if not (nu > 0.0 and math.isfinite(nu)):
        raise ReleaseRefused(f"the charged noise multiplier is not positive and finite: {nu!r}")
    if not plan.split.combined(plan.strategy) >= nu * (1.0 - 1e-9):
        raise ReleaseRefused("the strategy's queries carry less noise than the charge paid for")
    steps = len(trace.noise_energy)
    if steps != event.steps or len(trace.clips) != steps + 1:
        raise ReleaseRefused(f"{steps} steps ran, {event.steps} were charged")
    n = int(trace.dimension)
    factor = lower_tail_factor(n / 2)
    for t in range(steps):
        needed = plan.split.gradient * trace.clips[t]
        sigma, energy = trace.noise_sigma[t], trace.noise_energy[t]
        if not (sigma >= needed * (1.0 - 1e-12) and energy >= factor * n * needed * needed):
            raise ReleaseRefused(f"step {t}: the gradient noise is below what its charge pays for")
    if len(released) != len(reference):
        raise ReleaseRefused(f"the release has {len(released)} layers, the model {len(reference)}")
    for i, (o, r) in enumerate(zip(released, reference, strict=True)):
        if o.shape != r.shape or not np.isfinite(o).all():
            raise ReleaseRefused(f"layer {i}: the release is not a finite {r.shape} array")
