"""Checks that turn user-supplied privacy parameters into plain Python numbers.

Every error names the parameter and the value received, e.g.
``ValueError("epsilon must be positive and finite, got epsilon=-1.0")``.
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Sequence

import numpy as np


def check_real(name: str, value: object) -> float:
    """Return ``value`` as a float; ``TypeError`` if it is not a real number (bools excluded)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {name}={value!r}")
    return float(value)


def check_positive_finite(name: str, value: object) -> float:
    """Return ``value`` as a float that is > 0 and finite."""
    x = check_real(name, value)
    if not (x > 0.0 and math.isfinite(x)):
        raise ValueError(f"{name} must be positive and finite, got {name}={value!r}")
    return x


def check_non_negative_finite(name: str, value: object) -> float:
    """Return ``value`` as a float that is >= 0 and finite."""
    x = check_real(name, value)
    if not (x >= 0.0 and math.isfinite(x)):
        raise ValueError(f"{name} must be non-negative and finite, got {name}={value!r}")
    return x


def check_open_unit(name: str, value: object) -> float:
    """Return ``value`` as a float strictly between 0 and 1."""
    x = check_real(name, value)
    if not 0.0 < x < 1.0:
        raise ValueError(f"{name} must be in the open interval (0, 1), got {name}={value!r}")
    return x


def check_positive_int(name: str, value: object) -> int:
    """Return ``value`` as an int >= 1 (bools and floats are refused)."""
    n = _check_int(name, value)
    if n < 1:
        raise ValueError(f"{name} must be a positive integer, got {name}={value!r}")
    return n


def check_non_negative_int(name: str, value: object) -> int:
    """Return ``value`` as an int >= 0 (bools and floats are refused)."""
    n = _check_int(name, value)
    if n < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {name}={value!r}")
    return n


def _check_int(name: str, value: object) -> int:
    """Return ``value`` as an int; ``TypeError`` for bools, floats and other non-integers.

    ``operator.index`` takes NumPy integers too, and refuses floats even when whole:
    a count given as 2.0 is more likely a mistake than a convenience.
    """
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be an integer, got {name}={value!r}")
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {name}={value!r}") from None


def check_bool(name: str, value: object) -> bool:
    """Return ``value`` as a bool; only ``True``/``False`` (or NumPy bools) are accepted."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {name}={value!r}")
    return bool(value)


def check_choice(name: str, value: object, choices: Sequence[str]) -> str:
    """Return ``value`` if it is one of ``choices``."""
    if not isinstance(value, str) or value not in choices:
        allowed = " | ".join(repr(c) for c in choices)
        raise ValueError(f"{name} must be one of {allowed}, got {name}={value!r}")
    return value


def check_generator(rng: object) -> np.random.Generator:
    """Return ``rng`` if it is a ``numpy.random.Generator``."""
    if not isinstance(rng, np.random.Generator):
        raise TypeError(
            "rng must be a numpy.random.Generator (see mechanisms.device_rng), "
            f"got rng={rng!r}"
        )
    return rng


def check_model_pair(
    reference: Sequence[np.ndarray], updated: Sequence[np.ndarray]
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Validate one model's layers before and after local training.

    Both must be sequences of floating-point arrays with the same count and the
    same shapes, with at least one parameter in all, and hold only finite
    values. Returns them as lists of ``np.ndarray``.
    """
    for name, seq in (("reference", reference), ("updated", updated)):
        if isinstance(seq, np.ndarray) or not isinstance(seq, Sequence):
            raise TypeError(
                f"{name} must be a sequence of arrays (one model's layers), "
                f"got {type(seq).__name__}"
            )
    if len(reference) != len(updated):
        raise ValueError(
            f"reference and updated must have the same number of layers, "
            f"got {len(reference)} and {len(updated)}"
        )
    if not updated:
        raise ValueError("updated must hold at least one layer, got an empty sequence")
    ref = [np.asarray(a) for a in reference]
    upd = [np.asarray(a) for a in updated]
    total = 0
    for i, (r, u) in enumerate(zip(ref, upd, strict=True)):
        if r.shape != u.shape:
            raise ValueError(
                f"layer {i}: reference and updated shapes differ, got {r.shape} and {u.shape}"
            )
        for name, a in (("reference", r), ("updated", u)):
            if not np.issubdtype(a.dtype, np.floating):
                raise TypeError(f"{name}[{i}] must be a floating-point array, got dtype={a.dtype}")
            if not np.isfinite(a).all():
                raise ValueError(f"{name}[{i}] contains non-finite values (nan or inf)")
        total += u.size
    if total == 0:
        raise ValueError("the model has no parameters (every layer is empty)")
    return ref, upd
