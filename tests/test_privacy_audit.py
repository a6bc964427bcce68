"""The privacy regression test: no mechanism may be shown to leak more than its ledger charges.

Each audit makes every release of the real mechanism object through the device's own path,
`client.release.make_release` (the exact release on its public grid, the float32 cast, the
release invariant), on two neighbouring inputs (`experiments.audits.privacy_audit`), bounds ε from
below with a likelihood-ratio threshold test chosen on one half of the releases and counted on
the other, with Clopper–Pearson bounds at 95 % confidence, and compares the bound with what a
real `mechanisms.PrivacyLedger` charges. The scores are not rounded: the test may read any bit
of what leaves the device (tests/test_lowbit_audit.py reads the bits themselves).

Sample sizes and false-positive rates (the audits are seeded, so each outcome is fixed; the
rates say how likely a different seed or RNG stream is to fail a correct mechanism):

* Euclidean Laplace, 4,000 releases per input (2,000 counted): the law meets its guarantee
  exactly in one dimension, so a correct mechanism fails with probability at most 5 % by
  construction (the Clopper–Pearson coverage); `python -m experiments empirical-privacy --quick`
  measures it over fresh seeds: 0 of 100 (fixed) and 1 of 100 (neighbourhood) exceeded the
  charge (docs/RESULTS.md, "Empirical privacy").
* Gaussian and sign at δ = 0.01, 20,000 releases per input, calibrated by RDP to ε = 1: the
  charge is PLD's ε, the Gaussian law's exact 0.81 to within discretisation (the sign's own exact
  ε is 0.35), so for the Gaussian, as for Laplace, a correct mechanism fails with probability at
  most 5 % by construction (under RDP's charge of 1.0 it needed the test to overshoot the truth by
  0.19); for the sign far below 5 %.
* DP-SGD (`experiments.audits.record_audit`: the device's own record-level path on crafted canary
  records, q = 1, T = 1, ν = 1, δ = 0.01), 10,000 canary slots per input (100 releases of 100
  slots): the charge is 2.75 (add/remove) or 6.93 (replace-one) against the law's exact 2.32 and
  6.00, and the seeded bounds are 1.62 and 3.83. A correct trainer fails it with probability far
  below 5 % (it would need the test to overshoot the exact ε by 0.43); over fresh seeds
  `empirical-privacy --quick` measured it: 0 of 100 exceeded the charge. k = 2 (200 releases of
  one canary whose loss decides the choice): charge 4.34, bound 0.30.

The second half of the file injects the errors the test exists for (a halved noise scale, a
hypothesis choice left out of σ, an unclipped update, each with the release invariant switched
off, `experiments.audits.privacy_audit.release_check_off`, since it refuses some of them itself; for
DP-SGD a halved noise multiplier, a replace-one release charged as add/remove, and a choice made
without noise and not charged: bounds 3.83, 3.83 and 3.27 against a charge of 2.75) and
requires the audit to catch each, so
that the detector cannot silently lose its power. Over fresh seeds the same experiment caught
the halved noise in 50 of 50 repeats for each of Gaussian, Laplace fixed and neighbourhood, and
the two DP-SGD errors of a noise-multiplier kind in 50 of 50 each (the uncharged choice is caught
by construction: with the choice noiseless, the test separates the two inputs perfectly).
δ = 0.01 is used rather than the default 1e-5 because the test's power comes
from the tails: at δ = 1e-5 catching a halved σ needs about ten times the releases
(`python -m experiments empirical-privacy` shows it with 200,000).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from experiments.audits import privacy_audit as pa
from experiments.audits import record_audit as ra
from mechanisms import GaussianMechanism, RecordLevelEvent
from mechanisms import laplace as laplace_module
from mechanisms.gaussian import _ClippedGaussianBase
from mechanisms.invariant import ReleaseRefused
from mechanisms.record_accounting import record_epsilon
from mechanisms.record_clipping import NoiseSplit

DELTA = 0.01
LAPLACE_TRIALS = 4_000
GAUSSIAN_TRIALS = 20_000


def scenarios() -> list[Any]:
    cases = [
        (pa.laplace_fixed(1.0), LAPLACE_TRIALS),
        (pa.laplace_neighbourhood(1.0), LAPLACE_TRIALS),
        (pa.gaussian(1.0, delta=DELTA, k=1), GAUSSIAN_TRIALS),
        (pa.gaussian(1.0, delta=DELTA, k=2), GAUSSIAN_TRIALS),
        (pa.sign(1.0, delta=DELTA, k=1), GAUSSIAN_TRIALS),
        (pa.sign(1.0, delta=DELTA, k=2), GAUSSIAN_TRIALS),
    ]
    return [pytest.param(scenario, trials, id=scenario.name) for scenario, trials in cases]


@pytest.mark.parametrize(("scenario", "trials"), scenarios())
def test_no_mechanism_is_shown_to_leak_more_than_its_ledger_charges(
    scenario: pa.Scenario, trials: int
) -> None:
    result = pa.audit(scenario, trials=trials, confidence=0.95, seed=1)

    # Laplace: ε = 1 (per unit of distance). Gaussian and sign: calibrated to ε = 1 by RDP, and
    # charged PLD's ε, the exact 0.810 of one Gaussian release to within discretisation.
    laplace = scenario.name.startswith("laplace")
    assert result.charged == pytest.approx(1.0 if laplace else 0.8102, rel=1e-3)
    assert result.consistent, (
        f"{scenario.name}: the empirical lower bound {result.epsilon_lb:.3f} "
        f"({result.unit}) exceeds the charged {result.charged:.3f}: the accounting is wrong")


# -- the detector's power: each injected accounting error must be caught ------------------------

def test_a_halved_gaussian_noise_scale_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    # The event (and so the charge) keeps the calibrated multiplier; only the noise is halved.
    original = _ClippedGaussianBase._noise_sigma
    monkeypatch.setattr(_ClippedGaussianBase, "_noise_sigma",
                        lambda self, n, spread: original(self, n, spread) / 2)
    with pa.release_check_off():
        result = pa.audit(pa.gaussian(1.0, delta=DELTA), trials=GAUSSIAN_TRIALS, seed=1)
    assert not result.consistent, f"missed: lower bound {result.epsilon_lb:.3f} <= 1"


@pytest.mark.parametrize("scenario", [pa.laplace_fixed(1.0), pa.laplace_neighbourhood(1.0)],
                         ids=["fixed", "neighbourhood"])
def test_a_halved_laplace_noise_scale_is_caught(scenario: pa.Scenario,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    sample = laplace_module.sample_euclidean_laplace
    monkeypatch.setattr(laplace_module, "sample_euclidean_laplace",
                        lambda n, epsilon, rng: sample(n, 2 * epsilon, rng))
    with pa.release_check_off():
        result = pa.audit(scenario, trials=LAPLACE_TRIALS, seed=1)
    assert not result.consistent, f"missed: lower bound {result.epsilon_lb:.3f} <= 1"


def test_an_uncharged_hypothesis_choice_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    # The Gaussian release is centred on the chosen hypothesis; ignoring the spread in σ
    # leaves that choice unpaid. Hypotheses 10·C apart make it plain to see.
    monkeypatch.setattr(GaussianMechanism, "_CENTRED_ON_REFERENCE", False)
    with pa.release_check_off():
        result = pa.audit(pa.gaussian(1.0, delta=DELTA, k=2, separation=10.0),
                          trials=GAUSSIAN_TRIALS, seed=1)
    assert not result.consistent, f"missed: lower bound {result.epsilon_lb:.3f} <= 1"


def test_a_sign_release_of_an_unclipped_update_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    # A 2x error in the sign's σ cannot show (its own ε stays below the Gaussian charge, see
    # `experiments.audits.privacy_audit.sign`); an update that escapes clipping does.
    monkeypatch.setattr("mechanisms.gaussian.clip_l2", lambda arrays, c: list(arrays))
    scenario = dataclasses.replace(pa.sign(1.0, delta=DELTA),
                                   a=([np.zeros(1)], [np.full(1, -10.0)]),
                                   b=([np.zeros(1)], [np.full(1, 10.0)]))
    with pa.release_check_off():
        result = pa.audit(scenario, trials=GAUSSIAN_TRIALS, seed=1)
    assert not result.consistent, f"missed: lower bound {result.epsilon_lb:.3f} <= 1"


def test_the_audit_makes_the_devices_release() -> None:
    # float32 on the mechanism's grid, through the release invariant (not ``sanitize``).
    scenario = pa.laplace_fixed(1.0)
    rows = pa.releases(scenario.mechanism, *scenario.b, spread=0.0, trials=50,
                       rng=np.random.default_rng(0))
    assert rows.dtype == np.float32
    made = rows[~np.isnan(rows).any(axis=1)]
    spacing = laplace_module.laplace_grid(1, 1.0)
    assert made.size > 40 and np.array_equal(made / spacing, np.rint(made / spacing))


# -- the estimator itself -----------------------------------------------------------------------

def test_clopper_pearson_matches_the_closed_form_at_zero_successes() -> None:
    # P[0 successes in n] = (1 − p)^n = alpha  ⇔  p = 1 − alpha^(1/n).
    low, high = pa.clopper_pearson(0, 100, 0.05)
    assert float(low) == 0.0
    assert float(high) == pytest.approx(1 - 0.05 ** (1 / 100), rel=1e-9)


def test_identical_laws_give_a_bound_of_zero() -> None:
    # Two inputs with the same law: no test has TPR > FPR beyond chance, and the split keeps
    # the best-of-many-thresholds choice from inflating the bound (it would without it).
    rng = np.random.default_rng(3)
    bound = pa.epsilon_lower_bound(rng.standard_normal(20_000), rng.standard_normal(20_000),
                                   delta=0.0, rng=rng)
    assert bound.epsilon == 0.0


# -- the record-level mode (mechanism dpsgd): canaries in or out of a device's records ----------

RECORD_TRIALS = 10_000  # scores per side: 100 releases of 100 canary slots each
CHOICE_TRIALS = 200  # k = 2: one canary per release


def record_scenarios() -> list[Any]:
    cases = [ra.RecordScenario("dpsgd add-remove nu=1", "add-remove", 1.0),
             ra.RecordScenario("dpsgd replace-one nu=1", "replace-one", 1.0),
             ra.RecordScenario("dpsgd k=2 add-remove nu=1", "add-remove", 1.0, k=2)]
    return [pytest.param(s, id=s.name) for s in cases]


def record_trials(scenario: ra.RecordScenario) -> int:
    return CHOICE_TRIALS if scenario.k == 2 else RECORD_TRIALS


@pytest.mark.parametrize("scenario", record_scenarios())
def test_no_record_level_release_is_shown_to_leak_more_than_its_ledger_charges(
    scenario: ra.RecordScenario,
) -> None:
    result = ra.audit_record(scenario, trials=record_trials(scenario), seed=1)

    # The charge is the accountant's for the event the device planned (q = 1, T = 1, the
    # choice as one more Gaussian query), at the relation the device declared.
    event = RecordLevelEvent(1.0, 1.0, 1, scenario.relation, 1.0 if scenario.k == 2 else 0.0)
    assert result.charged == pytest.approx(record_epsilon([event], DELTA), rel=1e-9)
    assert result.consistent, (
        f"{scenario.name}: the empirical lower bound {result.epsilon_lb:.3f} exceeds the "
        f"charged {result.charged:.3f}: the record-level accounting is wrong")


def test_a_halved_record_level_noise_is_refused_by_the_release_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The device's own last line of defence sees the noise drawn below the charge.
    from tasks import dpsgd

    train = dpsgd.train_record_level

    def halved(task: Any, params: Any, data: Any, training: Any, rng: Any, **kw: Any) -> Any:
        split = NoiseSplit(training.split.gradient / 2, training.split.secondary)
        return train(task, params, data, dataclasses.replace(training, split=split), rng, **kw)

    monkeypatch.setattr(dpsgd, "train_record_level", halved)
    with pytest.raises(ReleaseRefused):
        ra.audit_record(ra.RecordScenario("halved", "add-remove", 1.0), trials=4, seed=1)


@pytest.mark.parametrize(("inject", "scenario"), [
    pytest.param(ra.halved_noise, ra.RecordScenario("halved", "add-remove", 1.0),
                 id="halved noise multiplier"),
    pytest.param(ra.replace_one_charged_as_add_remove,
                 ra.RecordScenario("replace-one as add-remove", "replace-one", 1.0),
                 id="replace-one charged as add-remove"),
    pytest.param(ra.uncharged_choice, ra.RecordScenario("choice", "add-remove", 1.0, k=2),
                 id="uncharged hypothesis choice"),
])
def test_a_record_level_accounting_error_is_caught(inject: Any,
                                                   scenario: ra.RecordScenario) -> None:
    # Each error makes the release leak what a charge at ν/2 (or with the choice) would pay
    # for, while the ledger charges ν alone (2.75 at δ = 0.01).
    with inject():
        result = ra.audit_record(scenario, trials=record_trials(scenario), seed=1)
    assert not result.consistent, (
        f"missed: lower bound {result.epsilon_lb:.3f} <= charged {result.charged:.3f}")
