"""Audit the record-level mode (mechanism ``dpsgd``): crafted canary records in or out.

Each release is made by the device's own record-level path: the settings are resolved from a
run config and a device policy (:meth:`client.settings.ClientSettings.resolve`, the policy's
``neighbouring`` included), :func:`client.record_release.plan_record_release` fixes the event
that a real :class:`~mechanisms.PrivacyLedger` charges, and
:func:`client.record_release.release_record` chooses (k = 2), trains with DP-SGD
(:func:`tasks.dpsgd.train_record_level`, Opacus's per-sample gradients, the device's noise) and
runs the release check. Only the data set and the model are the audit's:

* the model is a bias-free linear classifier of two classes (:class:`CanaryTask`) whose first
  ``BASE`` features are the ordinary records' and each further feature one *canary slot's*;
* canary i is the record x = X·e_i with label 0. With two classes and no bias, its gradient
  is X(1 − p₀)·(−1, 1) in column i of the weights and zero elsewhere: the direction
  w = (−1, 1)/√2 of that column, which no other record touches, and a norm X(1 − p₀)√2 far
  above C (X = 10⁴ and a step of 10⁻⁶ keep p₀ near ½), so clipping leaves exactly C·w.

So each step adds C (or 0) along the slot's direction plus N(0, (ν_g·C)²) noise on it, and
z = −(θ_T − θ_0)·w·m/(ρ·C) is Σ_t s·B_t + N(0, T·ν_g²), with B_t ~ Bernoulli(q) the
canary's Poisson sampling and s = 1 for the canary, 0 for its absence (add/remove) or −1 for
the replacement record (label 1, whose gradient points the other way: replace-one, the
worst case, a clipped sum moved by 2C). The test's score is the exact log-likelihood ratio of z
(monotone in z at q = 1). A release carries ``canaries`` slots, half with the canary and half
without (or with its replacement), drawn at random: the slots' directions are orthogonal and
the noise isotropic, so every slot is one independent trial of the one-record pair (each slot
sees the same law whatever the other slots hold); ``canaries = 1`` makes every release one
trial, at that many times the cost.

With k = 2 the device first picks a hypothesis by its report-noisy-min over clipped per-record
losses (charged as one more Gaussian query). One canary per release: its loss is 0 under
hypothesis A and L (the loss clip) under B, and a *tilt* record whose loss is L/2 under A and
0 under B makes the choice turn on the canary (sums A − B: +L/2 without it, −L/2 with it).
The release shows which hypothesis was trained, and the score is that choice (A: the canary
in); z is left out (under A the canary is fitted and adds nothing to it; the step is audited
at k = 1), so that the test is a single fixed set, {A}, whatever the noise of the choice.

The bound is :func:`experiments.audits.privacy_audit.epsilon_lower_bound` (Clopper–Pearson, the test
chosen on one half and counted on the other); the charge is the ledger's record-level ε at δ.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
from scipy import optimize, special, stats
from torch import nn

from client.policy import DevicePolicy
from client.record_release import RecordPlan, plan_record_release, release_record
from client.settings import ClientSettings
from experiments.audits.privacy_audit import AuditResult, _gdp_epsilon, epsilon_lower_bound
from mechanisms import PrivacyLedger
from mechanisms.record_clipping import NoiseSplit
from settings import federation_defaults
from tasks.base import Dataset, Params
from tasks.torch_support import TorchTask

__all__ = ["CanaryTask", "RecordScenario", "audit_record", "halved_noise", "record_charge",
           "replace_one_charged_as_add_remove", "uncharged_choice"]

#: Features of the ordinary records (the canary slots' follow).
BASE = 2
#: Ordinary records, present in every release (random features on the first BASE columns).
ORDINARY = 8
#: The canary's one feature value X and the step ρ/m: X(1 − p₀)√2 stays ≫ C while ρ·X moves
#: the canary's margin by about 1e-2·(C + noise) a step.
CANARY_X = 1e4
STEP = 1e-6
CLIP = 1.0
#: k = 2: the hypotheses' canary column (±HYPOTHESIS_WEIGHT) gives the canary a margin of
#: 2·X·0.005 = 100 either way: loss ≈ 0 under A, clipped to L under B.
HYPOTHESIS_WEIGHT = 0.005
_W = np.array([-1.0, 1.0]) / math.sqrt(2.0)


class CanaryTask(TorchTask):
    """A bias-free linear classifier of two classes over ``BASE + slots`` features."""

    name = "canary-audit"
    is_classifier = True

    def __init__(self, slots: int) -> None:
        self.slots = slots
        super().__init__(device="cpu")

    def model(self) -> nn.Module:
        """Build the linear map (no bias: a canary's gradient stays in its own column)."""
        return nn.Linear(BASE + self.slots, 2, bias=False)

    def client_dataset(self, partition_id: int, num_partitions: int) -> Dataset:
        """Refuse: the audit hands every release its data."""
        raise NotImplementedError("the canary task has data only through the audit")

    def validation_datasets(self) -> list[Dataset]:
        """Return no held-out users."""
        return []


@dataclass(frozen=True)
class RecordScenario:
    """One record-level audit: the device's relation and request, and the canaries' layout.

    ``relation`` is the device's ``neighbouring`` (the neighbouring pair audited is the same:
    canary in or out, or canary replaced); ``noise_multiplier`` ν, ``steps`` T and
    ``sampling_rate`` q are the request's; ``k`` is 1 or 2 hypotheses; ``canaries`` the
    slots per release (k = 1); ``delta`` the ledger's δ.
    """

    name: str
    relation: str
    noise_multiplier: float
    steps: int = 1
    sampling_rate: float = 1.0
    k: int = 1
    canaries: int = 100
    delta: float = 0.01

    @property
    def exact(self) -> float:
        """The law's own ε at δ (k = 1): closed form at q = 1, numerical at T = 1; else nan."""
        if self.k != 1:
            return math.nan
        shift = 2.0 if self.relation == "replace-one" else 1.0
        if self.sampling_rate == 1.0:
            return _gdp_epsilon(shift * math.sqrt(self.steps) / self.noise_multiplier,
                                self.delta)
        if self.steps == 1:
            return _mixture_epsilon(self.sampling_rate, self.noise_multiplier,
                                    -1.0 if self.relation == "replace-one" else 0.0, self.delta)
        return math.nan


def _mixture_epsilon(q: float, sigma: float, shift_a: float, delta: float) -> float:
    """ε at δ of one Poisson-sampled step: (1 − q)N(0, σ²) + qN(1, σ²) against shift_a.

    Both directions of the hockey-stick divergence, integrated on a fine grid.
    """
    z = np.linspace(-12 * sigma - 2, 12 * sigma + 2, 200_001)
    dz = float(z[1] - z[0])
    p = (1 - q) * stats.norm.pdf(z, 0, sigma) + q * stats.norm.pdf(z, 1, sigma)
    r = (1 - q) * stats.norm.pdf(z, 0, sigma) + q * stats.norm.pdf(z, shift_a, sigma)

    def gap(eps: float) -> float:
        return max(float(np.sum(np.maximum(0, p - math.exp(eps) * r))),
                   float(np.sum(np.maximum(0, r - math.exp(eps) * p)))) * dz - delta
    if gap(0.0) <= 0:
        return 0.0
    return float(optimize.brentq(gap, 0.0, 50.0))


def settings_of(scenario: RecordScenario, ledger_dir: str) -> ClientSettings:
    """Resolve the device's settings: the scenario's request under a device policy."""
    node = {"partition-id": 0, "num-partitions": 1, "ledger-dir": ledger_dir,
            "mechanisms": "dpsgd", "neighbouring": scenario.relation, "delta": scenario.delta,
            "record-noise-multiplier": scenario.noise_multiplier}
    run = {**federation_defaults(), "mechanism": "dpsgd", "record-clipping": "fixed",
           "record-sampling-rate": scenario.sampling_rate, "record-steps": scenario.steps,
           "record-noise-multiplier": scenario.noise_multiplier, "record-clip": CLIP,
           "learning-rate": STEP, "batch-size": 1, "num-hypotheses": scenario.k, "seed": 0}
    return ClientSettings.resolve(run, DevicePolicy.load(node, environ={}))


def record_charge(plan: RecordPlan, s: ClientSettings) -> float:
    """Return what a real ledger charges for the release: its record-level ε at its δ."""
    with tempfile.TemporaryDirectory() as folder:
        ledger = PrivacyLedger(Path(folder) / "ledger.json", delta=s.privacy.ledger_delta)
        return float(ledger.charge(plan.event, cap=None).record_epsilon)


def _hypotheses(scenario: RecordScenario, slots: int, loss: float) -> list[Params]:
    zero = np.zeros((2, BASE + slots), np.float32)
    if scenario.k == 1:
        return [[zero]]
    a, b = zero.copy(), zero.copy()
    # The tilt record (feature BASE + 1): loss L/2 under A, ≈ 0 under B.
    margin = -math.log(math.expm1(loss / 2))
    a[:, BASE + 1] = np.array([margin, -margin]) / (2 * CANARY_X)
    b[:, BASE + 1] = [HYPOTHESIS_WEIGHT, -HYPOTHESIS_WEIGHT]
    # The canary (feature BASE): fitted by A, loss clipped to L under B.
    a[:, BASE] = [HYPOTHESIS_WEIGHT, -HYPOTHESIS_WEIGHT]
    b[:, BASE] = [-HYPOTHESIS_WEIGHT, HYPOTHESIS_WEIGHT]
    return [[a], [b]]


def _ordinary(slots: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    x = np.zeros((ORDINARY, BASE + slots), np.float32)
    x[:, :BASE] = rng.standard_normal((ORDINARY, BASE))
    return x, rng.integers(0, 2, ORDINARY)


def _dataset(slots: int, inside: np.ndarray, replaced: np.ndarray, k: int,
             ordinary: tuple[np.ndarray, np.ndarray]) -> Dataset:
    """Ordinary records, the tilt (k = 2), then each slot's canary (label 0) or replacement."""
    rows, labels = [ordinary[0]], [ordinary[1]]
    if k == 2:
        tilt = np.zeros((1, BASE + slots), np.float32)
        tilt[0, BASE + 1] = CANARY_X
        rows.append(tilt)
        labels.append(np.zeros(1, np.int64))
    used = np.flatnonzero(inside | replaced)
    canaries = np.zeros((used.size, BASE + slots), np.float32)
    canaries[np.arange(used.size), BASE + used] = CANARY_X
    rows.append(canaries)
    labels.append(np.where(inside[used], 0, 1))
    x, y = np.concatenate(rows), np.concatenate(labels).astype(np.int64)
    return Dataset(x, y, np.zeros(y.size, np.int64), "audit")


def _projection(released: Params, start: Params, slots: np.ndarray) -> np.ndarray:
    """Return each slot's z: the step along its canary's direction, in units of C."""
    moved = np.asarray(released[0], np.float64) - np.asarray(start[0], np.float64)
    return -(_W @ moved[:, BASE + slots]) / (STEP * CLIP)


def _log_likelihood_ratio(z: np.ndarray, scenario: RecordScenario, sigma: float,
                          shift_a: float) -> np.ndarray:
    """Return log p_b(z)/p_a(z), z = s·Binomial(T, q) + N(0, T σ²), s = 1 (b) or shift_a (a).

    At q = 1 it is an increasing affine function of z, and z itself is returned (the same
    test).
    """
    t, q = scenario.steps, scenario.sampling_rate
    if q == 1.0:
        return z
    counts = np.arange(t + 1)
    log_p = stats.binom.logpmf(counts, t, q)[None, :]
    var = t * sigma ** 2
    zz = z[:, None]
    b = special.logsumexp(log_p - (zz - counts) ** 2 / (2 * var), axis=1)
    a = special.logsumexp(log_p - (zz - shift_a * counts) ** 2 / (2 * var), axis=1)
    return np.asarray(b - a)


def audit_record(scenario: RecordScenario, *, trials: int, confidence: float = 0.95,
                 seed: int = 0) -> AuditResult:
    """Run releases until each side has ``trials`` scores; bound ε; compare with the charge."""
    slots = 1 if scenario.k == 2 else scenario.canaries
    if scenario.k == 2 and scenario.relation != "add-remove":
        raise ValueError("the k = 2 audit is of add/remove neighbours")
    if slots % 2 and slots != 1:
        raise ValueError(f"canaries must be even (half in, half out), got {slots}")
    task = CanaryTask(slots + (1 if scenario.k == 2 else 0))
    width = task.slots
    rng = np.random.default_rng(np.random.SeedSequence([seed, 2]))
    noise = np.random.default_rng(np.random.SeedSequence([seed, 3]))
    ordinary = _ordinary(width, rng)
    with tempfile.TemporaryDirectory() as folder:
        s = settings_of(scenario, folder)
        record = s.privacy.record
        assert record is not None
        hypotheses = _hypotheses(scenario, width, record.loss_clip)
        plan = plan_record_release(s, hypotheses)
        charged = record_charge(plan, s)
        sigma = plan.split.gradient
        shift_a = -1.0 if scenario.relation == "replace-one" else 0.0
        scores: dict[bool, list[float]] = {True: [], False: []}
        while min(len(v) for v in scores.values()) < trials:
            if slots == 1:
                inside = np.array([len(scores[True]) <= len(scores[False])])
            else:
                inside = np.zeros(width, dtype=bool)
                inside[rng.permutation(width)[: width // 2]] = True
            replaced = ~inside if scenario.relation == "replace-one" else np.zeros_like(inside)
            data = _dataset(width, inside, replaced, scenario.k, ordinary)
            released, _ = release_record(task, s, plan, hypotheses, data, noise)
            index = np.arange(slots)
            if scenario.k == 2:
                # Which hypothesis was trained: the release stays within ~1e-6 of it.
                gaps = [abs(float(h[0][0, BASE + 1]) - float(released[0][0, BASE + 1]))
                        for h in hypotheses]
                scores[bool(inside[0])].append(1.0 if int(np.argmin(gaps)) == 0 else 0.0)
                continue
            z = _projection(released, hypotheses[0], index)
            llr = _log_likelihood_ratio(z, scenario, sigma, shift_a)
            for is_in, value in zip(inside, llr, strict=True):
                scores[bool(is_in)].append(float(value))
    # Unrounded: the releases are the device's own (every noisy query on its grid), and a test
    # that read their last bits would be a finding, not noise to hide.
    a, b = (np.asarray(scores[side][:trials], dtype=np.float64) for side in (False, True))
    split = np.random.default_rng(np.random.SeedSequence([seed, 1]))
    bound = epsilon_lower_bound(a, b, delta=scenario.delta, confidence=confidence, rng=split)
    return AuditResult(scenario.name, "dpsgd", f"at delta={scenario.delta:g}", charged,
                       scenario.exact, bound)


# -- the injected accounting errors the audit must catch (the regression test's) ----------------

@contextlib.contextmanager
def halved_noise() -> Iterator[None]:
    """Make DP-SGD draw half the noise its charge paid for (the release check switched off).

    The release check (:func:`client.record_release.verify_record_release`) refuses this
    release on its own; it is switched off so that the audit's power is what is measured.
    """
    from tasks import dpsgd

    train = dpsgd.train_record_level

    def halved(task: Any, params: Params, data: Dataset, training: Any, rng: Any,
               **kwargs: Any) -> Any:
        split = NoiseSplit(training.split.gradient / 2, training.split.secondary / 2)
        return train(task, params, data, dataclasses.replace(training, split=split), rng,
                     **kwargs)

    with mock.patch.object(dpsgd, "train_record_level", halved), \
            mock.patch("client.record_release.verify_record_release", lambda *a, **k: None):
        yield


@contextlib.contextmanager
def replace_one_charged_as_add_remove() -> Iterator[None]:
    """Make the ledger compose a replace-one release at ν, as if its sensitivity were C."""
    from mechanisms import RecordLevelEvent

    with mock.patch.object(RecordLevelEvent, "sensitivity_factor", property(lambda self: 1.0)):
        yield


@contextlib.contextmanager
def uncharged_choice() -> Iterator[None]:
    """Make the choice a plain argmin of the clipped losses, and leave it out of the charge."""
    from mechanisms import record_accounting

    event_of = record_accounting.record_dp_event

    def argmin(losses: np.ndarray, loss_clip: float, noise_multiplier: float,
               rng: np.random.Generator) -> int:
        return int(np.argmin(np.clip(losses, 0.0, loss_clip).sum(axis=1)))

    with mock.patch("client.record_release.choose_noisy_min", argmin), \
            mock.patch.object(record_accounting, "record_dp_event", lambda e: event_of(
                dataclasses.replace(e, selection_noise_multiplier=0.0))):
        yield
