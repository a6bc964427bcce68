"""Random generators: the device's noise, and the server's own randomness.

Every mechanism takes a ``numpy.random.Generator``; none touches NumPy's global
state. Three ways to make one, for three different owners:

* :func:`device_rng`: release noise on a device, from the operating system's
  CSPRNG, a new generator for every release. Nothing the server sends enters it.
* :func:`seeded_rng`: release noise on a device whose owner opted in to
  reproducible noise (simulation experiments). Logged as a WARNING.
* :func:`make_rng`: server-side randomness (e.g. client sampling, initial
  hypotheses), driven by the run configuration's ``seed``. It never drives noise.
"""

from __future__ import annotations

import logging
import operator
import secrets

import numpy as np

from mechanisms._validation import check_non_negative_int

logger = logging.getLogger(__name__)

# seeded_rng warns once per process: a simulation makes one generator per release,
# and thousands of identical warnings would bury everything else in the log.
_seeded_noise_warned = False


def device_rng() -> np.random.Generator:
    """Make a fresh generator for one release's noise, seeded from the OS CSPRNG.

    Every call draws 128 new bits from :func:`secrets.randbits` (the operating
    system's CSPRNG) and seeds a new PCG64 with them. PCG64 itself is not a
    cryptographically secure generator: someone who saw enough of its output
    could in principle recover its state and predict the rest. That is why the
    device makes a new generator for every release rather than keeping one: no
    two releases share a state, and each state is 128 bits that nobody but the
    device ever saw (the noise of one release reveals nothing about the next).

    Returns
    -------
    numpy.random.Generator
        A PCG64 generator used for exactly one release.
    """
    return np.random.Generator(np.random.PCG64(secrets.randbits(128)))


def seeded_rng(seed: int, *keys: int) -> np.random.Generator:
    """Make a reproducible generator for one release, keyed by ``seed`` and ``keys``.

    Only for devices whose owner opted in to seeded noise (simulation experiments):
    anyone who knows ``seed`` and the keys can regenerate the noise and subtract it,
    so the release then protects nothing against them. The first call in a process
    logs a WARNING saying so.

    Parameters
    ----------
    seed : int
        The device's noise seed, >= 0.
    *keys : int
        Further integers >= 0 that tell releases apart (e.g. the client's id and
        its own release count), so that no two releases reuse one stream.

    Returns
    -------
    numpy.random.Generator
        ``np.random.default_rng(np.random.SeedSequence([seed, *keys]))``.

    Raises
    ------
    TypeError
        ``seed`` or a key is not an integer (bools included).
    ValueError
        ``seed`` or a key is negative.
    """
    global _seeded_noise_warned
    entropy = [check_non_negative_int("seed", seed)]
    entropy += [check_non_negative_int(f"keys[{i}]", key) for i, key in enumerate(keys)]
    if not _seeded_noise_warned:
        _seeded_noise_warned = True
        logger.warning(
            "seeded release noise (seed %d): the noise is reproducible by anyone who knows "
            "the seed, so the releases are not private against them; seeded noise is for "
            "simulation experiments only",
            entropy[0],
        )
    return np.random.default_rng(np.random.SeedSequence(entropy))


def make_rng(seed: int | None) -> np.random.Generator:
    """Make the generator for server-side randomness (sampling, initial hypotheses).

    It does not drive release noise: that is drawn on each device
    (:func:`device_rng`, or :func:`seeded_rng` where the device opted in).

    Parameters
    ----------
    seed : int or None
        ``None`` or a negative number: fresh OS entropy. A non-negative integer: a
        reproducible stream, logged as a WARNING so that a run's log says its
        server-side randomness can be replayed.

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
        "fixed random seed %d: the server-side randomness (e.g. client sampling, initial "
        "hypotheses) is reproducible; it does not drive the release noise, which each "
        "device draws itself",
        value,
    )
    return np.random.default_rng(value)

