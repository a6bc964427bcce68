"""Rotated digits: scikit-learn's bundled 8×8 digits split over users, with the FEMNIST protocol.

The 1797 images of ``sklearn.datasets.load_digits`` (no download) are shuffled once with a
permutation drawn from ``data-seed``. The last 20 % (359 images) belong to the
``validation-users`` held-out users, the first 80 % (1438) to the ``users`` training users; each
part is cut into contiguous, near-equal slices (``np.array_split``), one per user. Every user's
images are rotated 90° counter-clockwise with probability ``rotate-probability``, once per user
(not per image), as seeds/001 does for FEMNIST: this makes two groups, ``Dataset.group`` = 1 for
rotated users. Pixels are scaled from 0..16 to [0, 1].

The model is Table 3's CNN sized for 8×8 inputs and 10 classes (`tasks.torch_support.table3_cnn`
with 2×2 kernels): 83,562 parameters; the loss is the mean cross-entropy.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import numpy as np
from torch import nn

from tasks.base import Dataset, resolve_users, user_seed
from tasks.config import TaskSettingsError, get_float, get_int, get_str
from tasks.torch_support import TorchTask, from_arrays, table3_cnn, to_arrays

__all__ = ["VALIDATION_FRACTION", "DigitsTask", "digits_cnn", "from_arrays", "to_arrays"]

#: Share of the images reserved for validation users.
VALIDATION_FRACTION = 0.2
NUM_CLASSES = 10
IMAGE_SIZE = 8


def digits_cnn() -> nn.Sequential:
    """Table 3's CNN for 8×8 images and 10 classes (2×2 kernels)."""
    return table3_cnn(IMAGE_SIZE, NUM_CLASSES, kernel_size=2)


@functools.lru_cache(maxsize=1)
def _load_digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = np.asarray(bunch.images, dtype=np.float32) / np.float32(16.0)
    labels = np.asarray(bunch.target, dtype=np.int64)
    images.setflags(write=False)
    labels.setflags(write=False)
    return images, labels


class DigitsTask(TorchTask):
    """Digits classification over users, half of them (in expectation) seeing rotated images.

    Parameters
    ----------
    users : int
        Training users; 0 means one per Flower partition. At most 1438.
    validation_users : int
        Held-out users sharing the reserved 359 images; 1 to 359.
    rotate_probability : float
        Probability that a user's images are rotated, in [0, 1].
    data_seed : int
        Seed of the permutation and of the rotations.
    device : str
        Device for scoring (`loss`, `evaluate`).
    """

    name = "digits"
    is_classifier = True

    def __init__(
        self,
        *,
        users: int = 0,
        validation_users: int = 20,
        rotate_probability: float = 0.5,
        data_seed: int = 0,
        device: str = "auto",
    ) -> None:
        super().__init__(device=device)
        settings = {
            "users": users,
            "validation-users": validation_users,
            "rotate-probability": rotate_probability,
            "data-seed": data_seed,
        }
        self.users = get_int(settings, "users", 0, minimum=0)
        self.validation_users = get_int(settings, "validation-users", 20, minimum=1)
        self.rotate_probability = get_float(
            settings, "rotate-probability", 0.5, minimum=0.0, maximum=1.0
        )
        self.data_seed = get_int(settings, "data-seed", 0, minimum=0)
        images, _ = _load_digits()
        order = np.random.default_rng(user_seed(self.data_seed, "partition", 0)).permutation(
            images.shape[0]
        )
        num_validation = round(VALIDATION_FRACTION * images.shape[0])
        self._train_images = order[: images.shape[0] - num_validation]
        self._validation_images = order[images.shape[0] - num_validation :]
        if self.validation_users > num_validation:
            raise TaskSettingsError(
                f"validation-users must be <= {num_validation} (one image each at least), "
                f"got validation-users={self.validation_users}"
            )

    @classmethod
    def from_run_config(cls, config: Mapping[str, Any]) -> DigitsTask:
        """Build from ``users``, ``validation-users``, ``rotate-probability``, ``data-seed``."""
        return cls(
            users=get_int(config, "users", 0, minimum=0),
            validation_users=get_int(config, "validation-users", 20, minimum=1),
            rotate_probability=get_float(
                config, "rotate-probability", 0.5, minimum=0.0, maximum=1.0
            ),
            data_seed=get_int(config, "data-seed", 0, minimum=0),
            device=get_str(config, "device", "auto"),
        )

    def model(self) -> nn.Module:
        """Build a fresh `digits_cnn`."""
        return digits_cnn()

    @property
    def num_training_images(self) -> int:
        """Images shared by the training users (80 % of 1797)."""
        return int(self._train_images.shape[0])

    def _dataset(self, purpose: str, index: int, indices: np.ndarray) -> Dataset:
        images, labels = _load_digits()
        rng = np.random.default_rng(user_seed(self.data_seed, purpose, index))
        rotated = bool(rng.random() < self.rotate_probability)
        x = images[indices]
        if rotated:
            x = np.rot90(x, k=1, axes=(1, 2))  # counter-clockwise, as in the paper
        return Dataset(
            x=np.ascontiguousarray(x[:, None, :, :], dtype=np.float32),
            y=labels[indices].copy(),
            group=np.full(indices.shape[0], int(rotated), dtype=np.int64),
            user=f"{purpose}-{index}",
        )

    def client_dataset(self, partition_id: int, num_partitions: int) -> Dataset:
        """Training slice ``partition_id`` of the 1438 training images, rotated or not."""
        users = resolve_users(
            self.users, partition_id, num_partitions, available=self.num_training_images
        )
        part = np.array_split(self._train_images, users)[partition_id]
        return self._dataset("train", partition_id, part)

    def validation_datasets(self) -> list[Dataset]:
        """Return the held-out users on the reserved 359 images."""
        parts = np.array_split(self._validation_images, self.validation_users)
        return [self._dataset("validation", v, part) for v, part in enumerate(parts)]
