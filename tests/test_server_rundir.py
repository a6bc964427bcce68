"""What `gpfl launch` keeps and reads in a run directory, and how it reports a run's end.

No Flower processes: ``launch.json`` and ``--resume``, the ledger reconciliation, the process
watch (on ``sleep`` processes), the closing lines and the exit status.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from deploy import cli
from deploy.launcher import LaunchResult, describe
from deploy.processes import ProcessSet, ProcessWatch
from deploy.rundir import ResumeError, add_ledgers, ledger_report, resume_arguments, save_launch
from mechanisms import MetricPrivacyEvent, PrivacyLedger
from server import results
from server.checkpoint import CHECKPOINT_NAME, write_checkpoint


def saved_run(tmp_path: Path, status: str = "incomplete") -> Path:
    run = tmp_path / "run"
    run.mkdir()
    save_launch(run, {
        "supernodes": 3, "run_config": {"num-rounds": 4, "out-dir": str(run),
                                        "resume-from": "/elsewhere"},
        "node_configs": {2: {"client-epsilons": "1"}}, "policy": {"cap-d-privacy": 5.0},
        "app_dir": tmp_path / "app", "tls": True, "auth": False, "simulation": False,
        "node_env": {1: {"CUDA_VISIBLE_DEVICES": "1"}},
    })
    write_checkpoint(run / CHECKPOINT_NAME, {}, {})
    (run / "summary.json").write_text(json.dumps({"status": status}))
    return run


def test_resume_replays_the_saved_launch_into_the_same_run_directory(tmp_path: Path) -> None:
    # Prepare
    run = saved_run(tmp_path)

    # Execute
    kwargs = resume_arguments(run)

    # Assert: the same federation (node indices back to ints), the same run config without
    # the saved launch's per-launch keys, continuing from this directory.
    assert kwargs["supernodes"] == 3 and kwargs["tls"] is True
    assert kwargs["engine"] == "deployment" and "simulation" not in kwargs  # an older launch.json
    assert kwargs["node_configs"] == {2: {"client-epsilons": "1"}}
    assert kwargs["node_env"] == {1: {"CUDA_VISIBLE_DEVICES": "1"}}
    assert kwargs["policy"] == {"cap-d-privacy": 5.0}
    assert kwargs["app_dir"] == tmp_path / "app"
    assert kwargs["out_dir"] == run.resolve()
    assert kwargs["run_config"] == {"num-rounds": 4, "resume-from": str(run.resolve())}


@pytest.mark.parametrize(("damage", "message"), [
    ("no-launch", "no launch.json"),
    ("no-checkpoint", "no checkpoint.npz"),
    ("complete", "the run is complete; nothing to resume"),
    ("stopped-early", "the run is stopped-early"),
    ("bad-json", "is not JSON"),
])
def test_resume_refuses_what_cannot_be_continued(tmp_path: Path, damage: str,
                                                 message: str) -> None:
    run = saved_run(tmp_path, status=damage if damage in ("complete", "stopped-early")
                    else "incomplete")
    if damage == "no-launch":
        (run / "launch.json").unlink()
    elif damage == "no-checkpoint":
        (run / CHECKPOINT_NAME).unlink()
    elif damage == "bad-json":
        (run / "launch.json").write_text("{")
    with pytest.raises(ResumeError, match=message):
        resume_arguments(run)


def write_ledger(folder: Path, name: str, costs: list[float]) -> None:
    ledger = PrivacyLedger(folder / f"{name}.json", delta=1e-5)
    for cost in costs:
        ledger.charge(MetricPrivacyEvent(((cost, 1.0),)), cap=None)


def test_the_ledgers_section_holds_what_each_ledger_holds(tmp_path: Path) -> None:
    # Prepare: two devices in the shared folder spent 0.4 + 0.4 and 0.4; a third keeps its
    # ledger elsewhere (its own ledger-path) and spent 0.4; a fourth's ledger is garbage; a
    # fifth never released (no file).
    folder = tmp_path / "ledgers"
    write_ledger(folder, "client-0", [0.4, 0.4])
    write_ledger(folder, "client-1", [0.4])
    write_ledger(tmp_path / "own", "client-2", [0.4])
    (folder / "client-3.json").write_text("not a ledger")
    paths = [folder / "client-0.json", folder / "client-1.json",
             tmp_path / "own" / "client-2.json", folder / "client-3.json",
             folder / "client-4.json"]
    summary = {"status": "incomplete", "privacy": {"mechanism": "laplace", "max": 0.4}}

    # Execute
    out = add_ledgers(tmp_path, summary, paths)

    # Assert: Σ ε·r per device, median and max over the readable ones; the bad one is named,
    # the one that never released is absent.
    section = out["ledgers"]["per_client"]
    assert sorted(section) == ["client-0", "client-1", "client-2", "client-3"]
    assert section["client-0"]["spend"] == pytest.approx(0.8)
    assert section["client-0"]["releases"] == 2
    assert section["client-1"]["spend"] == pytest.approx(0.4)
    assert section["client-2"]["spend"] == pytest.approx(0.4)
    assert "error" in section["client-3"]
    assert out["ledgers"]["max"] == pytest.approx(0.8)
    assert out["ledgers"]["median"] == pytest.approx(0.4)
    assert json.loads((tmp_path / "summary.json").read_text())["ledgers"]["max"] == \
        pytest.approx(0.8)
    assert ledger_report([tmp_path / "nowhere.json"], "laplace") is None


def test_the_watch_reports_a_dead_supernode_and_ends_the_run_when_the_superlink_dies(
    tmp_path: Path,
) -> None:
    # Prepare: stand-ins for a SuperNode, the SuperLink and `flwr run` (sleep processes).
    procs = ProcessSet()
    lines: list[str] = []
    try:
        for name in ("supernode-0", "superlink", "flwr-run"):
            procs.start(name, ["sleep", "60"], tmp_path / f"{name}.log")
        watch = ProcessWatch(procs, lines.append, interval=0.05)
        with watch:
            # Execute: the SuperNode dies, then the SuperLink.
            procs.procs["supernode-0"].send_signal(signal.SIGKILL)
            procs.procs["supernode-0"].wait()
            procs.procs["superlink"].send_signal(signal.SIGKILL)
            procs.procs["flwr-run"].wait(timeout=10)
            time.sleep(0.2)

        # Assert: each is reported once, and `flwr run` was ended (not left retrying).
        assert watch.died == {"supernode-0": -9, "superlink": -9}
        assert procs.procs["flwr-run"].returncode == -signal.SIGTERM
        assert sum("supernode-0 exited" in line for line in lines) == 1
        assert sum("SuperLink exited" in line for line in lines) == 1
    finally:
        assert procs.stop_all() == []


def result(status: str, **summary: Any) -> LaunchResult:
    return LaunchResult(Path("/runs/x"), {"status": status, "rounds_completed": 2,
                                          "privacy": {"unit": "u", "median": 0.4, "max": 0.8},
                                          **summary}, None, 0)


def test_the_closing_lines_quote_the_ledgers_and_say_how_to_resume() -> None:
    text = describe(result("incomplete", incomplete_reason="the SuperLink exited (code -9)",
                           ledgers={"median": 0.6, "max": 1.2}))
    assert "devices' ledgers): median 0.6, max 1.2" in text
    assert "run incomplete: the SuperLink exited (code -9)" in text
    assert "gpfl launch --resume /runs/x" in text
    complete = describe(result("complete"))
    assert "as reported): median 0.4, max 0.8" in complete and "resume" not in complete
    assert complete.startswith("gpfl: 2 rounds\n")


def test_the_closing_lines_say_where_a_large_models_hypotheses_are() -> None:
    small = describe(result("complete", hypotheses=[[1.0, 2.0], [3.0, -4.5]]))
    assert "gpfl: hypotheses [1.000, 2.000]; [3.000, -4.500]" in small
    large = describe(result("complete", hypotheses={
        "checkpoint": "checkpoint.npz", "array": "best_hypotheses", "shape": [2, 83562],
        "dtype": "float32"}))
    assert ("gpfl: hypotheses: 2 of 83562 parameters, array 'best_hypotheses' of "
            "/runs/x/checkpoint.npz") in large


def test_the_closing_line_counts_rounds_that_kept_the_hypotheses() -> None:
    # 4 rounds ran; in 3 of them too few usable replies came (the hypotheses were kept).
    text = describe(result("complete", last_round=4, rounds_completed=1))
    assert text.startswith("gpfl: 4 rounds (1 changed the hypotheses)\n")


@pytest.mark.parametrize(("status", "code"), [("complete", 0), ("stopped-early", 0),
                                              ("incomplete", results.EXIT_INCOMPLETE)])
def test_the_exit_status_says_whether_the_run_finished(
    monkeypatch: pytest.MonkeyPatch, status: str, code: int
) -> None:
    monkeypatch.setattr("deploy.launcher.launch", lambda **_: result(status))
    assert cli.main(["launch", "--supernodes", "2"]) == code


def test_resume_takes_the_federation_from_the_run_directory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    run = saved_run(tmp_path)
    seen: dict[str, Any] = {}
    monkeypatch.setattr("deploy.launcher.launch",
                        lambda **kwargs: seen.update(kwargs) or result("complete"))
    assert cli.main(["launch", "--resume", str(run), "--run-config", "round-timeout=30"]) == 0
    assert seen["supernodes"] == 3 and seen["out_dir"] == run.resolve()
    assert seen["run_config"]["round-timeout"] == 30
    assert seen["run_config"]["resume-from"] == str(run.resolve())
    with pytest.raises(SystemExit, match="--supernodes, --tls cannot be given with it"):
        cli.main(["launch", "--resume", str(run), "--supernodes", "4", "--tls"])
    assert cli.main(["launch", "--resume", str(tmp_path / "none")]) == 1



def test_a_bare_launch_asks_for_the_quickstart_and_the_command_line_wins(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    from deploy.quickstart import QUICKSTART_RUN_CONFIG, QUICKSTART_SUPERNODES, ROBUST_CLUSTERS

    seen: list[dict[str, Any]] = []
    monkeypatch.setattr("deploy.launcher.launch",
                        lambda **kwargs: seen.append(kwargs) or result("complete"))
    assert cli.main(["launch"]) == 0
    assert seen[-1]["supernodes"] == QUICKSTART_SUPERNODES
    assert seen[-1]["run_config"] == {**QUICKSTART_RUN_CONFIG, **ROBUST_CLUSTERS,
                                      "clients-per-round": QUICKSTART_SUPERNODES}
    # Every SuperNode each round, whatever their number; a given key wins over the preset.
    assert cli.main(["launch", "--supernodes", "8", "--run-config", "local-epochs=2"]) == 0
    assert seen[-1]["run_config"]["clients-per-round"] == 8
    assert seen[-1]["run_config"]["local-epochs"] == 2
    # --app-defaults: only what was given; the app's defaults (the paper's setting) do the rest.
    assert cli.main(["launch", "--app-defaults", "--run-config", "num-rounds=3"]) == 0
    assert seen[-1]["run_config"] == {"num-rounds": 3}
    with pytest.raises(SystemExit, match="--app-defaults cannot be given with it"):
        cli.main(["launch", "--resume", "/runs/x", "--app-defaults"])
