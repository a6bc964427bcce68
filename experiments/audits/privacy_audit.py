"""An empirical lower bound on ε: many releases of a real mechanism on two neighbouring inputs.

The standard auditing estimator (Jagielski et al. 2020; Nasr et al. 2021; thesis 004 eq. 4.4):
an (ε, δ)-DP release M satisfies, for every test that says "b" on a set S of outputs,

    TPR = P[M(b) ∈ S] ≤ e^ε · P[M(a) ∈ S] + δ = e^ε · FPR + δ,

so ε ≥ ln((TPR − δ) / FPR) for every S. With Clopper–Pearson bounds, TPR ≥ TPR_low and
FPR ≤ FPR_high each with probability ≥ 1 − α/2, the estimate

    ε_lb = ln((TPR_low − δ) / FPR_high)

is below the mechanism's true ε with probability ≥ 1 − α, *provided S was fixed before the
counts were taken*. Choosing the best threshold on the very trials that are then counted would
break that; here the trials of each side are split at random into two halves, the test (a
threshold and a direction) is chosen on the first and counted on the second.

The test is the strongest one the law justifies: each scenario's ``score`` is the log-likelihood
ratio log p_b(y)/p_a(y) of the release y, or a monotone function of it (Neyman–Pearson: a
threshold on it is the most powerful test at every false-positive rate). The scenarios put the
neighbouring inputs where the bound is hardest to meet: the whole clipped update along the axis
that separates the two centres, and (k = 2) data sets that pick different hypotheses and train
away from each other.

Every release is the device's own (:func:`client.release.make_release`: the exact release on
its public grid, the float32 cast and the release invariant; a refusal scores
:data:`REFUSED_SCORE`), and the scores are not rounded: a test may read any bit of what leaves
the device (the low-bit audit, :mod:`experiments.audits.lowbit_audit`, reads the bits themselves).

``charged`` is what a real :class:`~mechanisms.PrivacyLedger` charges for one release of the
same event; d-privacy is reported per unit of distance (ε_lb and the charge both divided by
the distance between the two inputs), Gaussian and sign as (ε, δ) at the ledger's δ.

What this can and cannot show: ε_lb > charged means the accounting is wrong (with probability
≥ 1 − α); ε_lb ≤ charged never shows that it is right, only that this test did not find the
error. The gap between them is the accounting's slack plus the test's weakness.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import numpy as np
from scipy import optimize, stats

from client.release import ReleasePlan, make_release
from mechanisms import (
    EuclideanLaplace,
    GaussianMechanism,
    Mechanism,
    PrivacyLedger,
    StochasticSign,
    hypotheses_diameter,
)
from mechanisms.invariant import ReleaseRefused

__all__ = [
    "REFUSED_SCORE",
    "AuditResult",
    "BoundedResult",
    "EpsilonBound",
    "Scenario",
    "audit",
    "choose_test",
    "clopper_pearson",
    "count_test",
    "epsilon_lower_bound",
    "gaussian",
    "laplace_fixed",
    "laplace_neighbourhood",
    "release_check_off",
    "releases",
    "sign",
]

Layers = list[np.ndarray]


def clopper_pearson(successes: np.ndarray | int, trials: int, alpha: float
                    ) -> tuple[np.ndarray, np.ndarray]:
    """One-sided Clopper–Pearson bounds at level ``alpha`` each: (lower, upper).

    ``lower`` ≤ p with probability ≥ 1 − alpha, and so is ``upper`` ≥ p (exact binomial
    bounds, from the beta quantiles; 0 and 1 at the ends).
    """
    k = np.asarray(successes, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        lower = np.where(k > 0, stats.beta.ppf(alpha, k, trials - k + 1), 0.0)
        upper = np.where(k < trials, stats.beta.ppf(1 - alpha, k + 1, trials - k), 1.0)
    return lower, upper


@dataclass(frozen=True)
class EpsilonBound:
    """The lower bound of one audit and the counts behind it (on the evaluation half).

    ``epsilon`` is max(0, ln((tpr_low − δ)/fpr_high)); ``tpr`` and ``fpr`` are the observed
    rates of the chosen test, ``threshold`` and ``direction`` (+1: say "b" above the
    threshold) the test, ``trials`` the releases per side counted.
    """

    epsilon: float
    tpr: float
    fpr: float
    tpr_low: float
    fpr_high: float
    threshold: float
    direction: int
    trials: int
    confidence: float


def _bound(tp: np.ndarray, fp: np.ndarray, n: int, delta: float, alpha: float) -> np.ndarray:
    low, _ = clopper_pearson(tp, n, alpha / 2)
    _, high = clopper_pearson(fp, n, alpha / 2)
    with np.errstate(divide="ignore", invalid="ignore"):
        eps = np.log(np.maximum(low - delta, 0.0) / high)
    return np.where(np.isfinite(eps), eps, -np.inf)


def epsilon_lower_bound(scores_a: np.ndarray, scores_b: np.ndarray, *, delta: float,
                        confidence: float = 0.95, rng: np.random.Generator) -> EpsilonBound:
    """Lower-bound ε from test scores of releases on input a and on input b.

    Each side is split at random into halves of equal size. On the first halves every
    threshold (each distinct score) in both directions is tried, and the one with the highest
    bound is kept (:func:`choose_test`); that single test is then counted on the second halves
    (:func:`count_test`), where its Clopper–Pearson bounds at 1 − (1 − confidence)/2 each make
    ε_lb hold at ``confidence``.

    Parameters
    ----------
    scores_a, scores_b : numpy.ndarray
        One score per release (larger: more like b), as many for a as for b.
    delta : float
        The δ of the guarantee being audited (0 for d-privacy).
    confidence : float
        In (0, 1): the probability that the bound is below the true ε.
    rng : numpy.random.Generator
        Draws the split.
    """
    a, b = np.asarray(scores_a, np.float64), np.asarray(scores_b, np.float64)
    if a.shape != b.shape or a.ndim != 1 or a.size < 4:
        raise ValueError(f"need two equal 1-D score arrays of >= 4, got {a.shape}, {b.shape}")
    a, b = rng.permutation(a), rng.permutation(b)
    half = a.size // 2
    _, threshold, direction = choose_test(a[:half], b[:half], delta=delta,
                                          confidence=confidence)
    return count_test(a[half:2 * half], b[half:2 * half], threshold, direction, delta=delta,
                      confidence=confidence)


def choose_test(select_a: np.ndarray, select_b: np.ndarray, *, delta: float,
                confidence: float = 0.95) -> tuple[float, float, int]:
    """Choose the threshold test with the highest bound on one half of the scores.

    Returns ``(bound, threshold, direction)``: the test says "b" where
    ``direction * score > threshold``; ``bound`` is its ε_lb on these very scores (biased
    upwards by the choice: only :func:`count_test` on other scores gives a valid bound).
    """
    a, b = np.asarray(select_a, np.float64), np.asarray(select_b, np.float64)
    if a.shape != b.shape or a.ndim != 1 or a.size < 2:
        raise ValueError(f"need two equal 1-D score arrays of >= 2, got {a.shape}, {b.shape}")
    half, alpha = a.size, 1.0 - confidence
    best = (-math.inf, 0.0, 1)
    for direction in (1, -1):
        null, alt = np.sort(direction * a), np.sort(direction * b)
        thresholds = np.unique(np.concatenate([null, alt]))
        if thresholds.size > 4096:  # the tails matter most: keep them all, thin the middle
            keep = np.unique(np.concatenate([thresholds[:512], thresholds[-2048:],
                                             thresholds[::thresholds.size // 1536]]))
            thresholds = keep
        fp = half - np.searchsorted(null, thresholds, side="right")
        tp = half - np.searchsorted(alt, thresholds, side="right")
        eps = _bound(tp, fp, half, delta, alpha)
        i = int(np.argmax(eps))
        if eps[i] > best[0]:
            best = (float(eps[i]), float(thresholds[i]), direction)
    return best


def count_test(scores_a: np.ndarray, scores_b: np.ndarray, threshold: float, direction: int, *,
               delta: float, confidence: float = 0.95) -> EpsilonBound:
    """Count one fixed test (chosen without these scores) and bound ε at ``confidence``."""
    a, b = np.asarray(scores_a, np.float64), np.asarray(scores_b, np.float64)
    if a.shape != b.shape or a.ndim != 1 or a.size < 1:
        raise ValueError(f"need two equal non-empty 1-D score arrays, got {a.shape}, {b.shape}")
    alpha = 1.0 - confidence
    n = a.size
    false_pos = int(np.count_nonzero(direction * a > threshold))
    true_pos = int(np.count_nonzero(direction * b > threshold))
    low, _ = clopper_pearson(true_pos, n, alpha / 2)
    _, high = clopper_pearson(false_pos, n, alpha / 2)
    value = float(_bound(np.array(true_pos), np.array(false_pos), n, delta, alpha))
    return EpsilonBound(max(value, 0.0), true_pos / n, false_pos / n, float(low), float(high),
                        threshold, direction, n, confidence)


@dataclass(frozen=True)
class Scenario:
    """Two neighbouring inputs of one release, the test's score, and how to report the charge.

    Attributes
    ----------
    name : str
    mechanism : Mechanism
        The real mechanism object; every release is :func:`client.release.make_release` of
        a plan of it (:func:`releases`).
    a, b : tuple of (reference, updated)
        The two inputs: the hypothesis each data set picked and the model it trained.
    spread : float
        The hypotheses' diameter the client passes (``hypotheses_diameter`` of those sent).
    score : callable
        Flattened release → score (larger: more like b), vectorised over rows.
    delta : float
        The δ of the audited guarantee and of the ledger (0 for d-privacy).
    distance : float
        ‖updated_a − updated_b‖ for d-privacy (the bound and the charge are divided by it),
        1 otherwise.
    exact : float
        The largest ε the release's law allows at this pair and δ (what an unbounded number of
        trials could approach), for comparison; nan where not computed.
    """

    name: str
    mechanism: Mechanism
    a: tuple[Layers, Layers]
    b: tuple[Layers, Layers]
    spread: float
    score: Callable[[np.ndarray], np.ndarray]
    delta: float
    distance: float
    exact: float


class BoundedResult:
    """What every audit result reads from its bound and its charge (mixed into the dataclasses)."""

    bound: EpsilonBound
    charged: float

    @property
    def epsilon_lb(self) -> float:
        """The empirical lower bound (per unit of distance for d-privacy)."""
        return self.bound.epsilon

    @property
    def consistent(self) -> bool:
        """Whether the bound stays within the charge (False: the release leaks more)."""
        return self.epsilon_lb <= self.charged


@dataclass(frozen=True)
class AuditResult(BoundedResult):
    """One audit: the charge, the bound and the law's own ε, in the same unit."""

    scenario: str
    mechanism: str
    unit: str
    charged: float
    exact: float
    bound: EpsilonBound



def releases(mechanism: Mechanism, reference: Layers, updated: Layers, *, spread: float,
             trials: int, rng: np.random.Generator) -> np.ndarray:
    """``trials`` releases through the device's path, one flattened row each (float32).

    Each release is :func:`client.release.make_release` of a plan of ``mechanism`` (its event
    for this release, ``spread``): the exact release on its grid, the float32 cast and the
    release invariant, as ``fit`` makes it. A refused release
    (:class:`~mechanisms.invariant.ReleaseRefused`, after the charge) is a row of NaN.
    """
    plan = ReleasePlan(mechanism=mechanism, event=mechanism.event(reference, updated),
                       spread=spread)
    n = sum(u.size for u in updated)
    out = np.empty((trials, n), dtype=np.float32)
    for i in range(trials):
        try:
            released = make_release(plan, reference, updated, rng=rng)
        except ReleaseRefused:
            out[i] = np.nan
            continue
        out[i] = np.concatenate([x.ravel() for x in released])
    return out


@contextlib.contextmanager
def release_check_off() -> Iterator[None]:
    """Within the block, :func:`client.release.make_release` skips the release invariant.

    For injected errors only: the invariant refuses many of them (a noise below its charge,
    off its grid) before anything leaves, which is its job; switching it off measures the
    audit's own power to see them.
    """
    with mock.patch("client.release.verify_release", lambda *args, **kwargs: None):
        yield


def charged(mechanism: Mechanism, reference: Layers, updated: Layers, *, delta: float) -> float:
    """Return what a real ledger charges for one release: Σ ε·r (d-privacy), or ε at δ.

    For Gaussian and sign releases, the smaller of RDP's and PLD's ε.
    """
    event = mechanism.event(reference, updated)
    with tempfile.TemporaryDirectory() as folder:
        ledger = PrivacyLedger(Path(folder) / "ledger.json", delta=delta if delta > 0 else 1e-5)
        spend = ledger.charge(event, cap=None)
    return spend.d_privacy if event.family == "d-privacy" else spend.epsilon


#: The score of a refused release: that of the two inputs' midpoint (any fixed score of an
#: output is a valid test; the scenarios' inputs lie on their grids, where the law refuses
#: both alike).
REFUSED_SCORE = 0.0


def audit(scenario: Scenario, *, trials: int, confidence: float = 0.95,
          seed: int = 0) -> AuditResult:
    """Run ``trials`` releases on each input, bound ε, and compare with the ledger's charge.

    The releases are the device's (:func:`releases`) and their scores are not rounded: the
    test may read any bit of the float32 release, as a server can.
    """
    noise, split = np.random.default_rng(np.random.SeedSequence([seed, 0])), \
        np.random.default_rng(np.random.SeedSequence([seed, 1]))
    ya = releases(scenario.mechanism, *scenario.a, spread=scenario.spread, trials=trials,
                  rng=noise)
    yb = releases(scenario.mechanism, *scenario.b, spread=scenario.spread, trials=trials,
                  rng=noise)
    sa, sb = (np.where(np.isnan(y).any(axis=1), REFUSED_SCORE, scenario.score(y))
              for y in (ya, yb))
    bound = epsilon_lower_bound(sa, sb, delta=scenario.delta, confidence=confidence, rng=split)
    cost = charged(scenario.mechanism, *scenario.a, delta=scenario.delta)
    d = scenario.distance
    if d != 1.0:
        bound = dataclasses.replace(bound, epsilon=bound.epsilon / d)
    unit = "per unit distance" if scenario.delta == 0.0 else f"at delta={scenario.delta:g}"
    if isinstance(scenario.mechanism, EuclideanLaplace):
        # The charge is ε·r at the fixed calibration's public radius, or n/ν at ‖δ‖ (= d/2).
        radius = scenario.mechanism.public_radius
        cost /= radius if radius is not None else d / 2
    return AuditResult(scenario.name, scenario.mechanism.name, unit, cost, scenario.exact, bound)


# -- the scenarios: neighbouring inputs where the bound is hardest to meet -------------------------

def _vec(values: Sequence[float]) -> Layers:
    return [np.asarray(values, dtype=np.float64)]


def laplace_fixed(epsilon: float, *, distance: float = 1.0) -> Scenario:
    """Audit the fixed calibration, ε per unit: two models ``distance`` apart, in one dimension.

    In R^1 the Euclidean Laplace is the ordinary Laplace, whose privacy loss reaches ε·r on
    half of the outputs: the likelihood-ratio test meets the guarantee exactly, so this is
    the pair on which an error in the noise scale shows most.
    """
    mech = EuclideanLaplace(calibration="fixed", epsilon=epsilon, public_radius=distance)
    ref, ua, ub = _vec([0.0]), _vec([0.0]), _vec([distance])
    return Scenario(f"laplace fixed eps={epsilon:g}", mech, (ref, ua), (ref, ub), 0.0,
                    _distance_score(0.0, distance), 0.0, distance, epsilon)


def laplace_neighbourhood(nu: float, *, norm: float = 1.0) -> Scenario:
    """Neighbourhood calibration: ε = n/(ν‖δ‖); updates +‖δ‖ and −‖δ‖ (same norm, so same ε).

    Two updates of different norms would be told apart by the noise's size, the leak of ‖δ‖
    the calibration documents; this audits the guarantee it claims, at equal norms.
    """
    mech = EuclideanLaplace(calibration="neighbourhood", noise_multiplier=nu)
    ref, ua, ub = _vec([0.0]), _vec([-norm]), _vec([norm])
    return Scenario(f"laplace neighbourhood nu={nu:g}", mech, (ref, ua), (ref, ub), 0.0,
                    _distance_score(-norm, norm), 0.0, 2 * norm, 1.0 / (nu * norm))


def _distance_score(a: float, b: float) -> Callable[[np.ndarray], np.ndarray]:
    # log p_b/p_a = ε(|y − a| − |y − b|): monotone in this difference whatever ε.
    return lambda y: np.abs(y[:, 0] - a) - np.abs(y[:, 0] - b)


def gaussian(epsilon: float, *, delta: float, k: int = 1, clip: float = 1.0,
             separation: float = 10.0, dim: int = 2) -> Scenario:
    """Gaussian mechanism; k = 2: the data sets pick hypotheses ``separation``·C apart.

    k = 1: both start from 0 and train to ∓C along the first axis (distance 2C = Δ).
    k = 2: data set a picks θ_1 = 0 and trains to −C e_1, data set b picks θ_2 = D e_1 and
    trains to (D + C) e_1: the client's path (choice, training, spread = the hypotheses'
    diameter, sanitize) with the choice made by construction, the two centres D + 2C apart,
    the most any two data sets can be.
    """
    mech = GaussianMechanism(clip=clip, epsilon=epsilon, delta=delta, planned_releases=1)
    return _clipped(mech, f"gaussian k={k} eps={epsilon:g}", k, clip, separation, dim, delta,
                    _gdp_epsilon(1.0 / mech.noise_multiplier, delta))


def sign(epsilon: float, *, delta: float, k: int = 1, clip: float = 1.0,
         separation: float = 10.0) -> Scenario:
    """Stochastic sign, one coordinate (the whole clipped update on it), k = 1 or 2 as above.

    One coordinate is the sign's worst case: the release is +1 with probability Φ(C/σ) for
    one data set and Φ(−C/σ) for the other. Its own ε is far below the Gaussian charge (the
    sign is post-processing of it), so only gross errors (an unclipped update) can show.
    """
    mech = StochasticSign(clip=clip, epsilon=epsilon, delta=delta, planned_releases=1)
    p = float(stats.norm.cdf(clip / mech.sigma(1)))
    exact = math.log((p - delta) / (1 - p)) if p - delta > 1 - p else 0.0
    return _clipped(mech, f"sign k={k} eps={epsilon:g}", k, clip, separation, 1, delta, exact)


def _clipped(mech: Mechanism, name: str, k: int, clip: float, separation: float, dim: int,
             delta: float, exact: float) -> Scenario:
    if k not in (1, 2):
        raise ValueError(f"k must be 1 or 2, got k={k}")
    axis = np.zeros(dim)
    axis[0] = 1.0
    theta_a, theta_b = np.zeros(dim), (separation * clip * axis if k == 2 else np.zeros(dim))
    spread = hypotheses_diameter([[theta_a], [theta_b]]) if k == 2 else 0.0
    a = ([theta_a], [theta_a - clip * axis])
    b = ([theta_b], [theta_b + clip * axis])
    if isinstance(mech, StochasticSign):
        def score(y: np.ndarray) -> np.ndarray:
            return y[:, 0]
    else:
        centre = (a[1][0] + b[1][0]) / 2
        direction = b[1][0] - a[1][0]

        def score(y: np.ndarray) -> np.ndarray:
            return (y - centre) @ direction
    return Scenario(name, mech, a, b, spread, score, delta, 1.0, exact)


def _gdp_epsilon(mu: float, delta: float) -> float:
    """Return the exact ε at δ of the Gaussian shift μ = Δ/σ (Balle & Wang 2018, Theorem 8)."""
    def gap(eps: float) -> float:
        return (stats.norm.cdf(-eps / mu + mu / 2)
                - math.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2) - delta)
    if gap(0.0) <= 0:
        return 0.0
    return float(optimize.brentq(gap, 0.0, 100.0))
