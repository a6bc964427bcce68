"""The ``gpfl`` command line's conventions, and how the launcher reports a Flower process's end.

``gpfl --version`` and ``gpfl --help`` say what is installed and what gpfl is; every option's
help states its default where it has one. A Flower process that fails logs Flower's own exit
code (``Exit Code: 700``) and exits with status 1, while ``flwr run`` ends with 0: the launcher
names the process and Flower's code, read from its log (stand-in processes here, no Flower run).
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
from importlib.metadata import version
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from deploy import cli, processes
from deploy.engines import SimulationEngine
from deploy.processes import SERVERAPP, ProcessSet, ProcessWatch, exit_detail, flower_exit

#: What a Flower process logs when Ray does not start under the Simulation Engine
#: (``flwr.simulation.app``: ``flwr_exit(ExitCode.SIMULATION_EXCEPTION)``), then exits 1.
RAY_FAILED_LOG = (
    "ERROR :     Simulation raised an exception\n"
    "Traceback (most recent call last):\n"
    "RuntimeError: Failed to start the Ray runtime\n"
    "ERROR :     Exit Code: 700\n"
    "An unhandled exception occurred when running the simulation.\n\n"
    "For more information, visit: <https://flower.ai/docs/framework/1.39/en/ref-exit-codes/"
    "700.html>\n")


def subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = cli.build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


# --- --version and --help ------------------------------------------------------------------
def test_version_prints_gpfls_installed_version_and_flowers(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Execute
    with pytest.raises(SystemExit) as stop:
        cli.main(["--version"])

    # Assert: exit 0, one line from the distributions' metadata.
    assert stop.value.code == 0
    assert capsys.readouterr().out == f"gpfl {version('gpfl')} (Flower {version('flwr')})\n"


def test_help_says_what_gpfl_is_in_one_line() -> None:
    text = cli.build_parser().format_help()
    assert cli.DESCRIPTION.split()[0] in text and "federated learning" in text
    assert "The ``gpfl`` command" not in text
    assert "\n" not in cli.DESCRIPTION


def test_launch_help_states_the_timeouts_defaults() -> None:
    text = " ".join(subparsers()["launch"].format_help().split())
    assert "giving up on the run (default: 3600.0)" in text
    assert "(default: 600.0)" in text
    assert "(default: deployment)" in text


@pytest.mark.parametrize("command", sorted(subparsers()))
def test_every_option_with_a_default_states_it_and_no_other_does(command: str) -> None:
    # Prepare
    parser = subparsers()[command]
    formatter = cli.DefaultsHelpFormatter(parser.prog)

    # Execute / Assert: an option whose default says something states it; a flag, an option
    # left out (None) or a repeatable one (empty list) does not print a meaningless default.
    for action in parser._actions:
        if not action.option_strings or action.default is argparse.SUPPRESS:
            continue
        helped = formatter._get_help_string(action) or ""
        meaningful = not (action.default is None or action.default is False
                          or action.default in ([], ""))
        assert ("default" in helped) == meaningful or "default" in (action.help or ""), (
            command, action.option_strings, helped)
    text = parser.format_help()
    for silent in ("(default: None)", "(default: False)", "(default: [])", "(default: )"):
        assert silent not in text, (command, silent)


# --- Flower's exit codes, reported as such -------------------------------------------------
def test_flowers_exit_codes_are_read_from_the_installed_flower() -> None:
    # Pinned on the installed Flower: its table where the launcher reads it, and the line its
    # exit function writes (FLOWER_EXIT_LINE reads it back).
    import importlib

    table = importlib.import_module(processes.FLOWER_EXIT_MODULES[0])
    assert table.ExitCode.SIMULATION_EXCEPTION == 700
    from flwr.supercore.exit import exit as flower_exit_module

    assert 'f"Exit Code: {code}' in inspect.getsource(flower_exit_module.flwr_exit)
    found = flower_exit(700)
    assert (found.name, found.meaning) == (
        "SIMULATION_EXCEPTION", "An unhandled exception occurred when running the simulation.")
    assert str(flower_exit(12345)) == "Flower's exit code 12345"


def test_exit_detail_gives_the_status_and_flowers_code() -> None:
    assert exit_detail(1, RAY_FAILED_LOG) == (
        "code 1; Flower's exit code 700 SIMULATION_EXCEPTION \"An unhandled exception occurred "
        "when running the simulation.\"")
    assert exit_detail(-9, "INFO : started\n") == "code -9"
    assert exit_detail(None, "") == ""


def start_failed_serverapp(procs: ProcessSet, log: Path) -> None:
    """A stand-in for the launcher's simulation process: Flower's exit lines, then status 1."""
    procs.start(SERVERAPP, [sys.executable, "-c", (
        f"import sys; sys.stderr.write({RAY_FAILED_LOG!r}); sys.exit(1)")], log)
    procs.procs[SERVERAPP].wait(timeout=30)


def test_a_run_ended_by_flowers_exit_code_names_the_process_and_the_code(
    tmp_path: Path,
) -> None:
    # Prepare: a log left by an earlier launch into the same run directory (a resumed run)
    # holds another code; the simulation process fails with 700; `flwr run` ends with 0.
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "serverapp.log").write_text("ERROR :     Exit Code: 201\n")
    procs = ProcessSet()
    fed: Any = SimpleNamespace(
        procs=procs, logs=logs, serverapp_log=logs / "serverapp.log",
        serverapp_process="the simulation process (the ServerApp and the virtual SuperNodes, "
                          "on Ray)")
    engine = SimulationEngine()
    engine.fed = fed
    watch = ProcessWatch(procs, lambda _: None)
    try:
        start_failed_serverapp(procs, logs / "serverapp.log")

        # Execute: what the launch says when the run ended without its summary, and what the
        # summary's reason says when the run ended early.
        failed = engine._what_ended(0, "the run ended without writing summary.json")
        reason = engine._incomplete_reason(watch, None, 0, 0)
    finally:
        assert procs.stop_all() == []

    # Assert: the process and Flower's code with its name; not flwr run's 0, not the earlier 201.
    for text in (failed, reason):
        assert text.startswith("the simulation process (the ServerApp and the virtual "
                               "SuperNodes, on Ray) exited (code 1; Flower's exit code 700 "
                               "SIMULATION_EXCEPTION"), text
        assert "exit code 0" not in text and "201" not in text
        assert f"see {logs / 'serverapp.log'}" in text and "\n" not in text


def test_a_run_ended_without_a_flower_code_names_flwr_run_only_when_it_failed(
    tmp_path: Path,
) -> None:
    logs = tmp_path / "logs"
    fed: Any = SimpleNamespace(procs=ProcessSet(), logs=logs, serverapp_log=logs / "x.log",
                               serverapp_process="the ServerApp's process")
    engine = SimulationEngine()
    engine.fed = fed
    try:
        assert engine._what_ended(0, "the run ended") == f"the run ended; see the logs in {logs}"
        assert engine._what_ended(2, "the run ended") == (
            f"the run ended (flwr run exited with code 2; see {logs})")
    finally:
        fed.procs.stop_all()


def test_the_watch_names_flowers_code_when_the_serverapp_exits_mid_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Prepare: the run's stream still going, the ServerApp seen running, then gone.
    monkeypatch.setattr(processes, "SERVERAPP_GRACE_S", 0.0)
    said: list[str] = []
    procs = ProcessSet()
    procs.start("flwr-run", ["sleep", "60"], tmp_path / "flwr-run.log")
    procs.start(SERVERAPP, ["sleep", "60"], tmp_path / "serverapp.log")
    watch = ProcessWatch(procs, said.append)
    try:
        watch.check()
        procs.stop(SERVERAPP)
        start_failed_serverapp(procs, tmp_path / "serverapp.log")
        # Execute: the first check starts the grace period, the second ends it.
        watch.check()
        watch.check()
    finally:
        assert procs.stop_all() == []

    # Assert
    assert said == [
        "gpfl: the ServerApp exited before the run ended (code 1; Flower's exit code 700 "
        "SIMULATION_EXCEPTION \"An unhandled exception occurred when running the "
        "simulation.\"); the run cannot go on"], said


def test_gpfl_tasks_lists_the_installed_tasks_and_what_the_device_allows(capsys) -> None:
    from deploy.cli import main

    code = main(["tasks", "--json", "--node-config", "allowed-tasks=synthetic,tabular"])
    rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)}

    assert code == 0
    assert {"synthetic", "digits", "tabular", "fairness"} <= set(rows)
    assert rows["synthetic"]["allowed"] and rows["tabular"]["allowed"]
    assert not rows["digits"]["allowed"]
    assert rows["synthetic"]["metric"] == "loss" and rows["synthetic"]["model_format"] == "numpy"
    assert rows["digits"]["metric"] == "accuracy" and rows["digits"]["model_format"] == "torch"
    assert "label-column" in rows["tabular"]["settings"]
    assert rows["synthetic"]["package"] == "gpfl"
