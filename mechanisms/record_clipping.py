"""The clipping strategies of record-level DP-SGD: how C and the step move, and what they cost.

Pure arithmetic on public numbers and on already-sanitized vectors (post-processing), so that
the torch trainer (:mod:`tasks.dpsgd`) and the release check share one statement of each rule.

Three strategies, each a Gaussian query of noise multiplier ν per step in total:

``fixed``
    C and the step stay as given (FixedThreshold: Song et al., Abadi et al.).
``quantile``
    Andrew et al. (2021), FixedQuantile: C_{t+1} = C_t·exp(−η_C·(b̃_t − γ)), with b̃_t the
    noisy fraction of the batch whose gradient norm is at most C_t. The count query (bits
    b_i − ½, sensitivity ½, noise σ_b) and the gradient query share the budget as in their
    Theorem 1: ν_g = (ν^{-2} − (2σ_b)^{-2})^{-1/2}.
``oso``
    OSO-DPSGD, Algorithm 3 of Galli's thesis (004 ch. 3): the masked unit vectors
    q_t(z) = g/‖g‖ if ‖g‖ > C_t else 0 are summed with noise ν_q (eq. 3.17; Algorithm 3's
    line 13 prints ν_g there, eq. 3.17 and Proposition 1 say ν_q, which is what is accounted),
    the gradients with σ_g = ν_g·C_t (eq. 3.18), ν_g = (ν^{-2} − ν_q^{-2})^{-1/2}
    (Proposition 1), and C_{t+1} = C_t·exp(ρ_c·sign(g̃_tᵀq̃_{t−1})) (eq. 3.20),
    ρ_{t+1} = ρ_t·exp(ρ_r·sign(g̃_tᵀg̃_{t−1})) (eq. 3.21).

By those two propositions each step is one Gaussian query of noise multiplier ν on the
clipped per-record contributions, whatever the strategy: the accountant charges
``PoissonSampledDpEvent(q, GaussianDpEvent(ν))`` per step, the extra queries included.
The split ν_q = ratio·ν (and 2σ_b = ratio·ν) follows the thesis's rule of thumb: ratio
7.124 makes ν_g 1 % larger than ν.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from mechanisms._validation import check_positive_finite

__all__ = ["CLIPPING_STRATEGIES", "ClipSchedule", "NoiseSplit", "split_noise"]

#: The clipping strategies a record-level release can use.
CLIPPING_STRATEGIES: tuple[str, ...] = ("fixed", "quantile", "oso")

#: The thesis's rule of thumb: ν_q = 7.124·ν gives ν_g = 1.01·ν (Proposition 1).
DEFAULT_QUERY_RATIO = 7.124


@dataclass(frozen=True)
class NoiseSplit:
    """How one step's noise multiplier ν is shared between its queries.

    Attributes
    ----------
    gradient : float
        ν_g: σ of the gradient sum is ν_g·C_t.
    secondary : float
        σ of the extra query's sum: ν_q (oso, unit vectors), σ_b (quantile, the count), 0
        (fixed).
    """

    gradient: float
    secondary: float

    def combined(self, strategy: str) -> float:
        """Return the ν this split is equivalent to (the one the accountant charges)."""
        if strategy == "fixed":
            return self.gradient
        whitened = 1.0 / self.gradient ** 2
        whitened += (1.0 / self.secondary ** 2 if strategy == "oso"
                     else 1.0 / (2.0 * self.secondary) ** 2)
        return 1.0 / math.sqrt(whitened)


def split_noise(strategy: str, noise_multiplier: float, ratio: float = DEFAULT_QUERY_RATIO
                ) -> NoiseSplit:
    """Share ν between a step's queries so that the step is one Gaussian query of ν.

    Parameters
    ----------
    strategy : {"fixed", "quantile", "oso"}
    noise_multiplier : float
        ν > 0, the per-step noise multiplier charged.
    ratio : float
        > 1: ν_q = ratio·ν (oso) or 2σ_b = ratio·ν (quantile).
    """
    nu = check_positive_finite("noise_multiplier", noise_multiplier)
    if strategy not in CLIPPING_STRATEGIES:
        raise ValueError(f"strategy must be one of {CLIPPING_STRATEGIES}, got {strategy!r}")
    if strategy == "fixed":
        return NoiseSplit(nu, 0.0)
    r = check_positive_finite("ratio", ratio)
    if r <= 1.0:
        raise ValueError(f"ratio must be > 1 (the extra query needs noise), got ratio={r!r}")
    secondary = r * nu
    gradient = 1.0 / math.sqrt(nu ** -2 - secondary ** -2)
    return NoiseSplit(gradient, secondary if strategy == "oso" else secondary / 2.0)


class ClipSchedule:
    """C_t and the step ρ_t of one release, updated from sanitized values only.

    Parameters
    ----------
    strategy : {"fixed", "quantile", "oso"}
    clip, learning_rate : float
        C_0 and ρ_0.
    target_quantile : float
        γ in (0, 1) (quantile).
    clip_rate : float
        η_C (quantile) or ρ_c (oso).
    lr_rate : float
        ρ_r (oso).
    """

    def __init__(self, strategy: str, clip: float, learning_rate: float, *,
                 target_quantile: float = 0.5, clip_rate: float = 2.5e-3,
                 lr_rate: float = 2.5e-3) -> None:
        if strategy not in CLIPPING_STRATEGIES:
            raise ValueError(f"strategy must be one of {CLIPPING_STRATEGIES}, got {strategy!r}")
        self.strategy = strategy
        self.clip = check_positive_finite("clip", clip)
        self.learning_rate = check_positive_finite("learning_rate", learning_rate)
        self.target_quantile = target_quantile
        self.clip_rate = clip_rate
        self.lr_rate = lr_rate
        self._last_g: np.ndarray | None = None
        self._last_q: np.ndarray | None = None
        self.clips: list[float] = [self.clip]
        self.learning_rates: list[float] = [self.learning_rate]

    def step_quantile(self, noisy_fraction: float) -> None:
        """Andrew et al.: C ← C·exp(−η_C·(b̃ − γ)); b̃ is the sanitized unclipped fraction."""
        # b̃ is the true fraction (in [0, 1]) plus noise; clamping it there is post-processing,
        # and keeps a large noise multiplier from overflowing the exponent (ν up to 1e6 drew
        # b̃ ~ 1e5, and exp(η_C·1e5) raised OverflowError after the release was charged).
        fraction = min(max(float(noisy_fraction), 0.0), 1.0)
        self.clip = _scaled(self.clip, -self.clip_rate * (fraction - self.target_quantile))
        self._record()

    def step_oso(self, g_tilde: np.ndarray, q_tilde: np.ndarray) -> None:
        """Algorithm 3, lines 14-15 (eqs. 3.20, 3.21); q̃_0 = g̃_0 = 0 (sign 0: no move)."""
        if self._last_q is not None and self._last_g is not None:
            self.clip = _scaled(self.clip, self.clip_rate * _sign_dot(g_tilde, self._last_q))
            self.learning_rate = _scaled(self.learning_rate,
                                         self.lr_rate * _sign_dot(g_tilde, self._last_g))
        self._last_g, self._last_q = g_tilde, q_tilde
        self._record()

    def step_fixed(self) -> None:
        """FixedThreshold: C and the step stay; the trajectory records the step."""
        self._record()

    def _record(self) -> None:
        self.clips.append(self.clip)
        self.learning_rates.append(self.learning_rate)


#: The range a moving clip or step is kept in: a run of steps that all move one way (at a
#: rate of up to 10 a step) would otherwise reach 0 or inf and end the training in NaN.
SCALE_RANGE = (1e-300, 1e300)


def _scaled(value: float, exponent: float) -> float:
    """Return value·exp(exponent) without overflow, kept within :data:`SCALE_RANGE`."""
    low, high = SCALE_RANGE
    log_value = math.log(value) + exponent
    return min(max(math.exp(min(max(log_value, math.log(low)), math.log(high))), low), high)


def _sign_dot(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.sign(np.dot(a.astype(np.float64), b.astype(np.float64))))
