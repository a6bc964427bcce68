"""The low-bit audit: whether a release's last bits tell two inputs apart beyond the charge.

A release computed as ``fl(x + ρ)`` lands on floats whose last bits depend on x (Mironov
2012): a zero coordinate released as ρ alone keeps the sampler's full mantissa, x + ρ keeps
the bits of x's binade, and a test on the mantissa's trailing zeros separates the two far
beyond the mechanism's ε. This audit looks for exactly that, through the path a device runs:

* the settings are resolved from a run config and a device policy
  (:meth:`client.settings.ClientSettings.resolve`), the plan is
  :func:`client.release.plan_release` of the hypothesis the server sent (float64, the
  server's choice of precision), the ledger that prices it is a real
  :class:`~mechanisms.PrivacyLedger`, and every release is
  :func:`client.release.make_release` (the mechanism's exact release, the cast, the release
  invariant) with noise from :func:`mechanisms.device_rng` (or a seeded generator, for a test
  whose outcome must be fixed);
* the scores are never rounded. Each release is read through low-bit *features*, per
  coordinate and summed over the coordinates: the number of trailing zero bits of the
  mantissa (in the release's own dtype), the binade (the exponent field), the 2-adic
  valuation (the exponent of the lowest set bit: ``x`` is a multiple of ``2^v`` and no more),
  the residue of ``x`` modulo a power of two, the value itself, and exact-value membership
  (+1 for a value seen in the first half's releases of b and never in a's, −1 for the
  reverse);
* the trials of each input are split at random into halves: every feature's best threshold
  test is found on the first halves (:func:`experiments.audits.privacy_audit.choose_test`), the one
  test with the highest bound there is fixed, and it is counted once on the second halves
  (:func:`experiments.audits.privacy_audit.count_test`, Clopper–Pearson at the given confidence).
  Choosing among many features on the first half costs power, never validity.

The input pairs are those where float arithmetic leaks most: an exactly-zero coordinate that
becomes 2⁻⁷ (or 10⁻³), and a coordinate at a power of two (1.0) that moves just below it, each
within the least radius of the neighbourhood calibration (both inputs then get the same noise
scale, so the law's own ε for the pair is ε·d). The hypothesis the server sent is float64.

The charge for a pair, in the unit of the bound (ε of this one pair): for d-privacy, the
ledger's charge Σ ε·r divided by the radius it is reported at (the least radius for the
neighbourhood calibration, the public radius for the fixed one) times the pair's distance
(per layer this is an upper bound of the law's pair ε: each block's ε·d_b is at most
(its cost / r)·d); for Gaussian and sign, the ledger's ε at its δ (the bound is taken at the
same δ). ε_lb above it means the release leaks more than the device pays for (with
probability ≥ confidence); ε_lb at or below it shows only that these features found nothing.

``python -m experiments.audits.lowbit_audit [--trials 30000]`` runs every scenario and DP-SGD
(:func:`audit_record`) with the device's own RNG and prints the table; tests/test_lowbit_audit.py
runs them seeded at CI size.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np

from client.policy import DevicePolicy
from client.record_release import plan_record_release, release_record
from client.release import ReleasePlan, make_release, plan_release
from client.settings import ClientSettings
from experiments.audits import record_audit as ra
from experiments.audits.privacy_audit import BoundedResult, EpsilonBound, choose_test, count_test
from experiments.audits.record_audit import RecordScenario
from mechanisms import PrivacyLedger, device_rng
from mechanisms.invariant import ReleaseRefused
from settings import federation_defaults

__all__ = [
    "PAIRS",
    "LowbitResult",
    "LowbitScenario",
    "ReleaseFn",
    "audit",
    "audit_record",
    "device_release",
    "features",
    "float_sums",
    "main",
    "scenarios",
    "unsafe_release",
]

Layers = list[np.ndarray]
#: A device release path: (plan, reference, updated, rng) → the arrays that leave the device.
ReleaseFn = Callable[[ReleasePlan, Layers, Layers, np.random.Generator], Layers]

#: The model the server sends (float64): a coordinate at 0 and one at a power of two.
BASE = (0.0, 1.0)
#: The pairs (name, coordinate, offset of input b): each within the least radius (0.01).
PAIRS: dict[str, tuple[int, float]] = {
    "zero/2^-7": (0, 2.0**-7),
    "zero/1e-3": (0, 1e-3),
    "binade/2^-7": (1, -(2.0**-7)),
}
#: The device's least radius (the policy's default) and the noise multiplier: the issue's
#: e^0.31 pair is n/(ν·r)·d = 2/(5·0.01)·2⁻⁷.
LEAST_RADIUS = 0.01
#: Laplace fixed: ε per unit at which a 2⁻⁷ pair has the same guarantee (0.31) as above.
FIXED_D_EPSILON = 40.0
#: Gaussian and sign: a clip near the pair's distance, so that σ is small beside the model's
#: values (the float sum's last bits then matter most).
CLIP = 2.0**-5


def device_release(plan: ReleasePlan, reference: Layers, updated: Layers,
                   rng: np.random.Generator) -> Layers:
    """Release through the device's path, :func:`client.release.make_release`."""
    return make_release(plan, reference, updated, rng=rng)


@contextlib.contextmanager
def float_sums() -> Iterator[None]:
    """Within the block, the mechanisms add their noise in float64 without any grid.

    Each ``on_grid`` sum becomes the plain float sum of its terms: the release as it was made
    before the grid, kept only so that a test can show the audit catches it.
    """
    def plain(terms: Sequence[np.ndarray], spacing: float) -> np.ndarray:
        total = np.array(terms[-1], dtype=np.float64, copy=True)
        for term in terms[:-1]:
            total += term
        return total

    with mock.patch("mechanisms.laplace.on_grid", plain), \
            mock.patch("mechanisms.gaussian.on_grid", plain):
        yield


def unsafe_release(plan: ReleasePlan, reference: Layers, updated: Layers,
                   rng: np.random.Generator) -> Layers:
    """Release float-unsafely: the model plus float64 noise, summed and sent in float64.

    The mechanism's own sampler and scale (:meth:`~mechanisms.Mechanism.sanitize_exact`
    under :func:`float_sums`), no grid, no cast: the pre-grid release a server could get by
    sending float64 hypotheses. Only for showing that the audit still has its power.
    """
    with float_sums():
        return plan.mechanism.sanitize_exact(reference, updated, rng=rng, spread=plan.spread)


@dataclass(frozen=True)
class LowbitScenario:
    """One mechanism and calibration, and a pair of trained models from one hypothesis.

    Attributes
    ----------
    name : str
    request : dict
        The run config's privacy request (over the federation's defaults).
    node : dict
        The device's node config (its policy's bounds).
    hypothesis : list of numpy.ndarray
        What the server sent (float64): the reference of both releases.
    a, b : list of numpy.ndarray
        The two trained models (float64, like the hypothesis).
    spacing : float
        A power of two: the residue feature reads ``x mod spacing``.
    """

    name: str
    request: dict[str, Any]
    node: dict[str, Any]
    hypothesis: Layers
    a: Layers
    b: Layers
    spacing: float = 2.0**-7

    @property
    def distance(self) -> float:
        """‖a − b‖ (exact enough: a few coordinates)."""
        return math.sqrt(math.fsum(float(np.sum((x - y) ** 2))
                                   for x, y in zip(self.a, self.b, strict=True)))

    def settings(self, ledger_dir: str) -> ClientSettings:
        """Resolve the device's settings for this request under its policy."""
        node = {"partition-id": 0, "num-partitions": 1, "ledger-dir": ledger_dir,
                "mechanisms": "laplace,gaussian,sign", **self.node}
        run = {**federation_defaults(), **self.request}
        return ClientSettings.resolve(run, DevicePolicy.load(node, environ={}))


@dataclass(frozen=True)
class LowbitResult(BoundedResult):
    """One audit: the bound, the feature that reached it, and the pair's charge.

    ``charged`` and ``bound.epsilon`` are both the ε of this one pair (see the module notes);
    ``dtype`` is the dtype of the releases; ``trials`` the releases made per input.
    """

    scenario: str
    mechanism: str
    feature: str
    charged: float
    trials: int
    dtype: str
    bound: EpsilonBound
    selection: dict[str, float] = field(default_factory=dict)



# -- the scenarios -------------------------------------------------------------------------------

def _pair(layers: Sequence[int], pair: str) -> tuple[Layers, Layers, Layers]:
    """(hypothesis, a, b) with the model's values laid into layers of the given sizes."""
    values = np.array(BASE * math.ceil(sum(layers) / len(BASE)), dtype=np.float64)
    flat = values[:sum(layers)]
    coordinate, offset = PAIRS[pair]
    moved = flat.copy()
    moved[coordinate] += offset

    def split(x: np.ndarray) -> Layers:
        return [part.copy() for part in np.split(x, np.cumsum(layers)[:-1])]

    return split(flat), split(flat), split(moved)


def scenarios(pairs: Sequence[str] = tuple(PAIRS)) -> list[LowbitScenario]:
    """Every mechanism and calibration of a device-level release, on each of ``pairs``.

    Laplace neighbourhood (whole model and per layer), Laplace fixed, Gaussian and sign, on a
    model of two parameters (per layer: two layers of two), and Laplace neighbourhood and
    Gaussian on a model of one; the device's default least radius and δ; the requests are a
    server's (ν = 5, a small clip). A pair that moves a coordinate the model lacks is skipped.
    """
    kinds: list[tuple[str, dict[str, Any], dict[str, Any], tuple[int, ...]]] = [
        ("laplace neighbourhood", {"mechanism": "laplace", "calibration": "neighbourhood",
                                   "noise-multiplier": 5.0}, {}, (2,)),
        ("laplace neighbourhood per-layer",
         {"mechanism": "laplace", "calibration": "neighbourhood", "noise-multiplier": 5.0,
          "per-layer": True}, {}, (2, 2)),
        ("laplace fixed", {"mechanism": "laplace", "calibration": "fixed",
                           "d-epsilon": FIXED_D_EPSILON, "public-radius": 1.0},
         {"d-epsilon": FIXED_D_EPSILON}, (2,)),
        ("gaussian", {"mechanism": "gaussian", "epsilon": 1.0, "clip": CLIP,
                      "planned-releases": 1}, {}, (2,)),
        ("sign", {"mechanism": "sign", "epsilon": 1.0, "clip": CLIP, "planned-releases": 1},
         {}, (2,)),
    ]
    # One coordinate (a model, or a per-layer block, of one parameter: a bias): the grid's
    # rounding then leaves no noise at all with a probability of a few per cent.
    kinds += [(f"{label} 1-D", request, node, (1,)) for label, request, node, _ in kinds
              if label in ("laplace neighbourhood", "gaussian")]
    out = []
    for label, request, node, layers in kinds:
        for pair in pairs:
            if PAIRS[pair][0] >= sum(layers):
                continue
            hypothesis, a, b = _pair(layers, pair)
            out.append(LowbitScenario(f"{label} {pair}", request, node, hypothesis, a, b))
    return out


# -- the features --------------------------------------------------------------------------------

#: The 2-adic valuation given to an exact zero (it is a multiple of every power of two).
ZERO_VALUATION = 4096.0


def _fields(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, int, int]:
    """(exponent field, mantissa field, mantissa bits, exponent bias + mantissa bits)."""
    if values.dtype == np.float32:
        bits = values.view(np.uint32).astype(np.int64)
        return (bits >> 23) & 0xFF, bits & ((1 << 23) - 1), 23, 150
    if values.dtype == np.float64:
        bits = values.view(np.uint64)
        exponent = ((bits >> np.uint64(52)) & np.uint64(0x7FF)).astype(np.int64)
        mantissa = (bits & np.uint64((1 << 52) - 1)).astype(np.int64)
        return exponent, mantissa, 52, 1075
    raise TypeError(f"a release of dtype {values.dtype} is neither float32 nor float64")


def _trailing_zeros(x: np.ndarray, width: int) -> np.ndarray:
    """Trailing zero bits of non-negative integers below 2^53 (``width`` for 0)."""
    lowest = x & -x
    with np.errstate(divide="ignore"):
        zeros = np.log2(lowest.astype(np.float64))  # exact: a power of two below 2^53
    return np.where(x == 0, float(width), zeros)


def bit_features(values: np.ndarray, spacing: float) -> dict[str, np.ndarray]:
    """Per-value low-bit features of a float32 or float64 array (same shape, float64).

    ``tz``: trailing zero bits of the mantissa field; ``binade``: the exponent field;
    ``valuation``: the exponent of the lowest set bit of the value (x = odd·2^v;
    :data:`ZERO_VALUATION` for 0); ``residue``: x mod ``spacing`` (exact); ``value``: x.
    """
    exponent, mantissa, width, offset = _fields(values)
    significand = np.where(exponent > 0, mantissa | (1 << width), mantissa)
    scale = np.maximum(exponent, 1) - offset
    valuation = np.where(significand == 0, ZERO_VALUATION,
                         scale + _trailing_zeros(significand, width + 1))
    wide = values.astype(np.float64)
    return {
        "tz": _trailing_zeros(mantissa, width),
        "binade": exponent.astype(np.float64),
        "valuation": valuation,
        "residue": np.mod(wide, spacing),
        "value": wide,
    }


def _exact(values: np.ndarray) -> np.ndarray:
    """Return the values' bit patterns (exact equality; +0 and −0 apart)."""
    return values.view(np.uint32 if values.dtype == np.float32 else np.uint64)


Score = Callable[[np.ndarray], np.ndarray]
#: Every feature's score of a refused release (below any other score: a fixed point of its own).
REFUSED_SCORE = -1e300


def features(build_a: np.ndarray, build_b: np.ndarray, *, spacing: float) -> dict[str, Score]:
    """Return the tests' scores (rows: flattened releases; one score per row).

    Every bit feature of :func:`bit_features` per coordinate and summed over coordinates;
    ``refused`` (the release check refused: the row is NaN; every other feature scores such a
    row :data:`REFUSED_SCORE`); and exact-value membership per
    coordinate and summed: +1 for a value seen in ``build_b`` and never in ``build_a``, −1 for
    the reverse. The membership sets come from ``build_a`` and ``build_b``, so its tests must
    be chosen and counted on other releases. ``spacing`` is the residue's modulus.
    """
    def bits(j: int | None, name: str) -> Score:
        def score(rows: np.ndarray) -> np.ndarray:
            f = bit_features(rows if j is None else rows[:, j], spacing)[name]
            return f.sum(axis=1) if j is None else f
        return score

    def member(j: int | None) -> Score:
        columns = range(build_a.shape[1]) if j is None else [j]
        only_b, only_a = {}, {}
        for c in columns:
            seen_a, seen_b = _exact(build_a[:, c].copy()), _exact(build_b[:, c].copy())
            only_b[c] = np.setdiff1d(seen_b, seen_a)
            only_a[c] = np.setdiff1d(seen_a, seen_b)

        def score(rows: np.ndarray) -> np.ndarray:
            total = np.zeros(rows.shape[0])
            for c in columns:
                values = _exact(rows[:, c].copy())
                total += np.isin(values, only_b[c]).astype(np.float64)
                total -= np.isin(values, only_a[c]).astype(np.float64)
            return total
        return score

    def refused(rows: np.ndarray) -> np.ndarray:
        return np.isnan(rows).all(axis=1).astype(np.float64)

    def finite(score: Score) -> Score:
        def scored(rows: np.ndarray) -> np.ndarray:
            values = np.asarray(score(rows), dtype=np.float64)
            return np.where(np.isnan(rows).all(axis=1), REFUSED_SCORE, values)
        return scored

    out: dict[str, Score] = {"refused": refused}
    for j in [*range(build_a.shape[1]), None]:
        where = "sum" if j is None else f"x{j}"
        for name in ("tz", "binade", "valuation", "residue", "value"):
            out[f"{name} {where}"] = finite(bits(j, name))
        out[f"member {where}"] = finite(member(j))
    return out


# -- the audit -----------------------------------------------------------------------------------

def charge(plan: ReleasePlan, s: ClientSettings, distance: float) -> float:
    """Return what a real ledger charges for one release, as the ε of a pair ``distance`` apart.

    d-privacy: the charge Σ ε·r over the radius it is reported at, times ``distance``;
    Gaussian and sign: the ledger's ε at its δ.
    """
    with tempfile.TemporaryDirectory() as folder:
        ledger = PrivacyLedger(Path(folder) / "ledger.json", delta=s.privacy.ledger_delta)
        spend = ledger.charge(plan.event, cap=None)
    if plan.event.family == "d-privacy":
        privacy = s.privacy
        radius = (privacy.least_radius if privacy.calibration == "neighbourhood"
                  else privacy.public_radius)
        return float(spend.d_privacy) / radius * distance
    return float(spend.epsilon)


def _releases(release: ReleaseFn, plan: ReleasePlan, reference: Layers, updated: Layers,
              trials: int, rng: np.random.Generator) -> np.ndarray:
    """``trials`` releases, one flattened row each; a refused release is a row of NaN.

    A refusal (:class:`~mechanisms.invariant.ReleaseRefused`, after the charge) is what the
    server sees instead of a release: an output of its own, which the tests can read.
    """
    rows: list[np.ndarray | None] = []
    for _ in range(trials):
        try:
            out = release(plan, reference, updated, rng)
        except ReleaseRefused:
            rows.append(None)
            continue
        rows.append(np.concatenate([np.ravel(x) for x in out]))
    like = next((r for r in rows if r is not None), None)
    if like is None:
        raise ReleaseRefused("every release was refused")
    return np.stack([np.full_like(like, np.nan) if r is None else r for r in rows])


def _choose(score_a: np.ndarray, score_b: np.ndarray, *, delta: float, confidence: float
            ) -> tuple[float, float, int, bool]:
    """Return the best test in both roles: (bound, threshold, direction, swapped).

    The guarantee is symmetric, so a set that holds more releases of a than of b counts too:
    ``swapped`` tests a as the alternative.
    """
    forward = choose_test(score_a, score_b, delta=delta, confidence=confidence)
    backward = choose_test(score_b, score_a, delta=delta, confidence=confidence)
    if backward[0] > forward[0]:
        return (*backward, True)
    return (*forward, False)


def _select_and_count(ya: np.ndarray, yb: np.ndarray, *, delta: float, confidence: float,
                      spacing: float) -> tuple[EpsilonBound, str, dict[str, float]]:
    """Choose the test on the first halves of the (shuffled) rows, count it on the second."""
    half = ya.shape[0] // 2
    quarter = half // 2
    tests = features(ya[:quarter], yb[:quarter], spacing=spacing)
    selection: dict[str, float] = {}
    best: tuple[float, str, float, int, bool] = (-math.inf, "", 0.0, 1, False)
    for name, score in tests.items():
        start = quarter if name.startswith("member") else 0
        value, threshold, direction, swapped = _choose(
            score(ya[start:half]), score(yb[start:half]), delta=delta, confidence=confidence)
        selection[name] = value
        if value > best[0]:
            best = (value, name, threshold, direction, swapped)
    _, name, threshold, direction, swapped = best
    ev_a, ev_b = tests[name](ya[half:2 * half]), tests[name](yb[half:2 * half])
    if swapped:
        ev_a, ev_b = ev_b, ev_a
    bound = count_test(ev_a, ev_b, threshold, direction, delta=delta, confidence=confidence)
    return bound, f"{name} ({'a' if swapped else 'b'} inside)", selection


def audit(scenario: LowbitScenario, *, trials: int, confidence: float = 0.95,
          seed: int | None = None, release: ReleaseFn = device_release) -> LowbitResult:
    """Make ``trials`` releases of each input through ``release``; bound the pair's ε.

    The releases of each input are shuffled and halved: the first half chooses the test (the
    membership sets from its first half, their thresholds on its second; every other
    feature's threshold on the whole first half), the second half counts the one test chosen,
    in whichever role (a or b as the alternative) it was chosen.

    Parameters
    ----------
    scenario : LowbitScenario
    trials : int
        Releases per input, >= 8.
    confidence : float
        The probability that the bound is below the release's true ε.
    seed : int or None
        ``None``: the noise comes from :func:`mechanisms.device_rng` (the device's own) and
        the split from fresh entropy; an integer fixes both (a test's fixed outcome).
    release : callable
        The release path (:func:`device_release` unless a test swaps it).
    """
    if trials < 8:
        raise ValueError(f"trials must be >= 8, got {trials}")
    if seed is None:
        noise, split = device_rng(), np.random.default_rng()
    else:
        noise = np.random.default_rng(np.random.SeedSequence([seed, 0]))
        split = np.random.default_rng(np.random.SeedSequence([seed, 1]))
    with tempfile.TemporaryDirectory() as folder:
        s = scenario.settings(folder)
        plan = plan_release(s.privacy, [scenario.hypothesis], max_abs=s.max_parameter)
        charged = charge(plan, s, scenario.distance)
        ya = _releases(release, plan, scenario.hypothesis, scenario.a, trials, noise)
        yb = _releases(release, plan, scenario.hypothesis, scenario.b, trials, noise)
    delta = 0.0 if plan.event.family == "d-privacy" else s.privacy.ledger_delta
    ya, yb = ya[split.permutation(trials)], yb[split.permutation(trials)]
    bound, feature, selection = _select_and_count(ya, yb, delta=delta, confidence=confidence,
                                                  spacing=scenario.spacing)
    return LowbitResult(scenario.name, s.privacy.mechanism, feature, charged, trials,
                        str(ya.dtype), bound, selection)


# -- the record-level mode (dpsgd): a canary record in or out ----------------------------------

def audit_record(scenario: RecordScenario, *, trials: int, confidence: float = 0.95,
                 seed: int | None = None) -> LowbitResult:
    """Low-bit audit of DP-SGD through the device's record-level path, canary in or out.

    The releases are :func:`client.record_release.release_record` on the canary data sets of
    :mod:`experiments.audits.record_audit` (k = 1: ``scenario.canaries`` slots per release, half
    with the canary, each slot one trial). A trial's row is the released weights of its slot's
    column (two float32 values, exactly 0 in the hypothesis): read by the same features and
    split as :func:`audit`, against the ledger's record-level ε at the scenario's δ.
    """
    if scenario.k != 1 or scenario.canaries < 2 or scenario.canaries % 2:
        raise ValueError("the low-bit record audit takes k = 1 and an even number of canaries")
    slots = scenario.canaries
    task = ra.CanaryTask(slots)
    if seed is None:
        rng, noise, split = np.random.default_rng(), device_rng(), np.random.default_rng()
    else:
        rng = np.random.default_rng(np.random.SeedSequence([seed, 2]))
        noise = np.random.default_rng(np.random.SeedSequence([seed, 3]))
        split = np.random.default_rng(np.random.SeedSequence([seed, 1]))
    ordinary = ra._ordinary(task.slots, rng)
    rows: dict[bool, list[np.ndarray]] = {True: [], False: []}
    with tempfile.TemporaryDirectory() as folder:
        s = ra.settings_of(scenario, folder)
        record = s.privacy.record
        assert record is not None
        hypotheses = ra._hypotheses(scenario, task.slots, record.loss_clip)
        plan = plan_record_release(s, hypotheses)
        charged = ra.record_charge(plan, s)
        while min(len(v) for v in rows.values()) < trials:
            inside = np.zeros(task.slots, dtype=bool)
            inside[rng.permutation(task.slots)[: task.slots // 2]] = True
            replaced = (~inside if scenario.relation == "replace-one"
                        else np.zeros_like(inside))
            data = ra._dataset(task.slots, inside, replaced, 1, ordinary)
            try:
                released, _ = release_record(task, s, plan, hypotheses, data, noise)
            except ReleaseRefused:
                for is_in in inside.tolist():
                    rows[is_in].append(np.full(2, np.nan, dtype=np.float32))
                continue
            weights = np.asarray(released[0])
            for i, is_in in enumerate(inside.tolist()):
                rows[is_in].append(weights[:, ra.BASE + i].copy())
    ya, yb = (np.stack(rows[side][:trials]) for side in (False, True))
    ya, yb = ya[split.permutation(trials)], yb[split.permutation(trials)]
    bound, feature, selection = _select_and_count(ya, yb, delta=scenario.delta,
                                                  confidence=confidence, spacing=2.0**-20)
    return LowbitResult(scenario.name, "dpsgd", feature, charged, trials, str(ya.dtype), bound,
                        selection)


# -- the command ---------------------------------------------------------------------------------

def main(argv: Sequence[str] | None = None) -> None:
    """Run every scenario (and DP-SGD) and print a Markdown table of bound against charge."""
    parser = argparse.ArgumentParser(
        description="The low-bit audit through the device's release path.")
    parser.add_argument("--trials", type=int, default=30_000, help="releases per input")
    parser.add_argument("--pairs", nargs="+", default=list(PAIRS), choices=list(PAIRS))
    parser.add_argument("--seed", type=int, default=None,
                        help="fix the noise and the split (default: the device's own RNG)")
    parser.add_argument("--no-dpsgd", action="store_true", help="leave DP-SGD out")
    args = parser.parse_args(argv)
    results = [audit(s, trials=args.trials, seed=args.seed) for s in scenarios(args.pairs)]
    if not args.no_dpsgd:
        results += [audit_record(ra.RecordScenario(f"dpsgd {rel} nu=1", rel, 1.0),
                                 trials=args.trials, seed=args.seed)
                    for rel in ("add-remove", "replace-one")]
    print(f"{args.trials:,} releases per input (half choose the test, half count it), "
          "95 % Clopper-Pearson:")
    print("| scenario | dtype | charged ε (pair) | ε lower bound | test | "
          "counts (inside / other) | within the charge |")
    print("| --- | --- | ---: | ---: | --- | --- | --- |")
    for r in results:
        b = r.bound
        counts = f"{round(b.tpr * b.trials)} / {round(b.fpr * b.trials)} of {b.trials:,}"
        print(f"| {r.scenario} | {r.dtype} | {r.charged:.3f} | {r.epsilon_lb:.3f} | "
              f"{r.feature} | {counts} | {'yes' if r.consistent else '**NO**'} |")


if __name__ == "__main__":
    main()
