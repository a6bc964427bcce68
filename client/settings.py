"""What a client reads from the run config and its SuperNode's node config.

The run config is the federation's (the same for every client); the node config
belongs to the device, so it may override the privacy settings that are the
client's own business: its budget, its cap, where its ledger lives and which
device it trains on. Every value is validated here, once, into plain Python
types, and an invalid one raises :class:`ConfigError` naming the setting and the
value. The ServerApp runs the same validation at start so that a bad run config
fails before any client is contacted.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MECHANISMS = ("laplace", "gaussian", "sign", "none")
CALIBRATIONS = ("neighbourhood", "fixed")
CLIP_MODES = ("l2", "elementwise")
DEVICES = ("auto", "cpu", "cuda")

#: Node-config keys that override the run config for one client.
NODE_OVERRIDES = (
    "privacy-budget",
    "epsilon",
    "delta",
    "noise-multiplier",
    "clip",
    "ledger-dir",
    "device",
)


class ConfigError(ValueError):
    """A run-config or node-config value is invalid."""


def _get(config: Mapping[str, Any], key: str, default: Any = None) -> Any:
    if key in config:
        return config[key]
    if default is None:
        raise ConfigError(f"missing setting {key!r}")
    return default


def as_int(config: Mapping[str, Any], key: str, *, minimum: int | None = None,
           default: int | None = None) -> int:
    """Read an integer setting, checking its lower bound."""
    value = _get(config, key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value:
        raise ConfigError(f"{key} must be an integer, got {key}={value!r}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ConfigError(f"{key} must be >= {minimum}, got {key}={value}")
    return value


def as_float(config: Mapping[str, Any], key: str, *, positive: bool = False,
             non_negative: bool = False, default: float | None = None) -> float:
    """Read a finite float setting, checking its sign."""
    value = _get(config, key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{key} must be a number, got {key}={value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ConfigError(f"{key} must be finite, got {key}={value}")
    if positive and value <= 0:
        raise ConfigError(f"{key} must be positive, got {key}={value}")
    if non_negative and value < 0:
        raise ConfigError(f"{key} must be non-negative, got {key}={value}")
    return value


def as_choice(config: Mapping[str, Any], key: str, choices: tuple[str, ...],
              *, default: str | None = None) -> str:
    """Read a string setting that must be one of ``choices``."""
    value = _get(config, key, default)
    if value not in choices:
        raise ConfigError(f"{key} must be one of {', '.join(choices)}; got {key}={value!r}")
    return str(value)


def as_bool(config: Mapping[str, Any], key: str, *, default: bool = False) -> bool:
    """Read a boolean setting (TOML booleans, or the strings true/false)."""
    value = config.get(key, default)
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise ConfigError(f"{key} must be true or false, got {key}={value!r}")


@dataclass(frozen=True)
class PrivacySettings:
    """The privacy mechanism and budget of one client."""

    mechanism: str
    calibration: str
    noise_multiplier: float
    epsilon: float
    public_radius: float
    per_layer: bool
    delta: float
    clip: float
    clip_mode: str
    planned_releases: int
    #: Cap on the client's total spend; ``None`` = no cap (Gaussian/sign: their target ε).
    cap: float | None


@dataclass(frozen=True)
class ClientSettings:
    """Everything a client needs, validated."""

    local_epochs: int
    learning_rate: float
    batch_size: int
    privacy: PrivacySettings
    ledger_path: Path
    seed: int | None
    device: str
    partition_id: int
    num_partitions: int
    name: str

    @classmethod
    def from_configs(
        cls, run_config: Mapping[str, Any], node_config: Mapping[str, Any]
    ) -> ClientSettings:
        """Validate the run config, overridden by the device's node config.

        Parameters
        ----------
        run_config : Mapping[str, Any]
            ``context.run_config`` (keys of ``[tool.flwr.app.config]``).
        node_config : Mapping[str, Any]
            ``context.node_config``: ``partition-id``, ``num-partitions`` and any of
            :data:`NODE_OVERRIDES`, plus ``ledger-path`` (an explicit ledger file).

        Raises
        ------
        ConfigError
            Naming the first invalid setting and its value.
        """
        merged = dict(run_config)
        partition_id = as_int(node_config, "partition-id", minimum=0, default=0)
        per_client = str(run_config.get("client-epsilons", "")).strip()
        if per_client:
            # Personalized budgets where node configs cannot be given (the
            # Simulation Engine): partition p takes the (p mod len)-th value.
            merged["epsilon"] = _pick(per_client, partition_id, "client-epsilons")
        merged.update({k: v for k, v in node_config.items() if k in NODE_OVERRIDES})
        privacy = privacy_settings(merged)
        num_partitions = as_int(node_config, "num-partitions", minimum=1, default=1)
        if partition_id >= num_partitions:
            raise ConfigError(
                f"partition-id must be < num-partitions, got partition-id={partition_id}, "
                f"num-partitions={num_partitions}"
            )
        name = str(node_config.get("client-name", f"client-{partition_id}"))
        if "ledger-path" in node_config and str(node_config["ledger-path"]):
            ledger_path = Path(str(node_config["ledger-path"])).expanduser()
        else:
            ledger_dir = str(merged.get("ledger-dir", "")) or "~/.gpfl/ledgers"
            ledger_path = Path(ledger_dir).expanduser() / f"{name}.json"
        seed = as_int(merged, "seed", default=-1)
        return cls(
            local_epochs=as_int(merged, "local-epochs", minimum=1),
            learning_rate=as_float(merged, "learning-rate", positive=True),
            batch_size=as_int(merged, "batch-size", minimum=1),
            privacy=privacy,
            ledger_path=ledger_path,
            seed=seed if seed >= 0 else None,
            device=as_choice(merged, "device", DEVICES, default="auto"),
            partition_id=partition_id,
            num_partitions=num_partitions,
            name=name,
        )


def _pick(text: str, index: int, key: str) -> float:
    """Return the ``index mod len``-th value of a comma-separated list of positive numbers."""
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        raise ConfigError(f"{key} must be comma-separated numbers, got {key}={text!r}") from None
    if not values or any(not math.isfinite(v) or v <= 0 for v in values):
        raise ConfigError(f"{key} must hold positive finite numbers, got {key}={text!r}")
    return values[index % len(values)]


def privacy_settings(config: Mapping[str, Any]) -> PrivacySettings:
    """Validate the privacy part of a (merged) config."""
    mechanism = as_choice(config, "mechanism", MECHANISMS)
    calibration = as_choice(config, "calibration", CALIBRATIONS, default="neighbourhood")
    # Only the settings the chosen mechanism uses must be valid; the others are
    # kept as given (or a neutral value) so that a default of 0 elsewhere is fine.
    laplace = mechanism == "laplace"
    dp = mechanism in ("gaussian", "sign")
    noise_multiplier = (
        as_float(config, "noise-multiplier", positive=True)
        if laplace and calibration == "neighbourhood" else 0.0
    )
    epsilon = (
        as_float(config, "epsilon", positive=True)
        if (laplace and calibration == "fixed") or dp else 0.0
    )
    public_radius = (
        as_float(config, "public-radius", positive=True, default=1.0)
        if laplace and calibration == "fixed" else 0.0
    )
    # δ is always valid (the ledger reports RDP spend at it), whatever the mechanism.
    delta = as_float(config, "delta", positive=True, default=1e-5)
    if delta >= 1:
        raise ConfigError(f"delta must be in (0, 1), got delta={delta}")
    clip = as_float(config, "clip", positive=True) if dp else 0.0
    clip_mode = as_choice(config, "clip-mode", CLIP_MODES, default="l2")
    planned = as_int(config, "planned-releases", minimum=0, default=0)
    if dp and planned == 0:
        planned = as_int(config, "num-rounds", minimum=1)
    budget = as_float(config, "privacy-budget", non_negative=True, default=0.0)
    if budget > 0 and mechanism == "none":
        raise ConfigError(
            f"privacy-budget cannot be enforced without a mechanism, got privacy-budget={budget} "
            "with mechanism='none'"
        )
    cap: float | None = budget if budget > 0 else (epsilon if dp else None)
    return PrivacySettings(
        mechanism=mechanism,
        calibration=calibration,
        noise_multiplier=noise_multiplier,
        epsilon=epsilon,
        public_radius=public_radius,
        per_layer=as_bool(config, "per-layer", default=False),
        delta=delta,
        clip=clip,
        clip_mode=clip_mode,
        planned_releases=max(planned, 1),
        cap=cap,
    )
