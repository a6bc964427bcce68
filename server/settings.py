"""The federation's run configuration, validated at the ServerApp's start (and by `gpfl launch`).

Each key is checked against its one declaration (:mod:`settings.schema`): unknown keys, keys the
device owns and bad values are refused with a message naming the key, the value and what is
allowed; the checks that span several keys are :mod:`settings.rules`. What each device applies
is its own business (:mod:`client.policy`): the server cannot know the devices' bounds.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from settings import SettingError, check_node_config, check_run_config
from settings.extras import MissingExtraError, check_run_extras
from settings.rules import check_run_rules
from strategies.server_update import ServerUpdate
from tasks import require_installed

__all__ = ["RunSettings", "SettingError", "check_launch"]

@dataclass(frozen=True)
class RunSettings:
    """Server-side settings of one run (every key of the run config, checked)."""

    task: str
    num_hypotheses: int
    num_rounds: int
    clients_per_round: int
    mechanism: str
    calibration: str
    aggregation: str
    server_learning_rate: float
    eval_every: int
    patience: int
    seed: int | None
    out_dir: Path | None
    round_timeout: float
    min_replies: int
    resume_from: Path | None
    values: dict[str, Any]
    server_update: ServerUpdate

    @classmethod
    def from_run_config(cls, run_config: Mapping[str, Any]) -> RunSettings:
        """Validate a run config.

        Raises
        ------
        SettingError
            Naming every invalid setting and its value, or the incompatible combination.
        """
        v = check_run_config(run_config)
        k, mechanism, aggregation = v["num-hypotheses"], v["mechanism"], v["aggregation"]
        check_run_rules(v)
        seed = v["seed"]
        return cls(
            task=v["task"],
            num_hypotheses=k,
            num_rounds=v["num-rounds"],
            clients_per_round=v["clients-per-round"],
            mechanism=mechanism,
            calibration=v["calibration"],
            aggregation=aggregation,
            server_learning_rate=v["server-learning-rate"],
            eval_every=v["eval-every"],
            patience=v["patience"],
            seed=seed if seed >= 0 else None,
            out_dir=Path(v["out-dir"]).expanduser() if v["out-dir"] else None,
            round_timeout=v["round-timeout"],
            min_replies=v["min-replies"],
            resume_from=Path(v["resume-from"]).expanduser() if v["resume-from"] else None,
            values=v,
            server_update=ServerUpdate(v["server-update"], v["server-step"], v["anneal-after"],
                                       v["anneal-rounds"], v["reseed-after"],
                                       v["plateau-factor"]),
        )

    def task_config(self) -> dict[str, Any]:
        """Return the run config as the ServerApp's task reads it (its own device and data)."""
        return {**self.values, "device": self.values["server-device"],
                "data-path": self.values["server-data-path"]}


def check_launch(run_config: Mapping[str, Any], policy: Mapping[str, Any],
                 nodes: Iterable[Mapping[str, Any]]) -> RunSettings:
    """Check what a local launch hands its federation, before any of it runs; return the settings.

    The run config (each key, then the combinations: ``min-replies`` above
    ``clients-per-round``, ...), its task (the ServerApp resolves it against this environment's
    plugins, so a name no installed package registers fails here, not after the federation has
    started), the launch ``policy`` and each node config in ``nodes``: a bad key or value fails
    within a second, naming the key, the value and what is allowed.

    Raises
    ------
    SettingError
        Naming the setting, its value and where it came from.
    """
    settings = RunSettings.from_run_config(run_config)
    require_installed(settings.task)
    try:  # every process of a local launch runs here: what the run asks for must be installed
        check_run_extras(settings.values)
    except MissingExtraError as err:
        raise SettingError(str(err)) from None
    check_node_config(policy, source="launch policy")
    for i, node in enumerate(nodes):
        check_node_config(node, source=f"node config of SuperNode {i}")
    return settings
