"""Clipping of a model update, and the L2 sensitivity of a clipped update.

In the local model the "data set" of a release is the client's whole update, and
two neighbouring inputs are any two updates the client could have produced
(replace-one). After clipping, every update lies in a bounded set, whose L2
diameter is the sensitivity that the Gaussian noise is scaled to:

* L2 clipping to norm C: ‖δ − δ′‖₂ ≤ ‖δ‖ + ‖δ′‖ ≤ 2C.
* Element-wise clipping to [−c, c] over n coordinates: each coordinate differs by
  at most 2c, so ‖δ − δ′‖₂ ≤ 2c·√n.

A release centred on the hypothesis the client picked (the Gaussian mechanism)
also moves with that choice, by at most the diameter of the hypotheses the server
sent (:func:`hypotheses_diameter`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np

from mechanisms._numeric import sum_of_squared_differences, sum_of_squares
from mechanisms._validation import check_choice, check_positive_finite, check_positive_int

#: The clip modes implemented here (:func:`l2_sensitivity`; the clipping mechanisms pick
#: :func:`clip_l2` or :func:`clip_elementwise` by them). The same tuple is the ``clip-mode``
#: setting's choices, ``settings.values.CLIP_MODES``: both packages sit at the bottom of the
#: import contract (pyproject.toml) and may import no other gpfl package, so neither can take
#: it from the other. ``tests/test_settings_rules.py`` checks that the two are equal.
CLIP_MODES = ("l2", "elementwise")


def clip_l2(arrays: Sequence[np.ndarray], c: float) -> list[np.ndarray]:
    """Scale the concatenation of ``arrays`` down to L2 norm at most ``c``.

    The norm is taken over all arrays together (the whole update), in float64;
    arrays whose joint norm is already ≤ ``c`` come back as unchanged copies. The
    L2 sensitivity of an update clipped this way is 2c (replace-one).

    Parameters
    ----------
    arrays : sequence of numpy.ndarray
        One update's layers.
    c : float
        Clipping norm, > 0 and finite.

    Returns
    -------
    list of numpy.ndarray
        New arrays with the input shapes and dtypes.
    """
    c = check_positive_finite("c", c)
    arrays = [np.asarray(a) for a in arrays]
    squared = math.fsum(sum_of_squares(a.astype(np.float64, copy=False)) for a in arrays)
    norm = math.sqrt(squared)
    if not math.isfinite(norm):
        raise ValueError("the L2 norm of the update overflows float64")
    if norm <= c:
        return [a.copy() for a in arrays]
    factor = c / norm
    return [(a.astype(np.float64) * factor).astype(a.dtype, copy=False) for a in arrays]


def clip_elementwise(arrays: Sequence[np.ndarray], c: float) -> list[np.ndarray]:
    """Clip every coordinate of ``arrays`` to the interval [−c, c].

    The L2 sensitivity of an n-coordinate update clipped this way is 2c·√n
    (replace-one).

    Parameters
    ----------
    arrays : sequence of numpy.ndarray
        One update's layers.
    c : float
        Bound on each coordinate, > 0 and finite.

    Returns
    -------
    list of numpy.ndarray
        New arrays with the input shapes and dtypes.
    """
    c = check_positive_finite("c", c)
    return [np.clip(np.asarray(a), -c, c) for a in arrays]


def l2_sensitivity(mode: str, clip: float, n: int) -> float:
    """L2 sensitivity of an update of ``n`` coordinates clipped with ``mode`` (replace-one).

    Parameters
    ----------
    mode : {"l2", "elementwise"}
        How the update was clipped.
    clip : float
        The clipping norm C (``"l2"``) or coordinate bound c (``"elementwise"``).
    n : int
        Number of coordinates.

    Returns
    -------
    float
        2C for ``"l2"``; 2c·√n for ``"elementwise"``.
    """
    mode = check_choice("mode", mode, CLIP_MODES)
    clip = check_positive_finite("clip", clip)
    n = check_positive_int("n", n)
    if mode == "l2":
        return 2.0 * clip
    return 2.0 * clip * math.sqrt(n)


def hypotheses_diameter(hypotheses: Sequence[Sequence[np.ndarray]]) -> float:
    """Largest L2 distance between two of the hypotheses, over their flattened layers.

    With k ≥ 2 hypotheses the client picks one with its private data, and a
    release centred on it moves by at most this much with that choice. The
    hypotheses are public (the server sent them), so this number is too.

    Parameters
    ----------
    hypotheses : sequence of sequences of numpy.ndarray
        The k models, each a sequence of layers; all with the same number of
        layers and the same shapes, finite values.

    Returns
    -------
    float
        max over pairs i < j of ‖θ_i − θ_j‖₂, computed in float64; 0.0 for k = 1.

    Raises
    ------
    ValueError
        No hypotheses, hypotheses whose layers differ in count or shape,
        non-finite values, or a distance that overflows float64.
    TypeError
        ``hypotheses`` or one of them is not a sequence of arrays, or a layer is
        not numeric.
    """
    if isinstance(hypotheses, np.ndarray) or not isinstance(hypotheses, Sequence):
        raise TypeError(
            "hypotheses must be a sequence of models (each a sequence of arrays), "
            f"got {type(hypotheses).__name__}"
        )
    if not hypotheses:
        raise ValueError("hypotheses must hold at least one model, got an empty sequence")
    models: list[list[np.ndarray]] = []
    for j, model in enumerate(hypotheses):
        if isinstance(model, np.ndarray) or not isinstance(model, Sequence):
            raise TypeError(
                f"hypotheses[{j}] must be a sequence of arrays (one model's layers), "
                f"got {type(model).__name__}"
            )
        layers = [np.asarray(a) for a in model]
        for i, layer in enumerate(layers):
            if not np.issubdtype(layer.dtype, np.number) or np.iscomplexobj(layer):
                raise TypeError(
                    f"hypotheses[{j}][{i}] must be a real numeric array, got dtype={layer.dtype}"
                )
            if not np.isfinite(layer).all():
                raise ValueError(f"hypotheses[{j}][{i}] contains non-finite values (nan or inf)")
        if models and [a.shape for a in layers] != [a.shape for a in models[0]]:
            raise ValueError(
                f"hypotheses[{j}] has layer shapes {[a.shape for a in layers]}, "
                f"hypotheses[0] has {[a.shape for a in models[0]]}"
            )
        models.append(layers)
    # Pair by pair, layer by layer and in cache-sized blocks, so that no float64 copy of a
    # layer is ever held (at 10^7 parameters each copy was 80 MB, allocated twice a release).
    squared = [
        math.fsum(
            sum_of_squared_differences(x, y)
            for x, y in zip(models[a], models[b], strict=True)
        )
        for a, b in itertools.combinations(range(len(models)), 2)
    ]
    diameter = math.sqrt(max(squared, default=0.0))
    if not math.isfinite(diameter):
        raise ValueError("the distance between two hypotheses overflows float64")
    return diameter
