"""gpfl tasks: each task is data partitioning + model + loss + local training.

`load_task` picks a task by the run-config key ``task`` and imports its module only then:
a Flower ClientApp process is started for every message, and the NumPy tasks (``synthetic``,
``fairness``) must not pay for importing torch or scikit-learn.

========== ======================= ============================================================
task       module                  data
========== ======================= ============================================================
synthetic  `tasks.synthetic`       linear regression, one optimum per group (NumPy)
fairness   `tasks.fairness`        majority/minority logistic regression + fairness metrics
digits     `tasks.digits`          scikit-learn's 8×8 digits, rotated per user (torch CNN)
femnist    `tasks.femnist`         LEAF FEMNIST JSON files from ``data-path`` (torch CNN)
hospital   `tasks.hospital`        CMS inpatient charges CSV from ``data-path`` (torch, 11 params)
========== ======================= ============================================================
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

import settings
from tasks.base import Dataset, Params, Task
from tasks.config import TaskSettingsError

__all__ = ["TASKS", "Dataset", "Params", "Task", "TaskSettingsError", "load_task"]

#: Task name -> "module:class"; the class has ``from_run_config(config)``. The names are the
#: choices of the setting ``task`` (a test keeps the two equal).
TASKS: Mapping[str, str] = {
    "synthetic": "tasks.synthetic:SyntheticTask",
    "fairness": "tasks.fairness:FairnessTask",
    "digits": "tasks.digits:DigitsTask",
    "femnist": "tasks.femnist:FemnistTask",
    "hospital": "tasks.hospital:HospitalTask",
}


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
        (a ``ValueError``) for an unknown task name or a bad setting, naming key, value and what
        is allowed; its subclass `TaskSettingsError` when a setting does not fit the task or its
        data.
    """
    name = settings.read(config, "task")
    module_name, class_name = TASKS[name].split(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    task: Task = cls.from_run_config(config)
    return task
