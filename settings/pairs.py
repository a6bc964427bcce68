"""The one grammar of ``key=value`` settings on a command line.

``gpfl launch --run-config / --node-config / --policy`` and ``gpfl supernode --node-config``
all read it. It is Flower's (``flwr.common.config.parse_config_args``, what ``flwr run
--run-config`` and ``flower-supernode --node-config`` read), made forgiving where a hand-typed
line wants it:

* items are separated by white space; a value in quotes may hold spaces
  (``out-dir="my runs"``);
* a value is read as TOML, so ``3``, ``2.5``, ``true``, ``"digits"`` and ``'digits'`` mean what
  they mean to Flower (``x="5"`` is the string ``"5"``);
* a value that is not a TOML scalar is the string as written: ``mechanisms=gaussian``,
  ``optima=5,6;4,-4.5``, ``policy-file=/etc/gpfl/policy.toml``, ``x=[1,2]``; Flower rejects
  the first two and reads the third as a file;
* an item without ``=`` is an error naming the option, where Flower skips it;
* a whole argument that is one path ending in ``.toml`` is a TOML file of settings
  (:func:`read_settings`), as for Flower.

:func:`format_pairs` writes a mapping back in Flower's strict grammar (strings quoted), which
reads back to the same values in both.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from settings.render import toml_value

__all__ = ["PairsError", "format_pairs", "parse_pairs", "read_settings"]

# An item: characters other than white space and quotes, and quoted runs (which may hold
# white space); a lone quote that opens no closed run is the second alternative: an error.
_ITEM = re.compile(r"""((?:[^\s"']|"[^"]*"|'[^']*')+)|(\S)""")


class PairsError(ValueError):
    """A ``key=value`` line that cannot be read; the message names the option and the item."""


def _value(raw: str) -> Any:
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw
    # A run config or node config holds scalars only: an array, a table or a date is the text.
    return value if isinstance(value, bool | int | float | str) else raw


def parse_pairs(text: str, what: str) -> dict[str, Any]:
    """Read ``"k1=v1 k2=v2"`` in the grammar above.

    Parameters
    ----------
    text : str
        White-space-separated ``key=value`` items.
    what : str
        The option, for the error message (``"--run-config"``).

    Returns
    -------
    dict[str, Any]
        Key to value (a later item wins).

    Raises
    ------
    PairsError
        An item without ``=`` or with an empty key, or an unclosed quote, naming ``what``.
    """
    out: dict[str, Any] = {}
    for match in _ITEM.finditer(text):
        item, stray = match.groups()
        if stray is not None:
            raise PairsError(f"{what}: an unclosed quote in {text!r}")
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise PairsError(f"{what} expects key=value pairs, got {item!r}")
        out[key] = _value(raw)
    return out


def read_settings(text: str, what: str) -> dict[str, Any]:
    """Read an option's argument: ``key=value`` items, or the path of a TOML file of settings.

    Raises
    ------
    PairsError
        As :func:`parse_pairs`, or a file that cannot be read or is not TOML, naming ``what``.
    """
    path = text.strip()
    if path.endswith(".toml") and "=" not in path:
        try:
            with Path(path).expanduser().open("rb") as fh:
                return dict(tomllib.load(fh))
        except (OSError, tomllib.TOMLDecodeError) as err:
            raise PairsError(f"{what} {path}: {err}") from None
    return parse_pairs(text, what)


def format_pairs(config: Mapping[str, Any]) -> str:
    """Write ``config`` as ``key=value`` items in Flower's grammar (every string quoted)."""
    return " ".join(f"{key}={toml_value(value)}" for key, value in config.items())
