"""Rotated digits: scikit-learn's bundled 8×8 digits split over users, with the FEMNIST protocol.

The 1797 images of ``sklearn.datasets.load_digits`` (no download) are shuffled once with a
permutation drawn from ``data-seed``. The last 20 % (359 images) belong to the
``validation-users`` held-out users, the first 80 % (1438) to the ``users`` training users; each
part is cut into contiguous, near-equal slices (``np.array_split``), one per user. Every user's
images are rotated 90° counter-clockwise with probability ``rotate-probability``, once per user
(not per image), as paper 001 does for FEMNIST: this makes two groups, ``Dataset.group`` = 1 for
rotated users. Pixels are scaled from 0..16 to [0, 1].

``partition = "dirichlet"`` replaces the equal slices by the label-skewed split of paper 002
(section 5.3): for every class, the shares of its training images that go to each user are
drawn from Dir(``dirichlet-alpha``·1), as in Hsu et al. 2019; small α gives each user few
classes. The draw is repeated (up to 100 times, seeded) until every user holds at least one image.

``model = "cnn"`` (default) is Table 3's CNN sized for 8×8 inputs and 10 classes
(`tasks.torch_support.table3_cnn` with 2×2 kernels): 83,562 parameters. ``model = "logistic"``
is the multinomial logistic regression 002 trains on these digits: 64·10 + 10 = 650 parameters.
``loss`` is ``"cross-entropy"`` (default) or ``"rmse"``, the RMSE between the predicted class
probabilities and the one-hot labels (001 Table 2 reports both).

``labels = "parity"`` turns the task into thesis 004's fairness protocol on images (section
2.5.2, Figure 2.8): two classes, 1 for an even digit and 0 for an odd one for upright users, the
opposite for rotated users (the minority, with ``rotate-probability`` 0.2 as in the thesis).
`evaluate` then adds the group-fairness gaps of `tasks.fairness.fairness_metrics`, the
sensitive attribute being whether a user's images are upright.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
from torch import nn

from settings import SETTINGS
from tasks.base import Dataset, Params, resolve_users, user_seed
from tasks.config import TaskSettingsError
from tasks.fairness import evaluate_with_fairness
from tasks.torch_support import (
    TorchTask,
    draw_rotation,
    from_arrays,
    image_dataset,
    table3_cnn,
    to_arrays,
)

__all__ = [
    "LABELINGS",
    "LOSSES",
    "MODELS",
    "PARTITIONS",
    "VALIDATION_FRACTION",
    "DigitsTask",
    "digits_cnn",
    "digits_logistic",
    "dirichlet_split",
    "from_arrays",
    "to_arrays",
]

#: Share of the images reserved for validation users.
VALIDATION_FRACTION = 0.2
NUM_CLASSES = 10
IMAGE_SIZE = 8
MODELS = SETTINGS["model"].choices
LABELINGS = SETTINGS["labels"].choices
PARTITIONS = SETTINGS["partition"].choices
LOSSES = SETTINGS["loss"].choices
#: Redraws of the Dirichlet shares before giving up on a split where every user has an image.
_DIRICHLET_TRIES = 100


def digits_cnn(num_classes: int = NUM_CLASSES) -> nn.Sequential:
    """Table 3's CNN for 8×8 images (2×2 kernels); 83,562 parameters for 10 classes."""
    return table3_cnn(IMAGE_SIZE, num_classes, kernel_size=2)


def digits_logistic(num_classes: int = NUM_CLASSES) -> nn.Sequential:
    """Multinomial logistic regression on the 64 pixels (paper 002's model): 650 parameters."""
    return nn.Sequential(nn.Flatten(), nn.Linear(IMAGE_SIZE * IMAGE_SIZE, num_classes))


def dirichlet_split(
    labels: np.ndarray, users: int, alpha: float, rng: np.random.Generator
) -> list[np.ndarray]:
    """Split sample positions over ``users`` with Dirichlet(α) label skew.

    For each class, its positions (in the given order) are cut into ``users`` runs whose
    lengths follow shares drawn from Dir(α·1). The draw is repeated until every user holds at
    least one sample.

    Parameters
    ----------
    labels : np.ndarray
        The label of every sample, shape ``(m,)``.
    users : int
        Number of users, at most ``m``.
    alpha : float
        Concentration, > 0: small values give each user few classes, large ones near-IID.
    rng : np.random.Generator
        Source of the shares.

    Returns
    -------
    list of np.ndarray
        For each user, the sorted positions of its samples; together a partition of
        ``range(m)``.

    Raises
    ------
    TaskSettingsError
        If no split with a sample for every user was found in 100 draws.
    """
    labels = np.asarray(labels)
    for _ in range(_DIRICHLET_TRIES):
        parts: list[list[np.ndarray]] = [[] for _ in range(users)]
        for cls in np.unique(labels):
            positions = np.flatnonzero(labels == cls)
            shares = rng.dirichlet(np.full(users, alpha))
            cuts = np.round(np.cumsum(shares)[:-1] * positions.shape[0]).astype(np.int64)
            for user, chunk in enumerate(np.split(positions, cuts)):
                parts[user].append(chunk)
        split = [np.sort(np.concatenate(p)) for p in parts]
        if min(p.shape[0] for p in split) > 0:
            return split
    raise TaskSettingsError(
        f"partition='dirichlet' left a user without images in {_DIRICHLET_TRIES} draws with "
        f"dirichlet-alpha={alpha} and users={users}: raise dirichlet-alpha or lower users"
    )


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
        Seed of the permutation, of the rotations and of the Dirichlet shares.
    device : str
        Device for scoring (`loss`, `evaluate`).
    model : str
        ``"cnn"`` (Table 3, 83,562 parameters) or ``"logistic"`` (650 parameters).
    partition : str
        ``"contiguous"`` (equal slices: IID labels) or ``"dirichlet"`` (label skew).
    dirichlet_alpha : float
        Concentration of the Dirichlet split, > 0.
    loss : str
        ``"cross-entropy"`` or ``"rmse"`` (probabilities against one-hot labels).
    labels : str
        ``"digit"`` (10 classes) or ``"parity"`` (004's fairness protocol, 2 classes).
    """

    name = "digits"
    is_classifier = True
    run_config_keys = (
        "users", "validation-users", "rotate-probability", "data-seed", "device", "model",
        "partition", "dirichlet-alpha", "loss", "labels",
    )

    def __init__(
        self,
        *,
        users: int = SETTINGS["users"].default,
        validation_users: int = SETTINGS["validation-users"].default,
        rotate_probability: float = SETTINGS["rotate-probability"].default,
        data_seed: int = SETTINGS["data-seed"].default,
        device: str = SETTINGS["device"].default,
        model: str = SETTINGS["model"].default,
        partition: str = SETTINGS["partition"].default,
        dirichlet_alpha: float = SETTINGS["dirichlet-alpha"].default,
        loss: str = SETTINGS["loss"].default,
        labels: str = SETTINGS["labels"].default,
    ) -> None:
        super().__init__(device=device)
        self.model_name: str = SETTINGS["model"].parse(model)
        self.partition: str = SETTINGS["partition"].parse(partition)
        self.labels: str = SETTINGS["labels"].parse(labels)
        self.objective = SETTINGS["loss"].parse(loss)
        self.num_classes = 2 if self.labels == "parity" else NUM_CLASSES
        self.dirichlet_alpha: float = SETTINGS["dirichlet-alpha"].parse(dirichlet_alpha)
        self._splits: dict[int, list[np.ndarray]] = {}
        self._set_user_settings(users, validation_users, data_seed)
        self.rotate_probability: float = SETTINGS["rotate-probability"].parse(rotate_probability)
        images, _ = _load_digits()
        order = np.random.default_rng(user_seed(self.data_seed, "partition", 0)).permutation(
            images.shape[0]
        )
        num_validation = round(VALIDATION_FRACTION * images.shape[0])
        self._train_images = order[: images.shape[0] - num_validation]
        self._validation_images = order[images.shape[0] - num_validation :]
        if self.validation_users > num_validation:
            raise TaskSettingsError(
                f"validation-users must be <= {num_validation} for task digits (one image each "
                f"at least), got validation-users={self.validation_users}"
            )

    def model(self) -> nn.Module:
        """Build a fresh `digits_cnn` or `digits_logistic` (the ``model`` setting)."""
        build = digits_logistic if self.model_name == "logistic" else digits_cnn
        return build(self.num_classes)

    @property
    def num_training_images(self) -> int:
        """Images shared by the training users (80 % of 1797)."""
        return int(self._train_images.shape[0])

    def _dataset(self, purpose: str, index: int, indices: np.ndarray) -> Dataset:
        images, labels = _load_digits()
        rotated = draw_rotation(user_seed(self.data_seed, purpose, index), self.rotate_probability)
        y = labels[indices].copy()
        if self.labels == "parity":
            # 004 section 2.5.2: even -> 1 for the majority, even -> 0 for the rotated minority.
            y = (y % 2 == 0).astype(np.int64)
            if rotated:
                y = 1 - y
        return image_dataset(images[indices], y, rotated=rotated, user=f"{purpose}-{index}")

    def check_partition(self, partition_id: int, num_partitions: int) -> None:
        """Refuse a partition that ``users`` does not fit, or more users than images."""
        resolve_users(self.users, partition_id, num_partitions,
                      available=self.num_training_images)

    def client_dataset(self, partition_id: int, num_partitions: int) -> Dataset:
        """Training slice ``partition_id`` of the 1438 training images, rotated or not."""
        users = resolve_users(
            self.users, partition_id, num_partitions, available=self.num_training_images
        )
        if self.partition == "dirichlet":
            part = self._train_images[self._dirichlet(users)[partition_id]]
        else:
            part = np.array_split(self._train_images, users)[partition_id]
        return self._dataset("train", partition_id, part)

    def _dirichlet(self, users: int) -> list[np.ndarray]:
        # Every process draws the same split: the shares come from data-seed alone.
        if users not in self._splits:
            _, labels = _load_digits()
            rng = np.random.default_rng(user_seed(self.data_seed, "partition", 1))
            self._splits[users] = dirichlet_split(
                labels[self._train_images], users, self.dirichlet_alpha, rng
            )
        return self._splits[users]

    def validation_datasets(self) -> list[Dataset]:
        """Return the held-out users on the reserved 359 images."""
        parts = np.array_split(self._validation_images, self.validation_users)
        return [self._dataset("validation", v, part) for v, part in enumerate(parts)]

    def evaluate(
        self, params_list: Sequence[Params], datasets: Sequence[Dataset]
    ) -> dict[str, float]:
        """Score each user with its best hypothesis; with parity labels add the fairness gaps.

        ``"loss"`` and ``"accuracy"`` are averaged over users. With ``labels="parity"`` the gaps
        of `tasks.fairness.fairness_metrics` are computed over all samples pooled, each
        predicted by its own user's best hypothesis, the privileged group being the upright
        users (the gaps are absolute, so the orientation of the attribute does not matter).
        """
        if self.labels != "parity":
            return super().evaluate(params_list, datasets)
        return evaluate_with_fairness(
            self.user_metrics,
            lambda params, x: self.predict(params, x).argmax(axis=1),
            params_list,
            datasets,
            privileged=lambda data: 1 - data.group,
        )
