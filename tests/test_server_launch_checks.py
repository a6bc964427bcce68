"""What `gpfl launch` refuses at start, before any process runs: combinations that no round can
meet, and a ledger folder the devices could not write (each would fail every round, after
training). Before these checks, min-replies > clients-per-round surfaced as `Exit Code: 201`
after the whole federation started, and an unwritable ledger-dir as every round failing."""

from __future__ import annotations

from pathlib import Path

import pytest

from deploy.launcher import LaunchError, launch
from tests.conftest import flower_processes


@pytest.mark.parametrize(("run_config", "message"), [
    ({"min-replies": 3, "clients-per-round": 2},
     "min-replies=3 can never be reached with clients-per-round=2"),
    ({"min-replies": 3, "clients-per-round": 3},
     "min-replies=3 can never be reached with --supernodes 2"),
])
def test_a_quorum_no_round_can_meet_is_refused_at_start(
        tmp_path: Path, run_config: dict[str, int], message: str) -> None:
    with pytest.raises(LaunchError, match=message):
        launch(supernodes=2, out_dir=tmp_path / "run", run_config=run_config,
               echo=lambda _: None)
    assert flower_processes() == []


def test_an_unwritable_ledger_dir_is_refused_at_start(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(LaunchError, match=r"ledger-dir=.*a-file/ledgers.* is not writable"):
        launch(supernodes=2, out_dir=tmp_path / "run", policy={"ledger-dir": str(
            blocker / "ledgers")}, echo=lambda _: None)
    assert flower_processes() == []


def test_a_truncated_checkpoint_is_refused_before_the_federation_starts(tmp_path: Path) -> None:
    from deploy.rundir import LAUNCH_FILE, ResumeError, resume_arguments
    from server.checkpoint import CHECKPOINT_NAME

    run = tmp_path / "run"
    run.mkdir()
    (run / LAUNCH_FILE).write_text('{"supernodes": 2, "run_config": {}}')
    (run / CHECKPOINT_NAME).write_bytes(b"PK\x03\x04 truncated")
    (run / "summary.json").write_text('{"status": "incomplete", "incomplete_reason": "stale"}')

    with pytest.raises(ResumeError, match=r"is not a readable checkpoint.*start the run anew"):
        resume_arguments(run)


def test_a_superlink_database_on_the_simulation_engine_is_refused_at_start(
        tmp_path: Path) -> None:
    with pytest.raises(LaunchError, match="--superlink-database needs real SuperNodes"):
        launch(supernodes=2, out_dir=tmp_path / "run", engine="simulation",
               superlink_database=True, echo=lambda _: None)
    assert flower_processes() == []


def test_the_superlink_keeps_its_state_in_a_database_only_when_asked() -> None:
    # Flower's SQLite state doubles a round of 20 SuperNodes on 2 cores: opt-in, and a
    # federation option that --resume takes from the run directory (not given again).
    from deploy.cli import _FEDERATION_OPTIONS, _launch_arguments, build_parser

    parser = build_parser()
    assert _launch_arguments(parser.parse_args(["launch"]))["superlink_database"] is False
    assert _launch_arguments(parser.parse_args(
        ["launch", "--superlink-database"]))["superlink_database"] is True
    assert "superlink_database" in _FEDERATION_OPTIONS
    with pytest.raises(SystemExit, match="--superlink-database cannot be given with it"):
        _launch_arguments(parser.parse_args(
            ["launch", "--resume", "runs/x", "--superlink-database"]))
