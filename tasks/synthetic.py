"""Synthetic linear regression with one optimum per group (seeds/001, section 4.1).

User ``u`` belongs to group ``g = u % G`` and holds ``samples-per-user`` pairs

    x ~ N(0, I_n),   y = xᵀθ*_g + u,   u ~ Uniform[0, 1)

The paper gives θ*_1 = [5, 6], θ*_2 = [4, -4.5] and the noise, but not the distribution of x;
a standard normal is our choice. The model is linear with exactly n parameters and no intercept
(the paper's θ ∈ R²), so even at θ*_g the loss is the RMS of the noise, ≈ sqrt(1/3) ≈ 0.577.
The loss is the RMSE (the paper's Eq. 15) and training is mini-batch gradient descent on it.

Pure NumPy: importing this module must not import torch or scikit-learn, because a Flower
ClientApp process is started for every message.

Each user's data come from ``SeedSequence([data-seed, purpose, index])`` (see
`tasks.base.user_seed`), so any process regenerates the same bytes without coordination.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

import settings
from settings import SETTINGS
from tasks.base import (
    Dataset,
    Params,
    Task,
    check_training_args,
    minibatches,
    resolve_users,
    user_seed,
)
from tasks.config import TaskSettingsError, require_at_least

__all__ = ["SyntheticTask", "optima_array", "rmse", "rmse_gradient"]


def optima_array(optima: str | Sequence[Sequence[float]] | np.ndarray) -> np.ndarray:
    """Return the ``optima`` setting (its spelling ``"5,6;4,-4.5"`` or an array) as (G, n) floats.

    A string is checked and parsed by the settings schema (`settings.parse_optima`).

    Returns
    -------
    np.ndarray
        float64, shape (G, n), read-only.

    Raises
    ------
    settings.SettingError
        If the string is not one or more vectors of the same length; `TaskSettingsError` if an
        array is not (G, n) with G, n >= 1 or holds a non-finite number.
    """
    if isinstance(optima, str):
        theta = np.array(settings.parse_optima(SETTINGS["optima"].parse(optima)), dtype=np.float64)
    else:
        theta = np.array(optima, dtype=np.float64)
        if theta.ndim != 2 or theta.shape[0] < 1 or theta.shape[1] < 1:
            raise TaskSettingsError(f"optima must have shape (groups, n), got shape {theta.shape}")
        if not np.all(np.isfinite(theta)):
            raise TaskSettingsError(f"optima must hold finite numbers, got optima={optima!r}")
    theta.setflags(write=False)
    return theta


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


class SyntheticTask(Task):
    """Linear regression on users drawn from ``G`` linear models (one optimum per group).

    Each argument named after a setting (``validation_users``: ``validation-users``) takes the
    default of `settings.schema` and is checked by it, with the run config's messages.

    Parameters
    ----------
    optima : array-like or str
        θ*_g, shape (G, n), or the run-config spelling ``"5,6;4,-4.5"``.
    users : int
        Number of training users; 0 means one per Flower partition.
    samples_per_user : int
        Samples each user holds.
    validation_users : int
        Held-out users (group ``v % G`` for validation user ``v``).
    data_seed : int
        Public seed of the data.
    """

    name = "synthetic"
    is_classifier = False

    def __init__(
        self,
        optima: str | Sequence[Sequence[float]] | np.ndarray = SETTINGS["optima"].default,
        *,
        users: int = SETTINGS["users"].default,
        samples_per_user: int = SETTINGS["samples-per-user"].default,
        validation_users: int = SETTINGS["validation-users"].default,
        data_seed: int = SETTINGS["data-seed"].default,
    ) -> None:
        self._optima = optima_array(optima)
        self.users: int = SETTINGS["users"].parse(users)
        self.samples_per_user: int = SETTINGS["samples-per-user"].parse(samples_per_user)
        self.validation_users = require_at_least(
            "validation-users", SETTINGS["validation-users"].parse(validation_users), 1,
            task=self.name,
        )
        self.data_seed: int = SETTINGS["data-seed"].parse(data_seed)

    @classmethod
    def from_run_config(cls, config: Mapping[str, Any]) -> SyntheticTask:
        """Build from ``optima``, ``users``, ``samples-per-user``, ``validation-users``, etc."""
        return cls(
            settings.read(config, "optima"),
            users=settings.read(config, "users"),
            samples_per_user=settings.read(config, "samples-per-user"),
            validation_users=settings.read(config, "validation-users"),
            data_seed=settings.read(config, "data-seed"),
        )

    # -- model ------------------------------------------------------------------------------
    @property
    def optima(self) -> np.ndarray:
        """θ*_g as a read-only float64 array of shape (G, n)."""
        return self._optima

    @property
    def num_groups(self) -> int:
        """Number of groups G."""
        return int(self._optima.shape[0])

    @property
    def dimension(self) -> int:
        """Dimension n of x and of the model."""
        return int(self._optima.shape[1])

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
        rng = np.random.default_rng(user_seed(self.data_seed, purpose, index))
        group = self.group_of(index)
        m = self.samples_per_user
        x = rng.standard_normal((m, self.dimension))
        noise = rng.random(m)
        y = x @ self._optima[group] + noise
        return Dataset(x=x, y=y, group=np.full(m, group, dtype=np.int64), user=f"{purpose}-{index}")

    def client_dataset(self, partition_id: int, num_partitions: int) -> Dataset:
        """Training data of user ``partition_id`` (group ``partition_id % G``)."""
        resolve_users(self.users, partition_id, num_partitions, available=2**62)
        return self._dataset("train", partition_id)

    def validation_datasets(self) -> list[Dataset]:
        """Return the ``validation-users`` held-out users, generated from their own seeds."""
        return [self._dataset("validation", v) for v in range(self.validation_users)]

    # -- scoring and training ----------------------------------------------------------------
    def loss(self, params: Params, data: Dataset) -> float:
        """RMSE of the linear model on ``data`` (computed in float64)."""
        self._check(params)
        weights = np.asarray(params[0], dtype=np.float64)
        return rmse(data.x @ weights - data.y)

    def train(
        self,
        params: Params,
        data: Dataset,
        *,
        epochs: int,
        learning_rate: float,
        batch_size: int,
        rng: np.random.Generator,
        device: str = "auto",
    ) -> Params:
        """Mini-batch gradient descent on the RMSE, float64 inside; ``device`` is ignored."""
        self._check(params)
        check_training_args(epochs, learning_rate, batch_size)
        weights = np.array(params[0], dtype=np.float64)
        x = np.asarray(data.x, dtype=np.float64)
        y = np.asarray(data.y, dtype=np.float64)
        for _ in range(epochs):
            for batch in minibatches(len(data), batch_size, rng):
                weights -= learning_rate * rmse_gradient(weights, x[batch], y[batch])
        return [weights.astype(np.float32)]
