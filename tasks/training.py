"""Local training's plan: the checked SGD arguments and the batches they give.

`tasks.base.Task.train` checks its arguments here and hands a `Schedule` to the task's own
training loop, so every task shuffles and batches alike and reports a bad argument alike.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from settings import SETTINGS, SettingError

__all__ = ["Schedule", "check_training_args", "minibatches"]


#: Each argument of local training and the setting that declares its bounds.
_DECLARED = {"epochs": "local-epochs", "learning_rate": "learning-rate", "batch_size": "batch-size"}


def check_training_args(epochs: int, learning_rate: float, batch_size: int) -> None:
    """Raise ``ValueError`` naming the argument when it is outside its setting's declared bounds.

    The bounds are the declarations' (``local-epochs``, ``learning-rate``, ``batch-size`` in
    :mod:`settings.declarations`); an argument must also be a number of the setting's type (an
    integer for the integer settings), not its spelling in a string.
    """
    for arg, value in (("epochs", epochs), ("learning_rate", learning_rate),
                       ("batch_size", batch_size)):
        declared = SETTINGS[_DECLARED[arg]]
        number = value.item() if isinstance(value, np.generic) else value
        kinds = int if declared.type is int else int | float
        ok = isinstance(number, kinds) and not isinstance(number, bool)
        if ok:
            try:
                declared.parse(number)
            except SettingError:
                ok = False
        if not ok:
            raise ValueError(f"{arg} must be {declared.allowed()} (the {declared.name} setting), "
                             f"got {arg}={value!r}")


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
