"""``gpfl new-task NAME``: the skeleton of a task plugin package, ready to install and run.

It writes ``gpfl-task-<NAME>/`` under ``--out``: a ``pyproject.toml`` whose entry point registers
``NAME`` in the group ``gpfl.tasks``, the package ``gpfl_task_<name>`` with a working task (linear
regression on devices of two groups, NumPy only: every method of the interface filled in, to be
replaced by the user's own data and model), a test of it, and a README saying how to install and
run it. docs/TASKS.md's tutorial starts here; ``examples/gpfl-task-example-linear`` is what it
writes for ``example-linear``, with the tutorial's one edit (a setting of the task's own).
"""

from __future__ import annotations

import argparse
import keyword
import re
import sys
from pathlib import Path
from string import Template

__all__ = ["add_arguments", "package_files", "run"]

#: A task name: lower-case words joined by hyphens, as the run config's ``task`` spells it.
NAME = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")

PYPROJECT = Template('''\
[build-system]
requires = ["setuptools>=64"]  # 64: editable installs
build-backend = "setuptools.build_meta"

[project]
name = "$project"
version = "0.1.0"
description = "A gpfl task plugin: the task $name"
requires-python = ">=3.11"
dependencies = ["gpfl", "numpy>=1.26"]

# The plugin itself: the task name `$name` -> the Task subclass that implements it.
[project.entry-points."gpfl.tasks"]
$name = "$module:$cls"

[tool.setuptools]
packages = ["$module"]
''')

MODULE = Template('''\
"""The gpfl task `$name`: linear regression on devices of two groups (replace with yours).

Device ``p`` (its ``partition-id``) holds ``samples-per-user`` points ``(x, y)`` with
``y = w_g · x + noise``, where ``g = p % 2`` picks one of two true weight vectors: a federation
with ``num-hypotheses = 2`` should find both. The data is generated on the device from the run's
public ``data-seed`` and the device's partition; a real plugin would read the device's own
``data-path`` in `client_dataset` instead.
"""

from __future__ import annotations

import numpy as np

from settings import SETTINGS
from tasks import Dataset, Params, Task
from tasks.base import Schedule, user_seed

__all__ = ["TRUE_WEIGHTS", "$cls"]

#: One true weight vector per group.
TRUE_WEIGHTS = np.array([[3.0, -2.0], [-3.0, 2.0]])


class $cls(Task):
    """Linear regression, mean squared error, plain mini-batch SGD (NumPy only)."""

    name = "$name"
    is_classifier = False
    # gpfl settings this task reads from the run config (absent keys take gpfl's defaults).
    run_config_keys = ("samples-per-user", "validation-users", "data-seed")

    def __init__(
        self,
        *,
        samples_per_user: int = SETTINGS["samples-per-user"].default,
        validation_users: int = SETTINGS["validation-users"].default,
        data_seed: int = SETTINGS["data-seed"].default,
    ) -> None:
        self.samples_per_user = SETTINGS["samples-per-user"].parse(samples_per_user)
        self.validation_users = SETTINGS["validation-users"].parse(validation_users)
        self.data_seed = SETTINGS["data-seed"].parse(data_seed)

    # -- the model: one weight vector ------------------------------------------------------
    @property
    def parameter_shapes(self) -> list[tuple[int, ...]]:
        """One layer: the weights, shape (2,)."""
        return [(TRUE_WEIGHTS.shape[1],)]

    def init_parameters(self, rng: np.random.Generator) -> Params:
        """Draw the weights from N(0, I) with the server's generator."""
        return [rng.standard_normal(TRUE_WEIGHTS.shape[1]).astype(np.float32)]

    # -- the data: generated per user ------------------------------------------------------
    def _user(self, purpose: str, index: int) -> Dataset:
        rng = np.random.default_rng(user_seed(self.data_seed, purpose, index))
        group = index % len(TRUE_WEIGHTS)
        x = rng.standard_normal((self.samples_per_user, TRUE_WEIGHTS.shape[1]))
        y = x @ TRUE_WEIGHTS[group] + 0.1 * rng.standard_normal(self.samples_per_user)
        return Dataset(x=x, y=y, group=np.full(len(y), group, dtype=np.int64),
                       user=f"{purpose}-{index}")

    def client_dataset(self, partition_id: int, num_partitions: int) -> Dataset:
        """Return the data of partition ``partition_id`` (runs on the device)."""
        return self._user("train", partition_id)

    def validation_datasets(self) -> list[Dataset]:
        """Return held-out users of both groups (runs on the server)."""
        return [self._user("validation", i) for i in range(max(self.validation_users, 2))]

    # -- the loss, predictions and local training ------------------------------------------
    def loss(self, params: Params, data: Dataset) -> float:
        """Mean squared error of ``params`` on ``data``."""
        self._check(params)
        return float(np.mean((data.x @ np.asarray(params[0], dtype=np.float64) - data.y) ** 2))

    def predict(self, params: Params, x: np.ndarray) -> np.ndarray:
        """Return the model's values on ``x`` (what ``gpfl predict`` writes)."""
        self._check(params)
        return np.asarray(x, dtype=np.float64) @ np.asarray(params[0], dtype=np.float64)

    def _fit(self, params: Params, data: Dataset, schedule: Schedule, device: str) -> Params:
        """Mini-batch SGD on the mean squared error (``device`` is ignored: NumPy only)."""
        w = np.array(params[0], dtype=np.float64)
        for batch in schedule.batches(len(data)):
            x, y = data.x[batch], data.y[batch]
            w -= schedule.learning_rate * 2.0 * x.T @ (x @ w - y) / len(batch)
        return [w.astype(np.float32)]
''')

TEST = Template('''\
"""The task `$name` as gpfl uses it: built from a run config, trained, scored."""

from __future__ import annotations

import numpy as np
from $module import TRUE_WEIGHTS, $cls

from tasks import load_task


def test_gpfl_finds_the_task_by_its_name() -> None:
    # The entry point the package registers: what a run config's task names.
    assert isinstance(load_task({"task": "$name"}), $cls)


def test_local_training_lowers_the_loss() -> None:
    task = load_task({"task": "$name", "samples-per-user": 50})
    data = task.client_dataset(0, 2)
    start = task.init_parameters(np.random.default_rng(0))

    trained = task.train(start, data, epochs=5, learning_rate=0.05, batch_size=10,
                         rng=np.random.default_rng(1))

    assert task.loss(trained, data) < 0.5 * task.loss(start, data)


def test_each_group_is_served_best_by_its_own_weights() -> None:
    task = load_task({"task": "$name"})
    truth = [[w.astype(np.float32)] for w in TRUE_WEIGHTS]

    scores = task.evaluate(truth, task.validation_datasets())

    assert scores["hypothesis_0_users"] > 0 and scores["hypothesis_1_users"] > 0
''')

README = Template('''\
# $project

A gpfl task plugin: the task `$name`, written by `gpfl new-task $name`. Replace the data,
model and training of `$module/__init__.py` with your own (docs/TASKS.md in gpfl says what each
method does), then, in gpfl's environment:

```bash
pip install --no-build-isolation -e $project   # registers `$name` in gpfl.tasks
python -m pytest $project/tests                # the task as gpfl uses it
gpfl launch --supernodes 4 --run-config "task=$name num-rounds=3"
```

On real machines, install the package on the server and on every device that should serve it.
''')


def package_files(name: str) -> dict[str, str]:
    """Return the skeleton's files for task ``name``: relative path -> text.

    Raises
    ------
    ValueError
        If ``name`` is not lower-case words joined by hyphens.
    """
    if not NAME.match(name):
        raise ValueError(f"a task name is lower-case words joined by hyphens (example-linear), "
                         f"got {name!r}")
    module = "gpfl_task_" + name.replace("-", "_")
    if keyword.iskeyword(module):
        raise ValueError(f"{module!r} is a Python keyword")
    values = {"name": name, "project": f"gpfl-task-{name}", "module": module,
              "cls": "".join(part.capitalize() for part in name.split("-")) + "Task"}
    return {"pyproject.toml": PYPROJECT.substitute(values),
            f"{module}/__init__.py": MODULE.substitute(values),
            "tests/test_task.py": TEST.substitute(values),
            "README.md": README.substitute(values)}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare ``gpfl new-task``'s arguments."""
    parser.add_argument("name", help="the task's name, as a run config's task says it "
                                     "(lower-case words joined by hyphens)")
    parser.add_argument("--out", default=".", metavar="DIR",
                        help="where to write the package folder gpfl-task-NAME")


def run(args: argparse.Namespace) -> int:
    """Write the skeleton; refuse to overwrite an existing folder."""
    try:
        files = package_files(args.name)
    except ValueError as err:
        print(f"gpfl new-task: {err}", file=sys.stderr)
        return 2
    folder = Path(args.out) / f"gpfl-task-{args.name}"
    if folder.exists():
        print(f"gpfl new-task: {folder} exists; nothing written", file=sys.stderr)
        return 1
    for relative, text in files.items():
        path = folder / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    print(f"gpfl new-task: wrote {folder} ({', '.join(sorted(files))})")
    print(f"gpfl new-task: next: pip install --no-build-isolation -e {folder}, then "
          f"python -m pytest {folder / 'tests'}")
    return 0
