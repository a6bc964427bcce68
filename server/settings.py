"""The federation's run configuration, validated at the ServerApp's start.

Every key of ``[tool.flwr.app.config]`` is checked here (the client's own part
through :class:`client.settings.ClientSettings`), so a bad value stops the run
before any client is contacted, with a message that names the setting and the
value.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from client.settings import (
    ClientSettings,
    ConfigError,
    as_choice,
    as_float,
    as_int,
)
from strategies import AGGREGATIONS

__all__ = ["ConfigError", "RunSettings"]


@dataclass(frozen=True)
class RunSettings:
    """Server-side settings of one run."""

    task: str
    num_hypotheses: int
    num_rounds: int
    clients_per_round: int
    mechanism: str
    aggregation: str
    server_learning_rate: float
    eval_every: int
    patience: int
    seed: int | None
    out_dir: Path
    client: ClientSettings
    raw: dict[str, Any]

    @classmethod
    def from_run_config(cls, run_config: Mapping[str, Any]) -> RunSettings:
        """Validate a run config.

        Raises
        ------
        ConfigError
            Naming the first invalid setting and its value.
        """
        client = ClientSettings.from_configs(run_config, {})
        k = as_int(run_config, "num-hypotheses", minimum=1)
        mechanism = client.privacy.mechanism
        if mechanism == "sign" and k != 1:
            raise ConfigError(
                "the sign mechanism releases signs, which cannot be clustered: it needs "
                f"num-hypotheses=1, got num-hypotheses={k}"
            )
        aggregation = as_choice(run_config, "aggregation", AGGREGATIONS, default="mean")
        privacy = client.privacy
        if (aggregation != "mean" and mechanism == "laplace"
                and privacy.calibration == "neighbourhood") or (
                aggregation != "mean" and mechanism == "none"):
            raise ConfigError(
                f"aggregation={aggregation!r} weighs clients by their declared noise σ, which "
                f"mechanism={mechanism!r} (calibration={privacy.calibration!r}) does not "
                "declare (under the neighbourhood calibration σ would reveal ‖δ‖); use "
                "aggregation='mean', or a gaussian, sign or fixed-calibration laplace mechanism"
            )
        seed = as_int(run_config, "seed", default=-1)
        out = str(run_config.get("out-dir", ""))
        return cls(
            task=str(run_config.get("task", "")),
            num_hypotheses=k,
            num_rounds=as_int(run_config, "num-rounds", minimum=1),
            clients_per_round=as_int(run_config, "clients-per-round", minimum=1),
            mechanism=mechanism,
            aggregation=aggregation,
            server_learning_rate=as_float(
                run_config, "server-learning-rate", positive=True, default=0.01
            ),
            eval_every=as_int(run_config, "eval-every", minimum=1, default=1),
            patience=as_int(run_config, "patience", minimum=0, default=0),
            seed=seed if seed >= 0 else None,
            out_dir=Path(out).expanduser() if out else Path("runs") / "serverapp",
            client=client,
            raw=dict(run_config),
        )
