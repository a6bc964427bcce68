"""Local training's plan: the checked SGD arguments and the batches they give.

`tasks.base.Task.train` checks its arguments here and hands a `Schedule` to the task's own
training loop, so every task shuffles and batches alike and reports a bad argument alike.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

__all__ = ["Schedule", "check_training_args", "minibatches"]


def check_training_args(epochs: int, learning_rate: float, batch_size: int) -> None:
    """Raise ``ValueError`` naming the argument when a training setting is out of range."""
    if isinstance(epochs, bool) or not isinstance(epochs, int | np.integer) or epochs < 1:
        raise ValueError(f"epochs must be a positive integer, got epochs={epochs!r}")
    if (
        isinstance(batch_size, bool)
        or not isinstance(batch_size, int | np.integer)
        or batch_size < 1
    ):
        raise ValueError(f"batch_size must be a positive integer, got batch_size={batch_size!r}")
    if not (isinstance(learning_rate, int | float) and math.isfinite(learning_rate)) or (
        learning_rate <= 0
    ):
        raise ValueError(
            f"learning_rate must be a positive finite number, got learning_rate={learning_rate!r}"
        )


def minibatches(
    num_samples: int, batch_size: int, rng: np.random.Generator
) -> Iterator[np.ndarray]:
    """Yield the index arrays of one epoch: a permutation drawn from ``rng``, cut in batches."""
    order = rng.permutation(num_samples)
    for start in range(0, num_samples, batch_size):
        yield order[start : start + batch_size]


@dataclass(frozen=True)
class Schedule:
    """The plan of one local training: mini-batch SGD as `Task.train` was asked for it.

    Attributes
    ----------
    epochs : int
        Passes over the data.
    learning_rate : float
        The step.
    batch_size : int
        Samples per batch (the last batch of an epoch may be smaller).
    rng : np.random.Generator
        The only source of the shuffling.
    """

    epochs: int
    learning_rate: float
    batch_size: int
    rng: np.random.Generator

    def batches(self, num_samples: int) -> Iterator[np.ndarray]:
        """Yield the index arrays of every batch, epoch after epoch.

        Each epoch draws its permutation from `rng` when it starts (see `minibatches`), so the
        draws happen in the same order as in a loop of `epochs` calls to `minibatches`.
        """
        for _ in range(self.epochs):
            yield from minibatches(num_samples, self.batch_size, self.rng)
