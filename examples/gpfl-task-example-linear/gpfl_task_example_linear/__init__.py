"""The gpfl task `example-linear`: linear regression on devices of two groups (replace with yours).

Device ``p`` (its ``partition-id``) holds ``samples-per-user`` points ``(x, y)`` with
``y = w_g · x + noise``, where ``g = p % 2`` picks one of two true weight vectors: a federation
with ``num-hypotheses = 2`` should find both. The data is generated on the device from the run's
public ``data-seed`` and the device's partition; a real plugin would read the device's own
``data-path`` in `client_dataset` instead.
"""

from __future__ import annotations

import numpy as np

from settings import SETTINGS, Setting
from tasks import Dataset, Params, Task
from tasks.base import Schedule, user_seed

__all__ = ["TRUE_WEIGHTS", "ExampleLinearTask"]

#: One true weight vector per group.
TRUE_WEIGHTS = np.array([[3.0, -2.0], [-3.0, 2.0]])
#: The task's own setting: a run sets it in task-settings ("noise-level=0.5"); gpfl checks it
#: against this declaration (a float, at least 0) and `gpfl tasks` lists it.
NOISE_LEVEL = Setting("noise-level", float, 0.1, "example-linear: the standard deviation of "
                      "the noise on y", group="tasks", minimum=0.0)


class ExampleLinearTask(Task):
    """Linear regression, mean squared error, plain mini-batch SGD (NumPy only)."""

    name = "example-linear"
    is_classifier = False
    # gpfl settings this task reads from the run config (absent keys take gpfl's defaults).
    run_config_keys = ("samples-per-user", "validation-users", "data-seed")
    # Its own settings, passed to the constructor like the others (noise_level).
    settings = (NOISE_LEVEL,)

    def __init__(
        self,
        *,
        samples_per_user: int = SETTINGS["samples-per-user"].default,
        validation_users: int = SETTINGS["validation-users"].default,
        data_seed: int = SETTINGS["data-seed"].default,
        noise_level: float = NOISE_LEVEL.default,
    ) -> None:
        self.samples_per_user = SETTINGS["samples-per-user"].parse(samples_per_user)
        self.validation_users = SETTINGS["validation-users"].parse(validation_users)
        self.data_seed = SETTINGS["data-seed"].parse(data_seed)
        self.noise_level = NOISE_LEVEL.parse(noise_level)

    # -- the model: one weight vector ------------------------------------------------------
    @property
    def parameter_shapes(self) -> list[tuple[int, ...]]:
        """One layer: the weights, shape (2,)."""
        return [(TRUE_WEIGHTS.shape[1],)]

    def init_parameters(self, rng: np.random.Generator) -> Params:
        """Draw the weights from N(0, I) with the server's generator."""
        return [rng.standard_normal(TRUE_WEIGHTS.shape[1]).astype(np.float32)]

    # -- the data: generated per user ------------------------------------------------------
    def _user(self, purpose: str, index: int) -> Dataset:
        rng = np.random.default_rng(user_seed(self.data_seed, purpose, index))
        group = index % len(TRUE_WEIGHTS)
        x = rng.standard_normal((self.samples_per_user, TRUE_WEIGHTS.shape[1]))
        y = x @ TRUE_WEIGHTS[group] + self.noise_level * rng.standard_normal(self.samples_per_user)
        return Dataset(x=x, y=y, group=np.full(len(y), group, dtype=np.int64),
                       user=f"{purpose}-{index}")

    def client_dataset(self, partition_id: int, num_partitions: int) -> Dataset:
        """Return the data of partition ``partition_id`` (runs on the device)."""
        return self._user("train", partition_id)

    def validation_datasets(self) -> list[Dataset]:
        """Return held-out users of both groups (runs on the server)."""
        return [self._user("validation", i) for i in range(max(self.validation_users, 2))]

    # -- the loss, predictions and local training ------------------------------------------
    def loss(self, params: Params, data: Dataset) -> float:
        """Mean squared error of ``params`` on ``data``."""
        self._check(params)
        return float(np.mean((data.x @ np.asarray(params[0], dtype=np.float64) - data.y) ** 2))

    def predict(self, params: Params, x: np.ndarray) -> np.ndarray:
        """Return the model's values on ``x`` (what ``gpfl predict`` writes)."""
        self._check(params)
        return np.asarray(x, dtype=np.float64) @ np.asarray(params[0], dtype=np.float64)

    def _fit(self, params: Params, data: Dataset, schedule: Schedule, device: str) -> Params:
        """Mini-batch SGD on the mean squared error (``device`` is ignored: NumPy only)."""
        w = np.array(params[0], dtype=np.float64)
        for batch in schedule.batches(len(data)):
            x, y = data.x[batch], data.y[batch]
            w -= schedule.learning_rate * 2.0 * x.T @ (x @ w - y) / len(batch)
        return [w.astype(np.float32)]
