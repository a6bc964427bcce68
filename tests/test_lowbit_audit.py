"""The low-bit regression test: no release's last bits may tell two inputs apart beyond the charge.

Each audit (`experiments.audits.lowbit_audit`) resolves a device's settings from a run config and
a policy, plans the release from a float64 hypothesis (`client.release.plan_release`), makes
every release through `client.release.make_release` (the mechanism's exact release on its
grid, the float32 cast, the release invariant), and reads the releases' unrounded low bits:
trailing zeros of the mantissa, binade, 2-adic valuation, the residue modulo 2^-7, the value,
exact-value membership and refusal. The best test is chosen on one half of the releases and
counted on the other; the Clopper–Pearson bound at 95 % is compared with the ledger's charge
for the pair (d-privacy: Σ ε·r over the radius, times the pair's distance; Gaussian and sign:
the ledger's ε at its δ).

Sample size and false-positive rate: 4,000 releases per input (2,000 count the chosen test),
95 % Clopper–Pearson, so a release whose law keeps its guarantee fails an audit with
probability at most 5 % by construction, for every mechanism and pair; the audits are seeded,
so each outcome here is fixed. The pairs: a zero coordinate that becomes 2^-7 and a coordinate
at 1.0 that moves to 1 − 2^-7, both within the least radius, for Laplace neighbourhood (whole
model and per layer), Laplace fixed, Gaussian and sign on two parameters, and Laplace
neighbourhood and Gaussian on one. One parameter is where the grid matters most: the release
invariant refuses a release whose noise is below its law's 1e-9 lower tail, and rounding may
leave no noise at all; the grid of a small model is fine enough (``mechanisms.grid``) that an
honest release's rounded noise is zero with probability far below 1e-9, so a refusal, whose
presence could depend on whether the model lies on the grid, stays within the invariant's
stated refusal probability (a grid of a sixteenth of the scale refused 2-3 % of one-parameter
releases, and only when the model lay on the grid: this audit bounded those pairs' ε at
1.5-1.7 against 0.31). DP-SGD
(`client.record_release.release_record` on `experiments.audits.record_audit`'s canary records, q =
1, T = 1, ν = 1, δ = 0.01, add/remove and replace-one): 2,000 canary slots per input (20 releases
of 100 slots; the released weights of each slot's column, exactly 0 in the hypothesis), the
same features and split, against the ledger's record-level ε (2.75 and 6.93); the same 5 %.

The detector's power: the same audit, at the same size, must catch the float-unsafe release
(the mechanism's noise added in float64, no grid, released in float64: the release a server
got before the grid by sending float64 hypotheses). At these seeds it bounds the Laplace pairs'
ε at 3.4 against a charge of 0.31 (0.63 per layer).
"""

from __future__ import annotations

import numpy as np
import pytest

from experiments.audits import lowbit_audit as la
from experiments.audits import record_audit as ra

TRIALS = 4_000
PAIRS = ("zero/2^-7", "binade/2^-7")


def _cases() -> list[object]:
    return [pytest.param(s, id=s.name) for s in la.scenarios(PAIRS)]


@pytest.mark.parametrize("scenario", _cases())
def test_no_release_is_shown_by_its_low_bits_to_leak_more_than_its_charge(
    scenario: la.LowbitScenario,
) -> None:
    result = la.audit(scenario, trials=TRIALS, seed=1)

    assert result.dtype == "float32"
    assert 0.0 < result.charged < 2.0
    assert result.consistent, (
        f"{scenario.name}: the test {result.feature!r} bounds the pair's epsilon at "
        f"{result.epsilon_lb:.3f} (TPR {result.bound.tpr:.4f}, FPR {result.bound.fpr:.4f} of "
        f"{result.bound.trials}), above the charged {result.charged:.3f}: the release leaks")


@pytest.mark.parametrize("scenario", [pytest.param(s, id=s.name)
                                      for s in la.scenarios(["zero/2^-7"])
                                      if s.request["mechanism"] == "laplace"])
def test_a_float_unsafe_release_is_caught(scenario: la.LowbitScenario) -> None:
    result = la.audit(scenario, trials=TRIALS, seed=1, release=la.unsafe_release)

    assert result.dtype == "float64"
    assert not result.consistent, (
        f"missed: lower bound {result.epsilon_lb:.3f} <= charged {result.charged:.3f}")
    assert result.feature.split()[0] in ("valuation", "tz", "member")


#: DP-SGD: one canary slot per trial, 100 slots per release (`experiments.audits.record_audit`).
RECORD_TRIALS = 2_000


@pytest.mark.parametrize("relation", ["add-remove", "replace-one"])
def test_no_dpsgd_release_is_shown_by_its_low_bits_to_leak_more_than_its_charge(
    relation: str,
) -> None:
    scenario = ra.RecordScenario(f"dpsgd {relation} nu=1", relation, 1.0)
    result = la.audit_record(scenario, trials=RECORD_TRIALS, seed=1)

    assert result.dtype == "float32"
    assert result.consistent, (
        f"{scenario.name}: the test {result.feature!r} bounds ε at {result.epsilon_lb:.3f}, "
        f"above the charged {result.charged:.3f}: the release leaks")


def test_the_bit_features_are_exact() -> None:
    values = np.array([0.0, 1.0, 3 * 2.0**-10, -1.5, 2.0**-149], dtype=np.float32)
    f = la.bit_features(values, 2.0**-7)
    assert f["tz"].tolist() == [23, 23, 22, 22, 0]  # 3·2^-10 = 1.1b·2^-9; 2^-149 subnormal
    assert f["valuation"].tolist() == [la.ZERO_VALUATION, 0, -10, -1, -149]
    assert f["binade"].tolist() == [0, 127, 118, 127, 0]
    assert f["residue"].tolist() == [0.0, 0.0, 3 * 2.0**-10, 0.0, 2.0**-149]
    wide = la.bit_features(values.astype(np.float64), 2.0**-7)
    assert wide["valuation"].tolist() == f["valuation"].tolist()
    assert wide["tz"].tolist() == [52, 52, 51, 51, 52]


def test_membership_reads_only_the_values_it_was_built_from() -> None:
    a = np.array([[1.0], [2.0]], dtype=np.float32)
    b = np.array([[2.0], [3.0]], dtype=np.float32)
    score = la.features(a, b, spacing=1.0)["member x0"]
    rows = np.array([[1.0], [2.0], [3.0], [4.0]], dtype=np.float32)
    assert score(rows).tolist() == [-1.0, 0.0, 1.0, 0.0]
