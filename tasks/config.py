"""Read task settings from a Flower run config, naming the key in every error.

Flower hands `context.run_config` values as ``int``, ``float``, ``str`` or ``bool``; a value typed
on a command line may arrive as a string. These readers accept both spellings of a number and
reject everything else with a `TaskSettingsError` that names the key and the value received.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

__all__ = ["TaskSettingsError", "get_float", "get_int", "get_str"]


class TaskSettingsError(ValueError):
    """A task setting (run-config key) has a bad value, or the data it names cannot be used."""


def get_int(
    config: Mapping[str, Any],
    key: str,
    default: int,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
) -> int:
    """Return ``config[key]`` as an ``int`` (``default`` when absent).

    Parameters
    ----------
    config : Mapping[str, Any]
        The run config.
    key : str
        The kebab-case key.
    default : int
        The value when the key is absent.
    minimum, maximum : int, optional
        Inclusive bounds.

    Returns
    -------
    int
        The value.

    Raises
    ------
    TaskSettingsError
        If the value is not an integer (``True``/``False`` are not) or is out of bounds.
    """
    raw = config.get(key, default)
    value: int
    if isinstance(raw, bool):
        raise TaskSettingsError(f"{key} must be an integer, got {key}={raw!r}")
    if isinstance(raw, int):
        value = raw
    elif isinstance(raw, float) and math.isfinite(raw) and raw.is_integer():
        value = int(raw)
    elif isinstance(raw, str):
        try:
            value = int(raw.strip())
        except ValueError:
            raise TaskSettingsError(f"{key} must be an integer, got {key}={raw!r}") from None
    else:
        raise TaskSettingsError(f"{key} must be an integer, got {key}={raw!r}")
    if minimum is not None and value < minimum:
        raise TaskSettingsError(f"{key} must be >= {minimum}, got {key}={value}")
    if maximum is not None and value > maximum:
        raise TaskSettingsError(f"{key} must be <= {maximum}, got {key}={value}")
    return value


def get_float(
    config: Mapping[str, Any],
    key: str,
    default: float,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
) -> float:
    """Return ``config[key]`` as a finite ``float`` (``default`` when absent).

    Parameters
    ----------
    config : Mapping[str, Any]
        The run config.
    key : str
        The kebab-case key.
    default : float
        The value when the key is absent.
    minimum, maximum : float, optional
        Inclusive bounds.

    Returns
    -------
    float
        The value.

    Raises
    ------
    TaskSettingsError
        If the value is not a finite number or is out of bounds.
    """
    raw = config.get(key, default)
    if isinstance(raw, bool):
        raise TaskSettingsError(f"{key} must be a number, got {key}={raw!r}")
    if isinstance(raw, int | float):
        value = float(raw)
    elif isinstance(raw, str):
        try:
            value = float(raw.strip())
        except ValueError:
            raise TaskSettingsError(f"{key} must be a number, got {key}={raw!r}") from None
    else:
        raise TaskSettingsError(f"{key} must be a number, got {key}={raw!r}")
    if not math.isfinite(value):
        raise TaskSettingsError(f"{key} must be finite, got {key}={raw!r}")
    if minimum is not None and value < minimum:
        raise TaskSettingsError(f"{key} must be >= {minimum}, got {key}={value}")
    if maximum is not None and value > maximum:
        raise TaskSettingsError(f"{key} must be <= {maximum}, got {key}={value}")
    return value


def get_str(config: Mapping[str, Any], key: str, default: str) -> str:
    """Return ``config[key]`` as a stripped ``str`` (``default`` when absent).

    Parameters
    ----------
    config : Mapping[str, Any]
        The run config.
    key : str
        The kebab-case key.
    default : str
        The value when the key is absent.

    Returns
    -------
    str
        The value, surrounding whitespace removed.

    Raises
    ------
    TaskSettingsError
        If the value is not a string.
    """
    raw = config.get(key, default)
    if not isinstance(raw, str):
        raise TaskSettingsError(f"{key} must be a string, got {key}={raw!r}")
    return raw.strip()
