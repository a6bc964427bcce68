"""FEMNIST from LEAF's JSON files (paper 001, section 4.3), with per-user rotation.

``data-path`` is a LEAF JSON file or a directory of them (``*.json`` directly inside, read in
name order), each ``{"users": [...], "num_samples": [...], "user_data": {uid: {"x": [[784
floats]], "y": [ints]}}}``. Users are taken in the order the files list them; a user listed in
several files gets its samples concatenated (so pointing at LEAF's ``train`` folder, or at
``all_data``, both work; do not mix ``train`` and ``test`` files in one folder unless that is
what you mean). One partition is one LEAF user: partition ``p`` is user ``p``; the last
``validation-users`` users are held out for validation.

Each user's images are rotated 90° counter-clockwise with probability ``rotate-probability``,
drawn once per user from ``data-seed`` and the CRC-32 of the user id (so the choice does not
depend on file order); ``Dataset.group`` = 1 for rotated users.

The model is Table 3's CNN for 28×28 inputs and 62 classes. Table 3 prints 2×2 kernels, but the
paper's parameter count n₀ = 1,206,590 is what 3×3 kernels give (2×2 gives 1,400,990), so 3×3 is
the default here (``kernel_size`` argument).
"""

from __future__ import annotations

import functools
import json
import os
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from torch import nn

from settings import SETTINGS
from tasks.base import Dataset, resolve_users, user_seed
from tasks.config import TaskSettingsError, require_data_path
from tasks.torch_support import TorchTask, draw_rotation, image_dataset, table3_cnn

__all__ = ["FemnistTask", "LeafData", "femnist_cnn", "load_leaf"]

IMAGE_SIZE = 28
NUM_CLASSES = 62
#: Parameter count that paper 001 reports for its FEMNIST CNN.
PAPER_NUM_PARAMETERS = 1_206_590


def femnist_cnn(kernel_size: int = 3) -> nn.Sequential:
    """Table 3's CNN for 28×28 images and 62 classes."""
    return table3_cnn(IMAGE_SIZE, NUM_CLASSES, kernel_size=kernel_size)


@dataclass(frozen=True)
class LeafData:
    """Samples of every LEAF user, in file order."""

    users: tuple[str, ...]
    images: Mapping[str, np.ndarray]  # uid -> float32 (n, 28, 28)
    labels: Mapping[str, np.ndarray]  # uid -> int64 (n,)


def _json_files(path: Path) -> list[Path]:
    if not path.exists():
        raise TaskSettingsError(f"data-path={str(path)!r} does not exist (LEAF FEMNIST JSON)")
    if path.is_file():
        return [path]
    files = sorted(p for p in path.glob("*.json") if p.is_file())
    if not files:
        raise TaskSettingsError(f"data-path={str(path)!r} holds no *.json file (LEAF FEMNIST)")
    return files


def load_leaf(data_path: str | Path) -> LeafData:
    """Read LEAF FEMNIST JSON files (cached per process while the files are unchanged).

    Raises
    ------
    TaskSettingsError
        Naming ``data-path`` when it is missing, empty or not in LEAF's format.
    """
    files = _json_files(Path(data_path).expanduser().resolve())
    stamp = tuple((str(f), f.stat().st_mtime_ns, f.stat().st_size) for f in files)
    return _load_leaf_cached(stamp)


@functools.lru_cache(maxsize=2)
def _load_leaf_cached(stamp: tuple[tuple[str, int, int], ...]) -> LeafData:
    order: list[str] = []
    images: dict[str, list[np.ndarray]] = {}
    labels: dict[str, list[np.ndarray]] = {}
    for name, _, _ in stamp:
        try:
            with open(name, encoding="utf-8") as handle:
                content = json.load(handle)
            listed = [str(uid) for uid in content["users"]]
            user_data = content["user_data"]
            for uid in listed:
                record = user_data[uid]
                x = np.asarray(record["x"], dtype=np.float32)
                y = np.asarray(record["y"], dtype=np.int64)
                if x.ndim != 2 or x.shape[1] != IMAGE_SIZE * IMAGE_SIZE or x.shape[0] != y.shape[0]:
                    raise ValueError(
                        f"user {uid!r}: x must be (n, {IMAGE_SIZE * IMAGE_SIZE}) with one y each, "
                        f"got x {x.shape}, y {y.shape}"
                    )
                if y.size and (y.min() < 0 or y.max() >= NUM_CLASSES):
                    raise ValueError(f"user {uid!r}: labels must be in [0, {NUM_CLASSES})")
                if uid not in images:
                    order.append(uid)
                    images[uid], labels[uid] = [], []
                images[uid].append(x.reshape(-1, IMAGE_SIZE, IMAGE_SIZE))
                labels[uid].append(y)
        except (OSError, KeyError, TypeError, ValueError) as error:
            raise TaskSettingsError(
                f"data-path: {name!r} is not a LEAF FEMNIST JSON file ({type(error).__name__}: "
                f"{error})"
            ) from error
    users = tuple(uid for uid in order if sum(a.shape[0] for a in images[uid]) > 0)
    merged_x = {uid: np.concatenate(images[uid]) for uid in users}
    merged_y = {uid: np.concatenate(labels[uid]) for uid in users}
    for array in (*merged_x.values(), *merged_y.values()):
        array.setflags(write=False)
    return LeafData(users=users, images=merged_x, labels=merged_y)


class FemnistTask(TorchTask):
    """FEMNIST character recognition, one LEAF user per partition, rotated users as a group.

    Parameters
    ----------
    data_path : str or os.PathLike
        The setting ``data-path``: a LEAF JSON file or directory.
    users : int
        Training users; 0 means one per Flower partition.
    validation_users : int
        The last ``validation_users`` LEAF users, held out.
    rotate_probability : float
        Probability that a user's images are rotated.
    data_seed : int
        Seed of the rotations.
    device : str
        Device for scoring.
    kernel_size : int
        Convolution kernel (3 matches the paper's parameter count; Table 3 prints 2).
    """

    name = "femnist"
    is_classifier = True
    run_config_keys = (
        "data-path", "users", "validation-users", "rotate-probability", "data-seed", "device",
    )

    def __init__(
        self,
        data_path: str | os.PathLike[str],
        *,
        users: int = SETTINGS["users"].default,
        validation_users: int = SETTINGS["validation-users"].default,
        rotate_probability: float = SETTINGS["rotate-probability"].default,
        data_seed: int = SETTINGS["data-seed"].default,
        device: str = SETTINGS["device"].default,
        kernel_size: int = 3,
    ) -> None:
        super().__init__(device=device)
        self.data_path = require_data_path(
            data_path, task=self.name, what="the LEAF FEMNIST JSON files"
        )
        self._set_user_settings(users, validation_users, data_seed)
        self.rotate_probability: float = SETTINGS["rotate-probability"].parse(rotate_probability)
        self.kernel_size = kernel_size
        self._data = load_leaf(self.data_path)
        if self.validation_users >= len(self._data.users):
            raise TaskSettingsError(
                f"validation-users must be < the {len(self._data.users)} users in "
                f"data-path={self.data_path!r}, got validation-users={self.validation_users}"
            )

    @classmethod
    def declared_shapes(cls, config: Mapping[str, Any]) -> list[tuple[int, ...]] | None:
        """Return `femnist_cnn`'s shapes: the default kernel, which no run config changes."""
        return [tuple(t.shape) for t in femnist_cnn().state_dict().values()]

    def model(self) -> nn.Module:
        """Build a fresh `femnist_cnn`."""
        return femnist_cnn(self.kernel_size)

    @property
    def training_users(self) -> tuple[str, ...]:
        """LEAF ids of the users that may train (all but the last ``validation-users``)."""
        return self._data.users[: len(self._data.users) - self.validation_users]

    @property
    def held_out_users(self) -> tuple[str, ...]:
        """LEAF ids of the validation users."""
        return self._data.users[len(self._data.users) - self.validation_users :]

    def is_rotated(self, uid: str) -> bool:
        """Whether user ``uid``'s images are rotated (a function of ``data-seed`` and ``uid``)."""
        seed = user_seed(self.data_seed, "rotation", zlib.crc32(uid.encode("utf-8")))
        return draw_rotation(seed, self.rotate_probability)

    def _dataset(self, uid: str) -> Dataset:
        labels = self._data.labels[uid].copy()
        return image_dataset(self._data.images[uid], labels, rotated=self.is_rotated(uid), user=uid)

    def client_dataset(self, partition_id: int, num_partitions: int) -> Dataset:
        """Return the samples of training user ``partition_id`` (file order)."""
        resolve_users(self.users, partition_id, num_partitions, available=len(self.training_users))
        return self._dataset(self.training_users[partition_id])

    def validation_datasets(self) -> list[Dataset]:
        """Return the last ``validation-users`` LEAF users."""
        return [self._dataset(uid) for uid in self.held_out_users]
