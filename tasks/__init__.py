"""gpfl tasks: each task is data partitioning + model + loss + local training.

A task is a plugin: an installed Python package registers a task name in the entry-point group
``gpfl.tasks`` (``[project.entry-points."gpfl.tasks"]`` in its ``pyproject.toml``), pointing at
a `Task` subclass. gpfl's own tasks register the same way, in gpfl's ``pyproject.toml``:

========== ======================= ============================================================
task       module                  data
========== ======================= ============================================================
synthetic  `tasks.synthetic`       linear regression, one optimum per group (NumPy)
fairness   `tasks.fairness`        majority/minority logistic regression + fairness metrics
digits     `tasks.digits`          scikit-learn's 8×8 digits, rotated per user (torch CNN)
femnist    `tasks.femnist`         LEAF FEMNIST JSON files from ``data-path`` (torch CNN)
hospital   `tasks.hospital`        CMS inpatient charges CSV from ``data-path`` (torch, 11 params)
tabular    `tasks.tabular`         the device's own CSV or Parquet file (torch logistic / MLP)
========== ======================= ============================================================

The run config names a task; each side resolves the name against the plugins installed *in its
own environment*: a device against its own (and its ``allowed-tasks``), the ServerApp against
the server's. No task code ever travels with a run. `load_task` imports a task's module only
when the task is built: a device's warm executor (``gpfl supernode``, `client.executor`) imports
it once, on the first task that names it, but plain ``flower-supernode`` starts a ClientApp
process for every message, and there the NumPy tasks (``synthetic``, ``fairness``) must not pay
for importing torch or scikit-learn. Reading the entry points reads the installed packages'
metadata and imports nothing.

docs/TASKS.md describes the interface a task implements and how to write a plugin.
The papers the built-in tasks follow are cited by number (paper 001, paper 002, thesis 004;
see docs/REPRODUCING.md).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from importlib.metadata import EntryPoint, entry_points
from typing import Any

import settings
from tasks.base import Dataset, Params, Task
from tasks.config import TaskDataError, TaskSettingsError

__all__ = [
    "BUILTIN_TASKS",
    "ENTRY_POINT_GROUP",
    "Dataset",
    "Params",
    "Task",
    "TaskDataError",
    "TaskNotInstalledError",
    "TaskSettingsError",
    "declared_shapes",
    "installed_tasks",
    "load_task",
    "owner_of",
    "preflight_task",
    "require_installed",
    "task_class",
]

#: The entry-point group a package registers its tasks in.
ENTRY_POINT_GROUP = "gpfl.tasks"

#: The tasks gpfl itself registers (``[project.entry-points."gpfl.tasks"]`` of its
#: pyproject.toml; a test keeps the two equal).
BUILTIN_TASKS: tuple[str, ...] = (
    "synthetic", "fairness", "digits", "femnist", "hospital", "tabular",
)


class TaskNotInstalledError(TaskSettingsError):
    """The run names a task no installed package registers (or more than one does)."""


def installed_tasks() -> dict[str, EntryPoint]:
    """Return every task name registered in the ``gpfl.tasks`` entry-point group.

    Nothing is imported: an `EntryPoint` is the ``module:attribute`` a package declares.
    The answer is kept until an import-path directory changes (:func:`_installation`): a
    device asks at every round, and reading every installed package's metadata cost each
    release ~6 ms, 87 % of a synthetic-task ``fit``. Installing or removing a package creates
    or deletes its metadata directory, which changes its directory's modification time, so
    a plugin installed while the device runs is seen at its next round.

    Raises
    ------
    TaskNotInstalledError
        If two installed packages register the same name (which one to run would be a guess).
    """
    global _LAST
    key, last = _installation(), _LAST
    if last is None or last[0] != key:
        last = _LAST = (key, _scan())
    return dict(last[1])


#: The last reading of the entry points and what it depended on (:func:`_installation`). One
#: tuple, replaced whole: two threads asking at once at worst both read the metadata.
_LAST: tuple[tuple[Any, ...], dict[str, EntryPoint]] | None = None


def _installation() -> tuple[Any, ...]:
    """Return what the entry points depend on, as a cache key.

    The import path, each of its directories' modification time, and the function that reads
    them (a test that replaces it is not answered from an earlier reading).
    """
    stamps: list[tuple[str, int | None]] = []
    for entry in sys.path:
        try:
            stamps.append((entry, os.stat(entry or ".").st_mtime_ns))
        except OSError:
            stamps.append((entry, None))
    return (entry_points, tuple(stamps))


def _scan() -> dict[str, EntryPoint]:
    """Read the entry-point group from the installed packages' metadata (no cache)."""
    found: dict[str, EntryPoint] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        previous = found.get(ep.name)
        if previous is not None and previous.value != ep.value:
            raise TaskNotInstalledError(
                f"task={ep.name!r} is registered by two installed packages "
                f"({owner_of(previous)}: {previous.value}; {owner_of(ep)}: {ep.value}); "
                "uninstall one of them"
            )
        found[ep.name] = ep
    return found


def owner_of(ep: EntryPoint) -> str:
    """Return the name of the installed package that registers an entry point."""
    dist = getattr(ep, "dist", None)
    return str(getattr(dist, "name", "an unknown package"))


def require_installed(name: str) -> EntryPoint:
    """Return the entry point of task ``name``, importing nothing.

    Raises
    ------
    TaskNotInstalledError
        If no installed package registers ``name`` (the message lists the installed ones).
    """
    installed = installed_tasks()
    ep = installed.get(name)
    if ep is None:
        raise TaskNotInstalledError(
            f"task={name!r} is not installed here: no package registers it in the entry-point "
            f"group {ENTRY_POINT_GROUP!r} (installed: {', '.join(sorted(installed))})"
        )
    return ep


def task_class(name: str) -> type[Task]:
    """Import and return the `Task` subclass registered as ``name``.

    Raises
    ------
    TaskNotInstalledError
        If no installed package registers ``name``, or its target is not a `Task` subclass.
    """
    ep = require_installed(name)
    cls = ep.load()
    if not (isinstance(cls, type) and issubclass(cls, Task)):
        raise TaskNotInstalledError(
            f"task={name!r} points at {ep.value}, which is not a subclass of tasks.Task"
        )
    return cls


def load_task(config: Mapping[str, Any]) -> Task:
    """Build the task named by the setting ``task`` (its schema default when absent).

    Parameters
    ----------
    config : Mapping[str, Any]
        The run config, plus the side's own ``device`` and ``data-path``: a client passes its
        device settings (node config or policy file) under these keys, the ServerApp its
        ``server-device`` and ``server-data-path``. The task reads its keys with
        `settings.read`, so an absent key takes the default declared in `settings.schema`.

    Returns
    -------
    Task
        The task.

    Raises
    ------
    settings.SettingError
        (a ``ValueError``) for a bad setting, naming key, value and what is allowed; its
        subclass `TaskSettingsError` when a setting does not fit the task or its data, and
        `TaskNotInstalledError` when no installed plugin registers the task's name.
    """
    name = settings.read(config, "task")
    return task_class(name).from_run_config(config)


def preflight_task(config: Mapping[str, Any], partition_id: int, num_partitions: int) -> None:
    """Run the preflight of the task named by ``task`` (`Task.preflight`) without building it.

    Parameters
    ----------
    config : Mapping[str, Any]
        What `load_task` would receive: the run config and the device's ``device`` and
        ``data-path``.
    partition_id, num_partitions : int
        The device's partition.

    Raises
    ------
    TaskDataError
        The device's data cannot serve the run (the message names the file and the column).
    """
    name = settings.read(config, "task")
    check = getattr(task_class(name), "preflight", None)
    if check is not None:
        check(config, partition_id, num_partitions)


def declared_shapes(config: Mapping[str, Any]) -> list[tuple[int, ...]] | None:
    """Return the layer shapes of the task named by ``task`` without building it, if declared.

    What `Task.declared_shapes` of the task's class answers from the run config and the
    device's file metadata (never its records); ``None`` when the class does not say.
    """
    name = settings.read(config, "task")
    return task_class(name).declared_shapes(config)
