"""What the generated tasks (synthetic, fairness) share: users drawn from public seeds.

Both tasks give user ``u`` ``samples-per-user`` samples x ~ N(0, I_n) and a noise
u ~ Uniform[0, 1) per sample, drawn in that order from ``SeedSequence([data-seed, purpose, u])``
(see `tasks.base.user_seed`), and build the targets from the ``optima`` setting θ (one row per
group). Only the target rule differs, so the tasks implement `GeneratedTask._dataset` alone.

Pure NumPy: importing this module must not import torch or scikit-learn.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence

import numpy as np

import settings
from settings import SETTINGS
from settings.values import MAX_COUNT
from tasks.base import UNLIMITED_USERS, Dataset, Task, resolve_users, user_seed
from tasks.config import TaskSettingsError

__all__ = ["GeneratedTask", "optima_array"]


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


class GeneratedTask(Task):
    """A task whose users are generated from public seeds, with targets built from ``optima``.

    Parameters
    ----------
    optima : array-like or str
        θ, shape (G, n), or the run-config spelling ``"5,6;4,-4.5"``.
    users : int
        Number of training users; 0 means one per Flower partition.
    samples_per_user : int
        Samples each user holds.
    validation_users : int
        Held-out users, at least 1.
    data_seed : int
        Public seed of the data.
    optima_repeat : int
        Each optimum's vector repeated this many times: θ has shape (G, n · optima_repeat), a
        model of a chosen size from a short ``optima`` (benchmarks at 10⁶-10⁷ parameters).
    """

    def __init__(
        self,
        optima: str | Sequence[Sequence[float]] | np.ndarray = SETTINGS["optima"].default,
        *,
        users: int = SETTINGS["users"].default,
        samples_per_user: int = SETTINGS["samples-per-user"].default,
        validation_users: int = SETTINGS["validation-users"].default,
        data_seed: int = SETTINGS["data-seed"].default,
        optima_repeat: int = SETTINGS["optima-repeat"].default,
    ) -> None:
        theta = optima_array(optima)
        repeat: int = SETTINGS["optima-repeat"].parse(optima_repeat)
        if repeat > 1:
            # Bounded like every count: the devices and the server hold several such vectors.
            if theta.shape[1] * repeat > MAX_COUNT:
                raise TaskSettingsError(
                    f"optima-repeat times the optima's length must be at most {MAX_COUNT}, got "
                    f"optima-repeat={repeat} for vectors of length {theta.shape[1]}")
            theta = np.tile(theta, (1, repeat))
            theta.setflags(write=False)
        self._optima = self._check_optima(theta, optima)
        self._set_user_settings(users, validation_users, data_seed)
        self.samples_per_user: int = SETTINGS["samples-per-user"].parse(samples_per_user)

    def _check_optima(
        self, theta: np.ndarray, optima: str | Sequence[Sequence[float]] | np.ndarray
    ) -> np.ndarray:
        """Return ``theta`` (the parsed ``optima``) if the task accepts it; override to restrict."""
        return theta

    @property
    def optima(self) -> np.ndarray:
        """θ as a read-only float64 array of shape (G, n)."""
        return self._optima

    @property
    def dimension(self) -> int:
        """Dimension n of x (the number of features)."""
        return int(self._optima.shape[1])

    # -- data -------------------------------------------------------------------------------
    def _features_and_noise(self, purpose: str, index: int) -> tuple[np.ndarray, np.ndarray]:
        """Draw one user's x (m, n) ~ N(0, I_n), then u (m,) ~ Uniform[0, 1), from its own seed."""
        rng = np.random.default_rng(user_seed(self.data_seed, purpose, index))
        m = self.samples_per_user
        x = rng.standard_normal((m, self.dimension))
        return x, rng.random(m)

    @abstractmethod
    def _dataset(self, purpose: str, index: int) -> Dataset:
        """Build the data of user ``index`` of ``purpose`` (``"train"`` or ``"validation"``)."""

    def client_dataset(self, partition_id: int, num_partitions: int) -> Dataset:
        """Training data of user ``partition_id`` (one partition is one generated user)."""
        resolve_users(self.users, partition_id, num_partitions, available=UNLIMITED_USERS)
        return self._dataset("train", partition_id)

    def validation_datasets(self) -> list[Dataset]:
        """Return the ``validation-users`` held-out users, generated from their own seeds."""
        return [self._dataset("validation", v) for v in range(self.validation_users)]
