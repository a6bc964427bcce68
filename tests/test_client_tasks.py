"""The device decides which task plugins it serves: its ``allowed-tasks`` and what it installed."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from client.app import device_task
from client.numpy_client import GpflClient
from client.policy import DevicePolicy, PolicyDecline, PolicyError
from client.settings import ClientSettings
from settings import federation_defaults
from tasks import Task

RUN: dict[str, Any] = {**federation_defaults(), "num-rounds": 10, "seed": 3}
HYPOTHESES = [np.array([5.0, 6.0], np.float32), np.array([4.0, -4.5], np.float32)]


def policy(tmp_path: Path, **node: Any) -> DevicePolicy:
    return DevicePolicy.load({"partition-id": 0, "num-partitions": 4,
                              "ledger-dir": str(tmp_path), **node}, environ={})


def client(tmp_path: Path, built: list[str], node: dict[str, Any] | None = None,
           **run: Any) -> GpflClient:
    p = policy(tmp_path, **(node or {}))
    config = {**RUN, **run}

    def build() -> Task:
        built.append(config["task"])  # the task's code (and its data) would be touched here
        return device_task(config, p)

    return GpflClient(build, config, p)


@pytest.mark.parametrize(("node", "task", "reason"), [
    ({"allowed-tasks": "fairness"}, "synthetic",
     "declined by policy: task='synthetic' is not among this device's allowed-tasks"),
    ({}, "not-installed-anywhere",
     "declined by policy: task='not-installed-anywhere' is not installed on this device"),
])
def test_a_task_the_device_does_not_serve_is_declined_before_it_is_built(
    tmp_path: Path, node: dict[str, Any], task: str, reason: str
) -> None:
    # Prepare
    built: list[str] = []
    c = client(tmp_path, built, node, task=task)

    # Execute
    released, count, metrics = c.fit(list(HYPOTHESES), {"num-hypotheses": 2, "server-round": 1})

    # Assert: a decline reply naming the task, no task built, nothing charged or recorded.
    assert released == [] and count == 1 and built == []
    assert metrics["declined"] == 1 and metrics["declined-by"] == "policy"
    assert metrics["decline-reason"].startswith(reason)
    assert not list(tmp_path.iterdir())


def test_an_allowed_installed_task_is_served(tmp_path: Path) -> None:
    built: list[str] = []
    c = client(tmp_path, built, {"allowed-tasks": "synthetic, fairness"})
    released, _, metrics = c.fit(list(HYPOTHESES), {"num-hypotheses": 2, "server-round": 1})
    assert built == ["synthetic"] and metrics["declined"] == 0 and len(released) == 1


def test_the_default_serves_every_installed_task(tmp_path: Path) -> None:
    p = policy(tmp_path)
    assert p.allowed_tasks is None
    for name in ("synthetic", "tabular"):
        p.check_task(name)
    with pytest.raises(PolicyDecline, match="not installed"):
        p.check_task("nope")


@pytest.mark.parametrize("value", ["a b", ".hidden", "synthetic,,x"])
def test_a_bad_allowed_tasks_names_the_setting(tmp_path: Path, value: str) -> None:
    with pytest.raises(PolicyError, match=rf"allowed-tasks.*got allowed-tasks={value!r}"):
        policy(tmp_path, **{"allowed-tasks": value})


def test_allowed_tasks_is_the_devices_alone(tmp_path: Path) -> None:
    # In the run config it is ignored (a device setting): the device's own value applies.
    p = policy(tmp_path, **{"allowed-tasks": "fairness"})
    with pytest.raises(PolicyDecline, match="allowed-tasks"):
        ClientSettings.resolve({**RUN, "allowed-tasks": "*", "task": "synthetic"}, p)



def test_the_client_app_declines_a_task_it_has_not_installed(tmp_path: Path) -> None:
    # The ClientApp builds its task only once the policy accepted the run: an uninstalled
    # task's name reaches fit as a decline instead of failing the message in client_fn.
    from flwr.app import RecordDict
    from flwr.common import Context, FitIns, ndarrays_to_parameters

    from client.app import client_fn

    context = Context(run_id=1, node_id=1, state=RecordDict(),
                      node_config={"partition-id": 0, "num-partitions": 4,
                                   "ledger-dir": str(tmp_path)},
                      run_config={**RUN, "task": "not-installed-anywhere"})
    res = client_fn(context).fit(FitIns(ndarrays_to_parameters(list(HYPOTHESES)),
                                        {"num-hypotheses": 2, "server-round": 1}))
    assert res.metrics["declined"] == 1
    assert "task='not-installed-anywhere' is not installed" in str(res.metrics["decline-reason"])
    assert not list(tmp_path.iterdir())


# -- the task's preflight ---------------------------------------------------------------------
TABULAR: dict[str, Any] = {"task": "tabular", "label-column": "y", "feature-columns": "a,b",
                           "classes": "no,yes"}
TABULAR_MODEL = [np.zeros((2, 2), np.float32), np.zeros(2, np.float32)]


def tabular_file(path: Path) -> Path:
    path.write_text("a,b,y\n" + "".join(f"{i},{i % 3},{'yes' if i % 2 else 'no'}\n"
                                         for i in range(6)))
    return path


def test_a_task_given_as_an_object_runs_its_classs_preflight(tmp_path: Path) -> None:
    # Prepare: the task object is built (reading nothing); its file does not exist.
    p = policy(tmp_path / "ledgers", **{"data-path": str(tmp_path / "absent.csv"),
                                        "device": "cpu"})
    config = {**RUN, **TABULAR}
    c = GpflClient(device_task(config, p), config, p)

    # Execute
    released, _, metrics = c.fit(list(TABULAR_MODEL), {"num-hypotheses": 1, "server-round": 1})

    # Assert: declined by the preflight, no ledger written.
    assert released == [] and metrics["declined-by"] == "task-data"
    assert not (tmp_path / "ledgers").exists()


def test_a_preflight_that_breaks_lets_the_round_go_on_to_the_charge(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Only TaskDataError declines: a bug in a preflight must not become a free decline (or a
    # text sent uncharged); the round is charged and trained as before preflights existed.
    from tasks.tabular import TabularTask

    def broken(cls: type, config: Any, partition_id: int, num_partitions: int) -> None:
        raise RuntimeError("a bug in the preflight")

    monkeypatch.setattr(TabularTask, "preflight", classmethod(broken))
    built: list[str] = []
    c = client(tmp_path, built, {"data-path": str(tabular_file(tmp_path / "d.csv")),
                                 "device": "cpu"}, **TABULAR)
    caplog.set_level(logging.ERROR, logger="client.numpy_client")

    released, _, metrics = c.fit(list(TABULAR_MODEL), {"num-hypotheses": 1, "server-round": 1})

    assert metrics["declined"] == 0 and len(released) == 2 and metrics["releases"] == 1
    assert "the preflight of task 'tabular' failed" in caplog.text


def test_a_task_object_without_a_preflight_is_served(tmp_path: Path) -> None:
    # An object with the Task interface but no preflight (an experiment's wrapper, a plugin
    # object of an older interface) is served as before.
    class Wrapped:
        def __init__(self, inner: Task) -> None:
            self._inner = inner

        def __getattr__(self, name: str) -> Any:
            if name == "preflight":
                raise AttributeError(name)
            return getattr(self._inner, name)

    p = policy(tmp_path)
    c = GpflClient(Wrapped(device_task(RUN, p)), RUN, p)  # type: ignore[arg-type]
    released, _, metrics = c.fit(list(HYPOTHESES), {"num-hypotheses": 2, "server-round": 1})
    assert metrics["declined"] == 0 and len(released) == 1
