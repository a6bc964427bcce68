"""Random generators for the mechanisms.

Every mechanism takes a ``numpy.random.Generator``; none touches NumPy's global
state. The default is seeded from the operating system's entropy; a fixed seed
makes the noise predictable to anyone who knows it, so it is for experiments only
and says so in the log.
"""

from __future__ import annotations

import logging
import operator

import numpy as np

logger = logging.getLogger(__name__)


def make_rng(seed: int | None) -> np.random.Generator:
    """Make the generator that a mechanism draws its noise from.

    Parameters
    ----------
    seed : int or None
        ``None`` or a negative number: fresh OS entropy (the default for real use).
        A non-negative integer: a reproducible stream, logged as a WARNING because
        noise that can be regenerated protects nothing.

    Returns
    -------
    numpy.random.Generator
        A PCG64 generator.
    """
    if seed is None:
        return np.random.default_rng()
    if isinstance(seed, (bool, np.bool_)):
        raise TypeError(f"seed must be an integer or None, got seed={seed!r}")
    try:
        value = operator.index(seed)
    except TypeError:
        raise TypeError(f"seed must be an integer or None, got seed={seed!r}") from None
    if value < 0:
        return np.random.default_rng()
    logger.warning(
        "fixed random seed %d: the privacy noise is reproducible; fixed seeds are for "
        "experiments only, never for real releases",
        value,
    )
    return np.random.default_rng(value)
