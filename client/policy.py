"""The device's privacy policy: what this device allows, whatever the run config asks.

The device owner states it when starting the SuperNode: in the node config, or in a TOML policy
file named by the node config's ``policy-file`` (or, for processes that get no node config of
their own such as the Simulation Engine's virtual nodes, by the ``GPFL_POLICY`` environment
variable of the device's process). Node-config keys override the file's. Every key is a device or
shared setting of :mod:`settings.schema`; a key the device does not give takes the declared device
default, so a device with no policy still privatizes: Laplace, Gaussian or sign only (never
``none``), finite caps, δ at most 10⁻⁵, a ledger in the user's home.

The run config is the federation's and may only ask: :func:`resolve` applies the stricter of the
request and the policy to every shared setting, and raises :class:`PolicyDecline` for a request
the policy forbids (a mechanism it does not allow, a task its ``allowed-tasks`` does not list or
that it has not installed), before anything is computed or charged.
"""

from __future__ import annotations

import logging
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from settings import SETTINGS, SettingError, check_node_config, device_settings

__all__ = ["POLICY_ENV", "DevicePolicy", "PolicyDecline", "PolicyError"]

#: Environment variable naming a policy file when the node config names none.
POLICY_ENV = "GPFL_POLICY"


class PolicyError(SettingError):
    """The device's own settings are invalid (node config or policy file): the device stops."""


class PolicyDecline(Exception):
    """The run asks for something this device's policy forbids; nothing was computed or charged.

    The message is built from public values only (the request and the policy), so it may be
    sent to the server.
    """


@dataclass(frozen=True)
class DevicePolicy:
    """Every device and shared setting of this device: its own values and its bounds.

    Attributes
    ----------
    values : Mapping[str, Any]
        One entry per setting of :func:`settings.device_settings`, parsed: the node config's
        value, else the policy file's, else the declared device default.
    source : str
        Where the values came from, for log lines.
    """

    values: Mapping[str, Any]
    source: str

    @classmethod
    def load(
        cls, node_config: Mapping[str, Any], environ: Mapping[str, str] | None = None
    ) -> DevicePolicy:
        """Read the policy from a node config and the policy file it (or ``GPFL_POLICY``) names.

        Raises
        ------
        PolicyError
            An unknown key, a run-config key, a bad value (each naming key and value), or a
            policy file that cannot be read.
        """
        environ = os.environ if environ is None else environ
        try:
            given = check_node_config(node_config)
        except SettingError as err:
            raise PolicyError(str(err)) from None
        path = str(given.get("policy-file") or environ.get(POLICY_ENV, "")).strip()
        from_file: dict[str, Any] = {}
        sources = []
        if path:
            from_file = _read_policy_file(Path(path).expanduser())
            sources.append(f"policy file {path}")
        if given:
            sources.append("node config")
        values: dict[str, Any] = {}
        for s in device_settings():
            values[s.name] = s.device_default if s.owner == "both" else s.default
        values.update(from_file)
        values.update(given)
        return cls(values, " + ".join(sources) or "device defaults")

    def __getitem__(self, name: str) -> Any:
        return self.values[name]

    @property
    def mechanisms(self) -> tuple[str, ...]:
        """The mechanisms this device releases with."""
        text = str(self.values["mechanisms"])
        return tuple(m for m in text.split(",") if m)

    @property
    def partition_id(self) -> int:
        """The partition of the task's data this device holds."""
        return int(self.values["partition-id"])

    @property
    def num_partitions(self) -> int:
        """How many partitions the task's data is split into."""
        return int(self.values["num-partitions"])

    @property
    def client_name(self) -> str:
        """The device's name: ``client-name``, or ``client-<partition-id>``."""
        return str(self.values["client-name"]) or f"client-{self.partition_id}"

    @property
    def ledger_path(self) -> Path:
        """The device's ledger file: ``ledger-path``, or ``<ledger-dir>/<client-name>.json``."""
        explicit = str(self.values["ledger-path"])
        if explicit:
            return Path(explicit).expanduser()
        return Path(str(self.values["ledger-dir"])).expanduser() / f"{self.client_name}.json"

    @property
    def noise_seed(self) -> int | None:
        """The device's noise seed, if it allows seeded noise and gives one; else ``None``."""
        seed = int(self.values["noise-seed"])
        return seed if self.values["allow-seeded-noise"] and seed >= 0 else None

    @property
    def allowed_tasks(self) -> tuple[str, ...] | None:
        """The task names this device serves; ``None`` for every installed one (``*``)."""
        text = str(self.values["allowed-tasks"])
        if text == "*":
            return None
        return tuple(t.strip() for t in text.split(",") if t.strip())

    def check_task(self, name: str) -> None:
        """Decline a run whose task this device does not allow or has not installed.

        Only the installed packages' metadata is read (entry points): no task code is
        imported and no data is read, so a declined run has touched nothing.

        Raises
        ------
        PolicyDecline
            Naming the task and the rule (public values only: the run's task name and this
            device's ``allowed-tasks``; the device's other installed tasks are not listed).
        """
        allowed = self.allowed_tasks
        if allowed is not None and name not in allowed:
            raise PolicyDecline(
                f"declined by policy: task={name!r} is not among this device's allowed-tasks")
        from tasks import TaskNotInstalledError, installed_tasks

        try:
            installed = installed_tasks()
        except TaskNotInstalledError as err:  # a name registered twice on this device
            # The packages' names stay in the device's log.
            logging.getLogger(__name__).error("%s", err)
            raise PolicyDecline(
                f"declined by policy: task={name!r} cannot be resolved on this device: two "
                "installed packages register one task name (details in the device's log)"
            ) from None
        if name not in installed:
            raise PolicyDecline(
                f"declined by policy: task={name!r} is not installed on this device (no "
                f"package registers it in the entry-point group 'gpfl.tasks')")

    def task_config(self, run_config: Mapping[str, Any]) -> dict[str, Any]:
        """Return what the run's task is built from.

        The run config, with this device's own ``data-path`` and ``device`` over whatever the
        run config says of them.
        """
        return {**run_config, "device": self.values["device"],
                "data-path": self.values["data-path"]}

    def bound(self, name: str) -> Any:
        """Return the device's value of the shared setting ``name`` (a bound on the request)."""
        if SETTINGS[name].owner != "both":
            raise KeyError(f"{name} is not a setting the device bounds")
        return self.values[name]



def _read_policy_file(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise PolicyError(f"policy-file {path} does not exist") from None
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise PolicyError(f"policy-file {path} cannot be read: {err}") from None
    if "policy-file" in data:
        raise PolicyError(f"policy-file {path} may not name another policy file")
    nested = [k for k, v in data.items() if isinstance(v, dict)]
    if nested:
        raise PolicyError(
            f"policy-file {path} must be a flat table of settings, got tables {nested}"
        )
    try:
        return check_node_config(data, source=f"policy file {path}")
    except SettingError as err:
        raise PolicyError(str(err)) from None

