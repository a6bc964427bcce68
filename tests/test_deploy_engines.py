"""`launch(engine=...)`: one preparation, three engines, and what each refuses at start."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from deploy.cli import ENGINE_NAMES, main
from deploy.engines import ENGINES
from deploy.launcher import LaunchError, launch
from tests.conftest import flower_processes


@pytest.mark.parametrize(("run_config", "policy", "named"), [
    ({"num-rounds": 0}, {}, "num-rounds"),
    ({"task": "no-such-task"}, {}, "no-such-task"),
    ({"clients-per-round": 2, "min-replies": 3}, {}, "min-replies"),
    ({}, {"epsilon": float("nan")}, "launch policy"),
])
def test_a_bad_launch_fails_before_the_run_naming_the_setting(
    tmp_path: Path, run_config: dict[str, object], policy: dict[str, object], named: str
) -> None:
    lines: list[str] = []
    with pytest.raises(LaunchError, match=named):
        launch(engine="direct", supernodes=4, run_config=run_config, out_dir=tmp_path,
               policy=policy, echo=lines.append)
    # Nothing ran: no round line, no summary, no policy handed to devices.
    assert lines == []
    assert not (tmp_path / "summary.json").exists()
    assert not (tmp_path / "policy.toml").exists()


@pytest.mark.parametrize(("engine", "option", "message"), [
    ("direct", {"auth": True}, "--auth needs real SuperNodes .*; not --engine direct"),
    ("simulation", {"tls": True}, "--tls needs real SuperNodes .*; not --engine simulation"),
    ("simulation", {"node_configs": {0: {"epsilon": 1.0}}},
     "--node-config needs real SuperNodes"),
    ("deployment", {"ray_address": "10.0.0.5:6379"},
     "--ray-address needs --engine simulation .*; not --engine deployment"),
    ("direct", {"on_line": print}, "on_line needs an engine of Flower processes"),
    ("ray", {}, "--engine 'ray' is not an engine; choose one of deployment, simulation, direct"),
])
def test_an_option_the_engine_does_not_take_is_refused_naming_both(
    tmp_path: Path, engine: str, option: dict[str, object], message: str
) -> None:
    with pytest.raises(LaunchError, match=message):
        launch(engine=engine, supernodes=2, out_dir=tmp_path / "run", echo=lambda _: None,
               **option)  # type: ignore[arg-type]
    assert not (tmp_path / "run").exists() and flower_processes() == []


def test_the_cli_offers_every_engine() -> None:
    assert ENGINE_NAMES == tuple(ENGINES)


def test_gpfl_launch_on_the_direct_engine_writes_what_the_others_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Execute: the command a user runs, on the direct engine, 3 devices, 2 rounds.
    out = tmp_path / "run"
    code = main(["launch", "--engine", "direct", "--supernodes", "3", "--out", str(out),
                 "--run-config", "num-rounds=2 clients-per-round=3 seed=1"])

    # Assert: the round lines, the closing lines, and the run directory of any launch.
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "[gpfl] round 2/2" in printed and "gpfl: 2 rounds" in printed
    assert "alembic" not in printed  # Flower's import-time INFO lines stay out of the console
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "complete" and summary["last_round"] == 2
    assert sorted(summary["ledgers"]["per_client"]) == ["client-0", "client-1", "client-2"]
    assert (out / "figure.png").stat().st_size > 0
    assert json.loads((out / "launch.json").read_text())["engine"] == "direct"
    assert flower_processes() == []



def test_the_ray_address_from_the_environment_is_saved_for_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Prepare: Ray's own variable names the cluster; the engine's run is stopped at its start
    # (launch.json is written before it).
    from deploy.engines import SimulationEngine

    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.5:6379")

    def stop(self: SimulationEngine, prepared: object) -> None:
        raise LaunchError("stopped before anything started")

    monkeypatch.setattr(SimulationEngine, "run", stop)

    # Execute
    with pytest.raises(LaunchError, match="stopped before"):
        launch(engine="simulation", supernodes=2, out_dir=tmp_path / "run", echo=lambda _: None)

    # Assert: the address the run used is saved, so a resume joins it whatever its environment.
    saved = json.loads((tmp_path / "run" / "launch.json").read_text())
    assert saved["engine"] == "simulation" and saved["ray_address"] == "10.0.0.5:6379"
