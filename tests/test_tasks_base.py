"""Tests of the task contract: registry, settings via the schema, shared helpers, import cost."""

from __future__ import annotations

import importlib.metadata
import inspect
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tasks
from settings import SETTINGS, Setting, SettingError
from tasks.base import (
    Dataset,
    Params,
    Schedule,
    Task,
    best_fits,
    check_training_args,
    evaluate_best_hypothesis,
    minibatches,
    resolve_users,
    user_seed,
)
from tasks.config import TaskSettingsError, require_at_least
from tasks.fairness import FairnessTask
from tasks.synthetic import SyntheticTask
from tests.conftest import write_task_plugin

ROOT = Path(__file__).resolve().parents[1]


# -- registry -----------------------------------------------------------------------------------
def test_load_task_defaults_to_synthetic() -> None:
    task = tasks.load_task({})
    assert task.name == "synthetic"


def test_load_task_unknown_name_names_the_task_and_the_group() -> None:
    with pytest.raises(tasks.TaskNotInstalledError,
                       match=r"task='nope' is not installed here: .*'gpfl.tasks'"):
        tasks.load_task({"task": "nope"})


def test_a_malformed_task_name_names_the_key() -> None:
    with pytest.raises(SettingError, match=r"task: must be a task name.*got task='a b'"):
        tasks.load_task({"task": "a b"})


def test_gpfl_registers_its_tasks_as_entry_points_in_its_pyproject() -> None:
    # The installed metadata (what load_task reads) and pyproject.toml agree on every built-in.
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    ours = declared[tasks.ENTRY_POINT_GROUP]
    assert sorted(ours) == sorted(tasks.BUILTIN_TASKS)
    installed = tasks.installed_tasks()
    for name, target in ours.items():
        assert installed[name].value == target


def test_installed_tasks_reads_the_metadata_once_and_again_after_an_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Prepare: an import-path directory of its own, and a count of the metadata readings.
    monkeypatch.syspath_prepend(str(tmp_path))
    readings: list[str] = []

    def counted(group: str) -> Any:
        readings.append(group)
        return importlib.metadata.entry_points(group=group)

    monkeypatch.setattr(tasks, "entry_points", counted)
    first = tasks.installed_tasks()
    # Asked again with nothing installed in between: answered without reading the metadata.
    assert tasks.installed_tasks() == first and len(readings) == 1
    assert "late-plugin" not in first
    # A package installed while the process runs (its metadata directory appears on the path):
    # seen at the next call, and its removal too.
    write_task_plugin(tmp_path, "late-plugin")
    assert tasks.installed_tasks()["late-plugin"].value == "tasks.synthetic:SyntheticTask"
    assert len(readings) == 2
    shutil.rmtree(tmp_path / "late_plugin-0.1.dist-info")
    assert "late-plugin" not in tasks.installed_tasks()
    # A caller changing the returned mapping does not change the next answer.
    tasks.installed_tasks().clear()
    assert tasks.installed_tasks() == first


def test_a_name_two_packages_register_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from importlib.metadata import EntryPoint

    eps = [EntryPoint("x", "a.mod:A", tasks.ENTRY_POINT_GROUP),
           EntryPoint("x", "b.mod:B", tasks.ENTRY_POINT_GROUP)]
    monkeypatch.setattr(tasks, "entry_points", lambda group: eps)
    with pytest.raises(tasks.TaskNotInstalledError, match=r"task='x' is registered by two"):
        tasks.installed_tasks()


def test_an_entry_point_that_is_not_a_task_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from importlib.metadata import EntryPoint

    eps = [EntryPoint("odd", "collections:OrderedDict", tasks.ENTRY_POINT_GROUP)]
    monkeypatch.setattr(tasks, "entry_points", lambda group: eps)
    with pytest.raises(tasks.TaskNotInstalledError, match=r"not a subclass of tasks\.Task"):
        tasks.load_task({"task": "odd"})


def test_task_settings_error_is_a_setting_error() -> None:
    assert issubclass(TaskSettingsError, SettingError)
    assert issubclass(TaskSettingsError, ValueError)


@pytest.mark.parametrize("name", ["synthetic", "fairness"])
def test_numpy_tasks_import_neither_torch_nor_sklearn(name: str) -> None:
    code = (
        "import sys, tasks\n"
        f"task = tasks.load_task({{'task': {name!r}}})\n"
        "task.client_dataset(0, 3)\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
        "assert 'sklearn' not in sys.modules, 'sklearn imported'\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr


def test_device_module_import_is_light() -> None:
    code = "import sys, tasks.device\nassert 'torch' not in sys.modules\n"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr


# -- settings through the schema ---------------------------------------------------------------
def _task_classes() -> list[type]:
    classes = []
    for name in tasks.BUILTIN_TASKS:
        classes.append(tasks.task_class(name))
    return classes


@pytest.mark.parametrize("cls", _task_classes(), ids=lambda cls: cls.__name__)
def test_constructor_defaults_are_the_schema_defaults(cls: type) -> None:
    checked = 0
    for parameter in inspect.signature(cls).parameters.values():
        key = parameter.name.replace("_", "-")
        if key in SETTINGS and parameter.default is not inspect.Parameter.empty:
            assert parameter.default == SETTINGS[key].default, key
            checked += 1
    assert checked >= 3


@pytest.mark.parametrize("cls", _task_classes(), ids=lambda cls: cls.__name__)
def test_run_config_keys_are_the_constructor_settings(cls: type) -> None:
    # from_run_config passes each key as the keyword of the same name: none may be missing.
    names = [p.name.replace("_", "-") for p in inspect.signature(cls).parameters.values()]
    assert sorted(cls.run_config_keys) == sorted(key for key in names if key in SETTINGS)


def test_run_config_values_are_parsed_by_the_schema() -> None:
    task = tasks.load_task({"samples-per-user": "7", "users": 4.0, "data-seed": " 2 "})
    assert isinstance(task, SyntheticTask)
    assert (task.samples_per_user, task.users, task.data_seed) == (7, 4, 2)
    assert task.validation_users == SETTINGS["validation-users"].default


@pytest.mark.parametrize(
    ("key", "value", "allowed"),
    [
        ("samples-per-user", 0, "an integer >= 1 and <= 1e+07"),
        ("users", True, "an integer >= 0 and <= 1e+07"),
        ("data-seed", 2.5, "an integer >= 0"),
        ("minority-fraction", 1.5, "a number >= 0 and <= 1"),
        ("minority-fraction", float("nan"), "a number >= 0 and <= 1"),
    ],
)
def test_constructor_and_run_config_reject_alike(key: str, value: object, allowed: str) -> None:
    with pytest.raises(SettingError) as from_config:
        tasks.load_task({"task": "fairness", key: value})
    with pytest.raises(SettingError) as from_constructor:
        FairnessTask(**{key.replace("-", "_"): value})  # type: ignore[arg-type]
    assert str(from_config.value) == str(from_constructor.value)
    assert str(from_config.value) == f"{key} must be {allowed}, got {key}={value!r}"


def test_require_at_least_names_key_task_and_value() -> None:
    assert require_at_least("validation-users", 3, 1, task="digits") == 3
    message = r"^validation-users must be >= 1 for task digits, got validation-users=0$"
    with pytest.raises(TaskSettingsError, match=message):
        require_at_least("validation-users", 0, 1, task="digits")


# -- helpers ------------------------------------------------------------------------------------
def test_dataset_checks_lengths() -> None:
    with pytest.raises(ValueError, match="one entry per sample"):
        Dataset(x=np.zeros((3, 2)), y=np.zeros(2), group=np.zeros(3, dtype=np.int64), user="u")
    data = Dataset(x=np.zeros((3, 2)), y=np.zeros(3), group=np.zeros(3, np.int64), user="u")
    assert len(data) == 3


def test_minibatches_cover_each_sample_once_per_epoch() -> None:
    batches = list(minibatches(23, 10, np.random.default_rng(0)))
    assert [len(b) for b in batches] == [10, 10, 3]
    assert sorted(np.concatenate(batches).tolist()) == list(range(23))


def test_user_seed_streams_are_distinct_and_reproducible() -> None:
    def draw(seed: int, purpose: str, index: int) -> float:
        return float(np.random.default_rng(user_seed(seed, purpose, index)).random())

    assert draw(0, "train", 1) == draw(0, "train", 1)
    assert len({draw(0, "train", 1), draw(0, "validation", 1), draw(1, "train", 1)}) == 3


def test_resolve_users() -> None:
    assert resolve_users(0, 2, 5, available=10) == 5
    assert resolve_users(5, 4, 5, available=10) == 5
    with pytest.raises(TaskSettingsError, match=r"users=4.*num-partitions=5"):
        resolve_users(4, 0, 5, available=10)
    with pytest.raises(TaskSettingsError, match="partition-id"):
        resolve_users(0, 5, 5, available=10)
    with pytest.raises(TaskSettingsError, match=r"users=5 .*num-partitions=5.*exceeds the 3"):
        resolve_users(0, 0, 5, available=3)
    with pytest.raises(TaskSettingsError, match="num-partitions"):
        resolve_users(0, 0, 0, available=3)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"epochs": 0, "learning_rate": 0.1, "batch_size": 1}, "epochs"),
        ({"epochs": 1, "learning_rate": 0.0, "batch_size": 1}, "learning_rate"),
        ({"epochs": 1, "learning_rate": float("nan"), "batch_size": 1}, "learning_rate"),
        ({"epochs": 1, "learning_rate": 0.1, "batch_size": 0}, "batch_size"),
    ],
)
def test_check_training_args_names_argument(kwargs: dict[str, float], name: str) -> None:
    with pytest.raises(ValueError, match=f"{name}="):
        check_training_args(**kwargs)  # type: ignore[arg-type]


class _ConstantTask(Task):
    """Scalar "model" c; a user's loss is |c - mean(y)|; accuracy = 1 if the loss < 0.5."""

    name = "constant"
    is_classifier = True

    @property
    def parameter_shapes(self) -> list[tuple[int, ...]]:
        return [(1,)]

    def init_parameters(self, rng: np.random.Generator) -> Params:
        return [rng.standard_normal(1).astype(np.float32)]

    def client_dataset(self, partition_id: int, num_partitions: int) -> Dataset:
        raise NotImplementedError

    def validation_datasets(self) -> list[Dataset]:
        raise NotImplementedError

    def loss(self, params: Params, data: Dataset) -> float:
        return float(abs(params[0][0] - np.mean(data.y)))

    def user_metrics(self, params: Params, data: Dataset) -> dict[str, float]:
        loss = self.loss(params, data)
        return {"loss": loss, "accuracy": float(loss < 0.5)}

    def _fit(self, params: Params, data: Dataset, schedule: Schedule, device: str) -> Params:
        raise NotImplementedError


def _user(value: float) -> Dataset:
    return Dataset(x=np.zeros((2, 1)), y=np.full(2, value), group=np.zeros(2, np.int64), user="u")


def test_evaluate_takes_best_hypothesis_per_user() -> None:
    task = _ConstantTask()
    hypotheses = [[np.array([0.0], np.float32)], [np.array([10.0], np.float32)]]
    users = [_user(1.0), _user(9.0), _user(4.0)]
    # best losses: 1 (h0), 1 (h1), 4 (h0) -> mean 2; accuracies all 0 (losses >= 0.5)
    assert task.evaluate(hypotheses, users) == {
        "loss": 2.0, "accuracy": 0.0,
        # h0 serves users 1 and 3 (losses 1 and 4), h1 user 2 (loss 1).
        "hypothesis_0_users": 2.0, "hypothesis_0_loss": 2.5, "hypothesis_0_accuracy": 0.0,
        "hypothesis_1_users": 1.0, "hypothesis_1_loss": 1.0, "hypothesis_1_accuracy": 0.0}
    fits = best_fits(task.user_metrics, hypotheses, users)
    assert [f.index for f in fits] == [0, 1, 0]
    assert task.best_hypothesis(hypotheses, users[1]) == 1
    # the order of the hypotheses does not matter
    reversed_order = task.evaluate(hypotheses[::-1], users)
    assert (reversed_order["loss"], reversed_order["accuracy"]) == (2.0, 0.0)


def test_evaluate_ignores_nan_hypothesis_and_rejects_empty_input() -> None:
    task = _ConstantTask()
    hypotheses = [[np.array([np.nan], np.float32)], [np.array([1.0], np.float32)]]
    assert evaluate_best_hypothesis(task.user_metrics, hypotheses, [_user(1.0)])["loss"] == 0.0
    with pytest.raises(ValueError, match="params_list"):
        task.evaluate([], [_user(1.0)])
    with pytest.raises(ValueError, match="datasets"):
        task.evaluate(hypotheses, [])


def test_initial_hypotheses_rejects_bad_k() -> None:
    with pytest.raises(ValueError, match="k=0"):
        _ConstantTask().initial_hypotheses(0, np.random.default_rng(0))
    assert _ConstantTask().num_parameters == 1


class _OwnSettingTask(_ConstantTask):
    """A task with a setting of its own, as a plugin declares one."""

    settings = (Setting("noise-level", float, 0.1, "the noise", group="tasks", minimum=0.0),)

    def __init__(self, noise_level: float = 0.1) -> None:
        self.noise_level = noise_level


@pytest.mark.parametrize(("text", "expected"), [("", 0.1), ("noise-level=0.5", 0.5),
                                                 ("noise-level=2", 2.0)])
def test_a_plugins_own_setting_comes_from_task_settings(text: str, expected: float) -> None:
    task = _OwnSettingTask.from_run_config({"task-settings": text})

    assert task.noise_level == expected and isinstance(task.noise_level, float)


@pytest.mark.parametrize(("text", "message"), [
    ("noise=1", r"task-settings: task '.*' has no setting\(s\) \['noise'\]; its own settings: "
                r"noise-level"),
    ("noise-level=-1", r"noise-level"),
    ("noise-level", r"task-settings expects key=value pairs"),
])
def test_a_bad_own_setting_fails_naming_it(text: str, message: str) -> None:
    with pytest.raises(SettingError, match=message):
        _OwnSettingTask.from_run_config({"task-settings": text})
