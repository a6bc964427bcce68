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

from tasks.base import Dataset, Params, Task
from tasks.config import TaskSettingsError, get_str

__all__ = ["TASKS", "Dataset", "Params", "Task", "TaskSettingsError", "load_task"]

#: Task name -> "module:class"; the class has ``from_run_config(run_config)``.
TASKS: Mapping[str, str] = {
    "synthetic": "tasks.synthetic:SyntheticTask",
    "fairness": "tasks.fairness:FairnessTask",
    "digits": "tasks.digits:DigitsTask",
    "femnist": "tasks.femnist:FemnistTask",
    "hospital": "tasks.hospital:HospitalTask",
}


def load_task(run_config: Mapping[str, Any]) -> Task:
    """Build the task named by ``run_config["task"]`` (default ``"synthetic"``).

    Parameters
    ----------
    run_config : Mapping[str, Any]
        The Flower run config (``context.run_config``); the task reads its own keys from it and
        uses the defaults of ``pyproject.toml`` for absent ones.

    Returns
    -------
    Task
        The task.

    Raises
    ------
    TaskSettingsError
        (a ``ValueError``) for an unknown task name or a bad task setting, naming key and value.
    """
    name = get_str(run_config, "task", "synthetic")
    target = TASKS.get(name)
    if target is None:
        raise TaskSettingsError(f"task must be one of {sorted(TASKS)}, got task={name!r}")
    module_name, class_name = target.split(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    task: Task = cls.from_run_config(run_config)
    return task
