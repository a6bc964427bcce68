"""The tasks' own checks of their settings, beyond what the settings schema declares.

Every task setting is declared once in :mod:`settings.schema` (type, default, bounds); tasks read
it with ``settings.read(config, key)`` and check a constructor argument with
``SETTINGS[key].parse(value)``, so both report a bad value with the same message. What the schema
cannot express depends on the task or on its data (digits has 359 held-out images; the hospital
task accepts 0 validation users, the others need at least one): those checks raise
`TaskSettingsError`, naming the key and the value.
"""

from __future__ import annotations

import os

from settings import SETTINGS, SettingError

__all__ = ["TaskDataError", "TaskSettingsError", "require_at_least", "require_data_path"]


class TaskSettingsError(SettingError):
    """A task setting does not fit the task or its data (a cross-check the schema cannot make)."""


class TaskDataError(TaskSettingsError):
    """The device's data cannot serve the run, found by a task's preflight (`Task.preflight`).

    Raised only from what does not depend on the data's records: a missing or unreadable file,
    its format, its columns against the ones the run config names, no rows at all. The device
    declines the round before anything is charged; the message (the file, the column) stays in
    the device's log.
    """


def require_at_least(key: str, value: int, minimum: int, *, task: str) -> int:
    """Return ``value`` if it is at least ``minimum``, the task's own bound on setting ``key``.

    Raises
    ------
    TaskSettingsError
        Naming ``key``, the task and ``value`` when ``value < minimum``.
    """
    if value < minimum:
        raise TaskSettingsError(f"{key} must be >= {minimum} for task {task}, got {key}={value!r}")
    return value


def require_data_path(value: str | os.PathLike[str], *, task: str, what: str) -> str:
    """Return the setting ``data-path`` (a path object is accepted too), which ``task`` needs.

    Parameters
    ----------
    value : str or os.PathLike
        The file or folder.
    task : str
        The task's name, for the message.
    what : str
        What the path must name, for the message (e.g. ``"the CMS inpatient charges CSV"``).

    Raises
    ------
    settings.SettingError
        If ``value`` is not a string; `TaskSettingsError` if it is empty.
    """
    path: str = SETTINGS["data-path"].parse(
        os.fspath(value) if isinstance(value, os.PathLike) else value
    )
    if not path:
        raise TaskSettingsError(f"data-path must name {what} for task {task}, got data-path=''")
    return path
