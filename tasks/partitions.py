"""Users and partitions: which training users a partition is, and the seeds of their data.

Pure helpers of the task contract (:mod:`tasks.base`), apart so that a task module can use
them without the `Task` class.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from tasks.config import TaskSettingsError

__all__ = ["SPLIT_CODES", "UNLIMITED_USERS", "resolve_users", "user_seed"]

#: A count of training users no ``users`` / ``num-partitions`` can pass (generated users, or a
#: count known only from the data).
UNLIMITED_USERS = 2**62

#: Codes that keep the random streams of different purposes apart in `user_seed`.
SPLIT_CODES: Mapping[str, int] = {"train": 0, "validation": 1, "partition": 2, "rotation": 3}


def user_seed(data_seed: int, purpose: str, index: int) -> np.random.SeedSequence:
    """Return the seed of one user's data, the same in every process.

    Parameters
    ----------
    data_seed : int
        The run's public ``data-seed``.
    purpose : str
        ``"train"``, ``"validation"``, ``"partition"`` or ``"rotation"``: keeps streams apart.
    index : int
        The user's index within its purpose (or any non-negative integer key).

    Returns
    -------
    np.random.SeedSequence
        ``SeedSequence([data_seed, code(purpose), index])``.
    """
    return np.random.SeedSequence([int(data_seed), SPLIT_CODES[purpose], int(index)])


def resolve_users(users: int, partition_id: int, num_partitions: int, *, available: int) -> int:
    """Check a partition against the ``users`` setting; return the number of training users.

    Parameters
    ----------
    users : int
        The ``users`` setting; 0 means one user per partition (``num_partitions``).
    partition_id, num_partitions : int
        The Flower partition.
    available : int
        How many training users the task can provide.

    Returns
    -------
    int
        The number of training users (``users`` or ``num_partitions``).

    Raises
    ------
    TaskSettingsError
        Naming ``users`` / ``num-partitions`` / ``partition-id`` when they do not fit.
    """
    if isinstance(num_partitions, bool) or num_partitions < 1:
        raise TaskSettingsError(f"num-partitions must be >= 1, got num-partitions={num_partitions}")
    if not 0 <= partition_id < num_partitions:
        raise TaskSettingsError(
            f"partition-id must be in [0, num-partitions={num_partitions}), "
            f"got partition-id={partition_id}"
        )
    effective = users if users > 0 else num_partitions
    if users > 0 and users != num_partitions:
        raise TaskSettingsError(
            f"users={users} does not match num-partitions={num_partitions}: one partition is "
            "one user (set users=0 to use num-partitions)"
        )
    if effective > available:
        raise TaskSettingsError(
            f"users={effective} (num-partitions={num_partitions} when users=0) exceeds the "
            f"{available} training users this task's data provides"
        )
    return effective
