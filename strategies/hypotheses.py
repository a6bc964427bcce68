"""The k hypotheses as one (k, n) float32 matrix, and back to Flower's lists of layers.

The strategy computes on the matrix (one row per hypothesis, the layers' values concatenated in
order); Flower and ``evaluate_fn`` see lists of layer arrays. These two functions are the only
place that knows the layout.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = ["check_saved", "split_layers", "stack_hypotheses"]


def stack_hypotheses(
    hypotheses: Sequence[Sequence[np.ndarray]],
) -> tuple[list[tuple[int, ...]], np.ndarray]:
    """Check the k hypotheses and return (layer shapes, k × n float32 matrix).

    Parameters
    ----------
    hypotheses : sequence of sequence of np.ndarray
        k ≥ 1 hypotheses, each L ≥ 1 numeric layers with the shapes of hypothesis 0.

    Returns
    -------
    shapes : list of tuple of int
        The layer shapes of one hypothesis.
    flat : np.ndarray
        (k, n) float32, a new matrix: row j is hypothesis j's layers, raveled and concatenated.

    Raises
    ------
    ValueError
        If there is no hypothesis, no layer or no parameter, or a hypothesis has other shapes,
        non-numeric layers or non-finite values (the message names ``initial_hypotheses[j]``).
    """
    if len(hypotheses) == 0:
        raise ValueError("initial_hypotheses must hold at least one hypothesis, got none")
    first = [np.asarray(layer) for layer in hypotheses[0]]
    if not first:
        raise ValueError("initial_hypotheses[0] has no layers")
    shapes = [layer.shape for layer in first]
    n = sum(math.prod(shape) for shape in shapes)
    if n == 0:
        raise ValueError("initial_hypotheses[0] has no parameters (all layers are empty)")
    flat = np.empty((len(hypotheses), n), dtype=np.float32)
    for j, layers in enumerate(hypotheses):
        arrays = [np.asarray(layer) for layer in layers]
        if [a.shape for a in arrays] != shapes:
            raise ValueError(
                f"initial_hypotheses[{j}] has layer shapes {[a.shape for a in arrays]}, "
                f"expected {shapes} like initial_hypotheses[0]"
            )
        if any(not np.issubdtype(a.dtype, np.number) for a in arrays):
            raise ValueError(f"initial_hypotheses[{j}] has non-numeric layers")
        flat[j] = np.concatenate([a.ravel() for a in arrays])
        if not np.isfinite(flat[j]).all():
            raise ValueError(f"initial_hypotheses[{j}] has non-finite values")
    return shapes, flat


def split_layers(flat: np.ndarray, shapes: Sequence[tuple[int, ...]]) -> list[list[np.ndarray]]:
    """Return each row of a (k, n) matrix as a list of layer views (no copy).

    Parameters
    ----------
    flat : np.ndarray
        (k, n), n the total size of ``shapes``.
    shapes : sequence of tuple of int
        The layer shapes of one hypothesis, in order.

    Returns
    -------
    list of list of np.ndarray
        k lists of L arrays that share memory with ``flat``: copy them before handing them
        to code that may write.
    """
    offsets = [0]
    for shape in shapes:
        offsets.append(offsets[-1] + math.prod(shape))
    return [
        [
            flat[j, start:stop].reshape(shape)
            for start, stop, shape in zip(offsets[:-1], offsets[1:], shapes, strict=True)
        ]
        for j in range(flat.shape[0])
    ]


def check_saved(
    shapes: Sequence[tuple[int, ...]], flat: np.ndarray, best: np.ndarray, like: np.ndarray,
    like_shapes: Sequence[tuple[int, ...]],
) -> None:
    """Check a checkpoint's hypotheses against the run's before they replace them.

    Parameters
    ----------
    shapes : sequence of tuple of int
        The layer shapes the checkpoint names.
    flat, best : np.ndarray
        The checkpoint's current and best hypotheses, (k, n) each.
    like : np.ndarray
        The run's (k, n) hypotheses.
    like_shapes : sequence of tuple of int
        The run's layer shapes.

    Raises
    ------
    ValueError
        If the number of hypotheses, the shapes or the layers differ, or a value is not finite.
    """
    if list(shapes) != list(like_shapes) or flat.shape != like.shape or best.shape != flat.shape:
        raise ValueError(
            f"the checkpoint holds {flat.shape[0]} hypotheses of layer shapes {list(shapes)}, "
            f"this run has {like.shape[0]} of {list(like_shapes)}"
        )
    if not (np.isfinite(flat).all() and np.isfinite(best).all()):
        raise ValueError("the checkpoint's hypotheses are not finite")
