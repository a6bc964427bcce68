"""Every gpfl setting, declared once: name, type, default, bounds and owner.

A setting is owned by

``federation``
    the run config (``[tool.flwr.app.config]``, ``flwr run --run-config``): whoever starts the run;
``device``
    the device owner (a SuperNode's node config, or the policy file it names): the run config
    cannot set it, and a device ignores it there;
``both``
    the run config *asks* and the device's value is a *bound*; the stricter of the two wins
    (``stricter="max"``: the larger value, e.g. a noise multiplier; ``"min"``: the smaller, e.g.
    an epsilon or a cap). A device with no policy applies ``device_default`` as its bound.

Everything else reads these declarations: the ServerApp and ``gpfl launch`` check a run config
with :func:`check_run_config`, the client and ``gpfl supernode`` check a node config with
:func:`check_node_config`, the pyproject defaults and ``docs/SETTINGS.md`` are generated from
(and tested against) :data:`SETTINGS` (declared in :mod:`settings.declarations`). The settings
package imports nothing else of gpfl, nor Flower or NumPy.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from settings.checks import parse_optima
from settings.declarations import _DECLARATIONS, SETTINGS
from settings.setting import Setting, SettingError
from settings.values import (
    AGGREGATIONS,
    CLIP_MODES,
    CLUSTER_AGGREGATORS,
    MECHANISMS,
    NODE_IDENTITY,
    SAMPLE_BY,
    SERVER_UPDATES,
)

__all__ = [
    "AGGREGATIONS",
    "CLIP_MODES",
    "CLUSTER_AGGREGATORS",
    "FLOWER_NODE_KEYS",
    "MECHANISMS",
    "NODE_IDENTITY",
    "SAMPLE_BY",
    "SERVER_UPDATES",
    "SETTINGS",
    "Setting",
    "SettingError",
    "check_node_config",
    "check_run_config",
    "device_settings",
    "federation_defaults",
    "parse_optima",
    "read",
    "setting",
    "stricter",
]

#: Node-config keys Flower itself fills in (the Simulation Engine sets them for every virtual node).
FLOWER_NODE_KEYS = ("partition-id", "num-partitions")


def setting(name: str) -> Setting:
    """Return the declaration of ``name``; :class:`SettingError` if there is none."""
    try:
        return SETTINGS[name]
    except KeyError:
        raise SettingError(f"unknown setting {name!r}") from None


def read(config: Mapping[str, Any], name: str) -> Any:
    """Return setting ``name`` from ``config`` (its declared default when absent), parsed.

    Raises
    ------
    SettingError
        If the value is not allowed (the message names the key, the value and what is allowed).
    """
    s = setting(name)
    return s.parse(config.get(name, s.default))


def federation_defaults() -> dict[str, Any]:
    """Return the run config's keys and defaults (``[tool.flwr.app.config]``)."""
    return {s.name: s.default for s in _DECLARATIONS if s.owner != "device"}


def device_settings() -> list[Setting]:
    """Return the settings a device may give (owner ``device`` or ``both``), in order."""
    return [s for s in _DECLARATIONS if s.owner != "federation"]


def stricter(name: str, request: Any, bound: Any) -> Any:
    """Return the stricter of a request and a device bound for the shared setting ``name``."""
    return setting(name).combine(request, bound)


def _unknown(keys: Iterable[str], allowed: Iterable[str], what: str) -> SettingError:
    names = ", ".join(repr(k) for k in sorted(keys))
    return SettingError(
        f"unknown {what} setting(s) {names}; known: {', '.join(sorted(allowed))}"
    )


def check_run_config(
    run_config: Mapping[str, Any], *, ignore_foreign: bool = False
) -> dict[str, Any]:
    """Check a whole run config; return every federation/both setting, defaults filled in.

    Parameters
    ----------
    run_config : Mapping[str, Any]
        ``context.run_config`` or the overrides a user gives.
    ignore_foreign : bool
        Skip unknown keys and keys the device owns instead of refusing them (a device reading
        a run config it did not write ignores what is not the federation's to set).

    Raises
    ------
    SettingError
        For an unknown key, a key the device owns (naming who owns it), or a bad value
        (naming the key, the value and what is allowed). All problems are reported at once.
    """
    problems: list[str] = []
    known = federation_defaults()
    device_only = [k for k in run_config if k in SETTINGS and SETTINGS[k].owner == "device"]
    unknown = [k for k in run_config if k not in SETTINGS]
    if not ignore_foreign:
        for key in device_only:
            problems.append(
                f"{key} belongs to the device (its node config or policy file); the run config "
                f"cannot set it, got {key}={run_config[key]!r}"
            )
        if unknown:
            problems.append(str(_unknown(unknown, known, "run-config")))
    out: dict[str, Any] = {}
    for name, default in known.items():
        try:
            out[name] = SETTINGS[name].parse(run_config.get(name, default), "run config")
        except SettingError as err:
            problems.append(str(err))
    if problems:
        raise SettingError("; ".join(problems))
    return out


def check_node_config(
    node_config: Mapping[str, Any], source: str = "node config"
) -> dict[str, Any]:
    """Check a node config (or a policy file): every key must be a device or shared setting.

    Returns the given keys parsed (no defaults filled in: absent keys mean "use the policy file
    or the device default").

    Raises
    ------
    SettingError
        For a key that is unknown or belongs to the federation alone, or a bad value.
    """
    problems: list[str] = []
    allowed = [s.name for s in device_settings()]
    federation_only = [
        k for k in node_config if k in SETTINGS and SETTINGS[k].owner == "federation"
    ]
    for key in federation_only:
        problems.append(
            f"{key} is a run-config setting (the federation's); a {source} cannot set it, "
            f"got {key}={node_config[key]!r}"
        )
    unknown = [k for k in node_config if k not in SETTINGS]
    if unknown:
        problems.append(str(_unknown(unknown, allowed, source)))
    out: dict[str, Any] = {}
    for key, value in node_config.items():
        if key in SETTINGS and SETTINGS[key].owner != "federation":
            try:
                out[key] = SETTINGS[key].parse(value, source)
            except SettingError as err:
                problems.append(str(err))
    if problems:
        raise SettingError("; ".join(problems))
    return out
