"""A feature whose optional part is not installed fails at start, naming the extra; nothing leaks.

A module is made "not installed" by ``sys.modules[name] = None`` (what Python itself does for a
module it could not import): ``importlib.util.find_spec`` then answers None and ``import`` fails,
exactly as in an environment without that extra. The fresh environment of
tests/test_install_core.py checks the same without any stand-in.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from client.task_list import format_task_rows, task_rows
from deploy.cli import log_to_setting
from deploy.engines import SimulationEngine
from deploy.federation import LaunchError
from experiments.cli import main as experiments_main
from server.app import build_components
from server.settings import RunSettings, check_launch
from settings import SettingError, federation_defaults
from settings.extras import (
    EXTRAS,
    MissingExtraError,
    check_run_extras,
    extras_for_run,
    require_extra,
)
from tests.test_client_record_level import RUN as RECORD_RUN
from tests.test_client_record_level import hypotheses, ledger_of, make_client


def without(monkeypatch: pytest.MonkeyPatch, *modules: str) -> None:
    """Make ``modules`` absent from this process for one test."""
    for module in modules:
        monkeypatch.setitem(sys.modules, module, None)


def test_the_message_names_the_feature_the_extra_the_command_and_what_is_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    without(monkeypatch, "pyarrow", "datasets")
    with pytest.raises(MissingExtraError) as caught:
        require_extra("tabular", "task='tabular'")
    assert str(caught.value) == (
        "task='tabular' needs gpfl[tabular] (the tabular task): pip install \"gpfl[tabular]\" "
        "(not installed here: pyarrow, datasets)")


def test_an_installed_extra_passes() -> None:
    for name in EXTRAS:
        require_extra(name, "this test")


@pytest.mark.parametrize(("overrides", "expected"), [
    ({}, []),
    ({"task": "tabular"}, [("tabular", "task='tabular'", None)]),
    ({"mechanism": "dpsgd"}, [("dpsgd", "mechanism='dpsgd'", None)]),
    ({"log-to": "tensorboard:/tmp/tb,mlflow:sqlite:///m.db"},
     [("tracking", "log-to='tensorboard:/tmp/tb,mlflow:sqlite:///m.db'",
       ("tensorboard", "mlflow"))]),
    ({"log-to": "mlflow:http://h:5000"}, [("tracking", "log-to='mlflow:http://h:5000'",
                                           ("mlflow",))]),
])
def test_a_run_config_needs_the_extras_of_its_task_mechanism_and_log_to(
    overrides: dict[str, str], expected: list[tuple[str, str, tuple[str, ...] | None]]
) -> None:
    assert extras_for_run({**federation_defaults(), **overrides}) == expected


def test_mlflow_alone_does_not_need_tensorboard(monkeypatch: pytest.MonkeyPatch) -> None:
    without(monkeypatch, "tensorboard")
    check_run_extras({**federation_defaults(), "log-to": "mlflow:sqlite:///m.db"})
    with pytest.raises(MissingExtraError, match=r"not installed here: tensorboard\)"):
        check_run_extras({**federation_defaults(), "log-to": "tensorboard:/tmp/tb"})


def test_a_launch_of_the_tabular_task_without_its_extra_fails_at_the_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    without(monkeypatch, "pandas")
    with pytest.raises(SettingError, match=r"task='tabular' needs gpfl\[tabular\].*pandas"):
        check_launch({"task": "tabular"}, {}, [])


def test_a_launch_of_dpsgd_without_opacus_fails_at_the_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    without(monkeypatch, "opacus")
    with pytest.raises(SettingError, match=r"mechanism='dpsgd' needs gpfl\[dpsgd\].*opacus"):
        check_launch({"task": "digits", "mechanism": "dpsgd"}, {}, [])


def test_the_simulation_engine_without_ray_fails_before_anything_starts(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    without(monkeypatch, "ray")
    settings = RunSettings.from_run_config({})
    with pytest.raises(LaunchError, match=r"--engine simulation needs gpfl\[simulation\].*ray"):
        SimulationEngine().check(settings, 2, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_log_to_without_its_library_fails_when_the_serverapp_starts(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    without(monkeypatch, "mlflow")
    with pytest.raises(MissingExtraError, match=r"gpfl\[tracking\].*mlflow"):
        build_components({"log-to": f"mlflow:sqlite:///{tmp_path}/m.db",
                          "out-dir": str(tmp_path / "run")})
    assert not (tmp_path / "run").exists()


def test_log_to_on_the_command_line_without_its_library_fails_the_launch_check(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    without(monkeypatch, "tensorboard")
    with pytest.raises(SettingError, match=r"log-to=.*needs gpfl\[tracking\].*tensorboard"):
        check_launch({"log-to": log_to_setting([f"tensorboard:{tmp_path}/tb"])}, {}, [])


def test_the_tabular_task_itself_names_its_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from tasks.config import TaskSettingsError
    from tasks.tabular import TabularTask

    without(monkeypatch, "flwr_datasets")
    with pytest.raises(TaskSettingsError, match=r"gpfl\[tabular\].*flwr_datasets"):
        TabularTask("x.csv", feature_columns="a", classes="0,1")


def test_gpfl_tasks_says_which_task_needs_a_missing_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rows = {row["name"]: row for row in task_rows()}
    assert "needs" not in rows["tabular"]
    without(monkeypatch, "pandas")
    rows = {row["name"]: row for row in task_rows()}
    assert rows["tabular"]["needs"] == ["gpfl[tabular]"]
    assert "needs" not in rows["synthetic"]
    assert "tabular: tasks.tabular:TabularTask (package gpfl); allowed on this device; needs " \
           "gpfl[tabular], not installed here;" in format_task_rows(list(rows.values()))


def test_a_device_without_opacus_declines_dpsgd_before_any_charge(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Prepare: a device that allows dpsgd, asked for it, lacking Opacus (a deployment where the
    # server's environment has it and this device's has not).
    client = make_client(tmp_path)
    assert RECORD_RUN["mechanism"] == "dpsgd"
    without(monkeypatch, "opacus")

    # Execute
    released, _, metrics = client.fit(hypotheses(1), {"num-hypotheses": 1, "server-round": 1})

    # Assert: declined with the fixed reason, nothing released or charged.
    assert released == [] and metrics["declined"] == 1 and metrics["declined-by"] == "policy"
    assert metrics["decline-reason"] == (
        "declined: mechanism='dpsgd' needs the optional part gpfl[dpsgd], which this device "
        "does not have")
    assert not ledger_of(tmp_path).path.exists()
    assert "declines (policy): declined: mechanism='dpsgd' needs" in caplog.text


def test_the_experiments_need_their_extra(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    without(monkeypatch, "skimage")
    assert experiments_main(["dlg", "--quick"]) == 2
    assert "python -m experiments dlg needs gpfl[experiments]" in capsys.readouterr().err


def test_a_device_with_a_file_but_without_pandas_declines_the_tabular_task_uncharged(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Prepare: a device with its own CSV file, asked for the tabular task, lacking pandas. Its
    # preflight breaking would let the round go on to the charge (a broken preflight must not
    # tell the data apart), and the build would then fail after charging, every round.
    from client.app import device_task
    from client.numpy_client import GpflClient
    from client.policy import DevicePolicy

    (tmp_path / "d.csv").write_text("a,y\n1,0\n2,1\n3,0\n4,1\n")
    policy = DevicePolicy.load({"partition-id": 0, "num-partitions": 1,
                                "ledger-dir": str(tmp_path), "data-path": str(tmp_path / "d.csv")},
                               environ={})
    run = {**federation_defaults(), "task": "tabular", "feature-columns": "a",
           "label-column": "y", "classes": "0,1", "num-hypotheses": 1}
    client = GpflClient(lambda: device_task(run, policy), run, policy)
    without(monkeypatch, "pandas")

    # Execute
    released, _, metrics = client.fit([np.zeros((2, 1), np.float32), np.zeros(2, np.float32)],
                                      {"num-hypotheses": 1, "server-round": 1})

    # Assert: declined by policy with the fixed reason; no ledger written.
    assert released == [] and metrics["declined-by"] == "policy"
    assert metrics["decline-reason"] == (
        "declined: task='tabular' needs the optional part gpfl[tabular], which this device "
        "does not have")
    assert not (tmp_path / "client-0.json").exists()
