"""One setting's declaration: its name, type, default, bounds, owner, and how it is parsed.

:class:`Setting` parses and checks a value (errors name the key, the value and what is
allowed) and combines a federation's request with a device's bound (the stricter wins).
The declarations themselves are in :mod:`settings.declarations`. Imports nothing of gpfl.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

OWNERS = ("federation", "device", "both")


class SettingError(ValueError):
    """A setting has a bad value, is unknown, or is given by a party that does not own it."""


@dataclass(frozen=True)
class Setting:
    """The declaration of one setting.

    Attributes
    ----------
    name : str
        The kebab-case key.
    type : type
        ``bool``, ``int``, ``float`` or ``str``.
    default : Any
        The run config's default (owner ``federation`` or ``both``), or the value a device without
        a policy uses (owner ``device``).
    help : str
        One sentence for the settings table and the pyproject comment.
    owner : str
        ``federation``, ``device`` or ``both`` (see the module notes).
    group : str
        Heading of the settings table the key is listed under.
    minimum, maximum : float, optional
        Bounds of a number; excluded when ``open_minimum`` / ``open_maximum``.
    choices : tuple of str
        The allowed values of a string (each item of a comma-separated list if ``is_list``).
    is_list : bool
        A comma-separated list of ``choices`` (e.g. the mechanisms a device allows).
    stricter : str
        Owner ``both``: ``"max"`` or ``"min"``, which of request and bound is applied.
    device_default : Any
        Owner ``both``: the bound of a device that sets none.
    unset : Any
        Owner ``both``: a run-config value that means "no request" (the device's bound applies).
    check : callable, optional
        Further check of a parsed value: raises ``ValueError`` saying what is wrong.
    """

    name: str
    type: type
    default: Any
    help: str
    owner: str = "federation"
    group: str = "run"
    minimum: float | None = None
    maximum: float | None = None
    open_minimum: bool = False
    open_maximum: bool = False
    choices: tuple[str, ...] = ()
    is_list: bool = False
    stricter: str = ""
    device_default: Any = None
    unset: Any = None
    check: Callable[[Any], None] | None = None

    def __post_init__(self) -> None:
        if self.owner not in OWNERS:
            raise ValueError(f"{self.name}: owner must be one of {OWNERS}, got {self.owner!r}")
        if (self.owner == "both") != (self.stricter in ("min", "max")):
            raise ValueError(f"{self.name}: stricter='min'|'max' is required for owner 'both' only")
        self.parse(self.default)
        if self.owner == "both":
            self.parse(self.device_default)

    # -- reading a value ----------------------------------------------------------------------
    def allowed(self) -> str:
        """Describe the allowed values, for error messages and the settings table."""
        if self.choices:
            what = " | ".join(self.choices)
            return f"comma-separated, each one of {what}" if self.is_list else f"one of {what}"
        if self.type is bool:
            return "true | false"
        if self.type is str:
            return "a string"
        low = "" if self.minimum is None else (
            f"> {self.minimum:g}" if self.open_minimum else f">= {self.minimum:g}"
        )
        high = "" if self.maximum is None else (
            f"< {self.maximum:g}" if self.open_maximum else f"<= {self.maximum:g}"
        )
        kind = "an integer" if self.type is int else "a number"
        bounds = " and ".join(b for b in (low, high) if b)
        return f"{kind} {bounds}".strip()

    def _error(self, value: object, source: str) -> SettingError:
        where = f" in the {source}" if source else ""
        return SettingError(
            f"{self.name} must be {self.allowed()}{where}, got {self.name}={value!r}"
        )

    def parse(self, value: object, source: str = "") -> Any:
        """Return ``value`` as this setting's type, checked against its bounds.

        Numbers may arrive as TOML numbers or as strings (a value typed on a command line);
        ``True``/``False`` are never numbers. ``source`` names where the value came from, for the
        message of the :class:`SettingError` raised on a bad value.
        """
        if self.type is bool:
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.strip().lower() in ("true", "false"):
                return value.strip().lower() == "true"
            raise self._error(value, source)
        if self.type is str:
            if not isinstance(value, str):
                raise self._error(value, source)
            text = value.strip()
            if self.choices:
                items = [i.strip() for i in text.split(",")] if self.is_list else [text]
                if self.is_list and text == "":
                    items = []
                if any(i not in self.choices for i in items):
                    raise self._error(value, source)
                return ",".join(items) if self.is_list else text
            return self._checked(text, value, source)
        number = _number(value, integer=self.type is int)
        if number is None:
            raise self._error(value, source)
        low, high = self.minimum, self.maximum
        if low is not None and (number < low or (self.open_minimum and number == low)):
            raise self._error(value, source)
        if high is not None and (number > high or (self.open_maximum and number == high)):
            raise self._error(value, source)
        return self._checked(number, value, source)

    def _checked(self, parsed: Any, value: object, source: str) -> Any:
        if self.check is not None:
            try:
                self.check(parsed)
            except ValueError as err:
                where = f" in the {source}" if source else ""
                message = f"{self.name}{where}: {err}, got {self.name}={value!r}"
                raise SettingError(message) from None
        return parsed

    def combine(self, request: Any, bound: Any) -> Any:
        """Return the stricter of a parsed request and the device's parsed bound."""
        if self.owner != "both":
            raise ValueError(f"{self.name} is not owned by both the federation and the device")
        if request is None or (self.unset is not None and request == self.unset):
            return bound
        return max(request, bound) if self.stricter == "max" else min(request, bound)


def _number(value: object, *, integer: bool) -> int | float | None:
    """Parse an int/float (or its spelling in a string); None if it is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        text = value.strip()
        try:
            value = int(text) if integer else float(text)
        except ValueError:
            if not integer:
                return None
            try:
                value = float(text)
            except ValueError:
                return None
    if isinstance(value, int) and not isinstance(value, bool):
        return value if integer else float(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        if integer:
            return int(value) if value.is_integer() else None
        return value
    return None


# ------------------------------------------------------------------------------ value checks
