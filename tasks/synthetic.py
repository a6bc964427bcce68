"""Synthetic linear regression with one optimum per group (paper 001, section 4.1).

User ``u`` belongs to group ``g = u % G`` and holds ``samples-per-user`` pairs

    x ~ N(0, I_n),   y = xᵀθ*_g + u,   u ~ Uniform[0, 1)

The paper gives θ*_1 = [5, 6], θ*_2 = [4, -4.5] and the noise, but not the distribution of x;
a standard normal is our choice. The model is linear with exactly n parameters and no intercept
(the paper's θ ∈ R²), so even at θ*_g the loss is the RMS of the noise, ≈ sqrt(1/3) ≈ 0.577.
The loss is the RMSE (the paper's Eq. 15) and training is mini-batch gradient descent on it.

Pure NumPy: importing this module must not import torch or scikit-learn, because plain
``flower-supernode`` starts a ClientApp process for every message (``gpfl supernode``'s warm
executor imports it once).

Each user's data come from ``SeedSequence([data-seed, purpose, index])`` (see
`tasks.base.user_seed`), so any process regenerates the same bytes without coordination.
"""

from __future__ import annotations

import numpy as np

from tasks.base import Dataset, Params, Schedule
from tasks.generated import GeneratedTask, optima_array

__all__ = ["SyntheticTask", "optima_array", "rmse", "rmse_gradient"]


def rmse(residuals: np.ndarray) -> float:
    """Root mean squared value of ``residuals`` (0 for an empty array)."""
    if residuals.size == 0:
        return 0.0
    return float(np.sqrt(np.mean(np.square(residuals))))


def rmse_gradient(weights: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Gradient of ``sqrt(mean((x @ w - y)²))`` with respect to ``w``.

    ∇ = xᵀr / (m · RMSE) with r = x @ w - y. Where the RMSE is 0 the function is not
    differentiable; the point is a minimum, so the zero subgradient is returned.
    """
    residuals = x @ weights - y
    loss = rmse(residuals)
    if loss == 0.0:
        return np.zeros_like(weights)
    return np.asarray(x.T @ residuals / (residuals.shape[0] * loss))


class SyntheticTask(GeneratedTask):
    """Linear regression on users drawn from ``G`` linear models (one optimum per group).

    The constructor is `GeneratedTask`'s: ``optima`` holds θ*_g, shape (G, n), and training or
    validation user ``u`` belongs to group ``u % G``.
    """

    name = "synthetic"
    is_classifier = False
    run_config_keys = ("optima", "optima-repeat", "users", "samples-per-user", "validation-users",
                       "data-seed")

    # -- model ------------------------------------------------------------------------------
    @property
    def num_groups(self) -> int:
        """Number of groups G."""
        return int(self._optima.shape[0])

    @property
    def parameter_shapes(self) -> list[tuple[int, ...]]:
        """One layer: the weight vector, shape (n,)."""
        return [(self.dimension,)]

    def init_parameters(self, rng: np.random.Generator) -> Params:
        """Draw θ ~ N(0, I_n), as the paper initialises its hypotheses."""
        return [rng.standard_normal(self.dimension).astype(np.float32)]

    # -- data -------------------------------------------------------------------------------
    def group_of(self, user: int) -> int:
        """Group of training or validation user ``user``: ``user % G``."""
        return user % self.num_groups

    def _dataset(self, purpose: str, index: int) -> Dataset:
        group = self.group_of(index)
        x, noise = self._features_and_noise(purpose, index)
        y = x @ self._optima[group] + noise
        return Dataset(
            x=x, y=y, group=np.full(len(y), group, dtype=np.int64), user=f"{purpose}-{index}"
        )

    # -- scoring and training ----------------------------------------------------------------
    def loss(self, params: Params, data: Dataset) -> float:
        """RMSE of the linear model on ``data`` (computed in float64)."""
        self._check(params)
        weights = np.asarray(params[0], dtype=np.float64)
        return rmse(data.x @ weights - data.y)

    def predict(self, params: Params, x: np.ndarray) -> np.ndarray:
        """Return the linear model's values ``x @ w`` (float64)."""
        self._check(params)
        return np.asarray(x, dtype=np.float64) @ np.asarray(params[0], dtype=np.float64)

    def _fit(self, params: Params, data: Dataset, schedule: Schedule, device: str) -> Params:
        """Mini-batch gradient descent on the RMSE, float64 inside; ``device`` is ignored."""
        weights = np.array(params[0], dtype=np.float64)
        x = np.asarray(data.x, dtype=np.float64)
        y = np.asarray(data.y, dtype=np.float64)
        for batch in schedule.batches(len(data)):
            weights -= schedule.learning_rate * rmse_gradient(weights, x[batch], y[batch])
        return [weights.astype(np.float32)]
