"""Faults over real Flower processes: a device stuck past the deadline, a killed SuperLink.

What only real processes show: that Flower's round timeout (the instructions' TTL on the
SuperLink) really ends a round whose device hangs, and that a run killed mid-way continues from
its checkpoint with ``resume-from``. Kept small (2 SuperNodes, a few rounds): a round costs
~6-12 s here, a launch ~15 s to start.
"""

from __future__ import annotations

import json
import shutil
import signal
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import psutil
import pytest

from deploy.launcher import SUPERLINK_DATABASE, Federation, describe, launch
from deploy.rundir import ResumeError, resume_arguments
from mechanisms import PrivacyLedger
from tests.conftest import flower_processes, ledger_spend

pytestmark = pytest.mark.integration

N_OVER_NU = 2 / 5  # cost of one release: n/ν with n = 2, ν = 5


def signal_tree(pid: int, signum: int) -> list[int]:
    """Send ``signum`` to a process and all its descendants (by PID); return the PIDs."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []
    for proc in procs:
        try:
            proc.send_signal(signum)
        except psutil.NoSuchProcess:
            pass
    return [p.pid for p in procs]


@pytest.mark.timeout(300)
def test_a_hung_supernode_costs_one_deadline_and_the_run_goes_on(
    tmp_path: Path, no_leftover_processes: None
) -> None:
    # Prepare: 2 SuperNodes, both sampled every round, a 20 s deadline (a round takes ~6-12 s
    # here, more when the machine is busy). After round 1 SuperNode 1 is frozen (SIGSTOP on
    # its whole process tree: alive to the OS, silent to the SuperLink); it is thawed once a
    # round has ended without it.
    timeout = 20.0
    events: dict[str, float] = {}
    frozen: list[int] = []

    def chaos(line: str, fed: Federation) -> None:
        if "[gpfl] round " in line and "missing 1" not in line:
            events["last_round_line"] = time.monotonic()
        if "[gpfl] round 1/3" in line and not frozen:
            frozen.extend(signal_tree(fed.procs.procs["supernode-1"].pid, signal.SIGSTOP))
            events["frozen"] = time.monotonic()
        elif frozen and "missing 1" in line and "thawed" not in events:
            events["missed"] = time.monotonic()
            events["round_s"] = events["missed"] - events["last_round_line"]
            signal_tree(fed.procs.procs["supernode-1"].pid, signal.SIGCONT)
            events["thawed"] = time.monotonic()

    # Execute
    try:
        result = launch(
            supernodes=2, out_dir=tmp_path / "run", echo=lambda _: None, timeout=240,
            run_config={"num-rounds": 3, "clients-per-round": 2, "patience": 0, "seed": 3,
                        "round-timeout": timeout},
            on_line=chaos,
        )
    finally:
        for pid in frozen:  # never leave a stopped process behind, whatever happened
            try:
                psutil.Process(pid).send_signal(signal.SIGCONT)
            except psutil.NoSuchProcess:
                pass

    # Assert: one round ended at its deadline with client-1 missing, and the run completed.
    summary = result.summary
    assert summary["status"] == "complete" and summary["last_round"] == 3
    missed = [e for e in summary["history"] if e["missing"]]
    assert len(missed) == 1 and missed[0]["missing"] == ["client-1"]
    assert missed[0]["replies"] == 1 and missed[0]["round"] in (2, 3)
    # The round ended at the deadline (the SuperLink checks TTLs when the ServerApp pulls
    # replies, every 3 s; log lines reach the launcher ~1 s late), not after Flower's 12 h
    # default TTL or the SuperLink's 60 s heartbeat patience.
    assert timeout - 3 <= events["round_s"] <= timeout + 15
    per_client = summary["privacy"]["per_client"]
    assert per_client["client-1"]["missing"] == 1
    if missed[0]["round"] == 2:  # a device that missed a round sits out the next (back-off)
        assert summary["history"][3]["replies"] == 1
    # Assert: reported spend is what each ledger holds (a release charged while frozen and
    # refused as late is in the next report, which carries the ledger's total).
    for name in ("client-0", "client-1"):
        ledger = PrivacyLedger(tmp_path / "run" / "ledgers" / f"{name}.json", delta=1e-5)
        if per_client[name]["last_round"] == 3:
            assert per_client[name]["spend"] == pytest.approx(ledger.spent().d_privacy)
    assert flower_processes() == []


#: Appended to a copy of the client that every device runs: in round 2 every device waits past
#: the round's deadline before it trains (as in an outage at the server, the round is lost by
#: all of them while each stays alive and connected); in round 4 client-0 alone does.
SLOW_ROUND_CLIENT = """

import time as _time

_honest_fit = GpflClient.fit


def _slow_fit(self, parameters, config):
    late = int(config.get("server-round", 0))
    if late == 2 or (late == 4 and self.policy.client_name == "client-0"):
        _time.sleep({seconds})
    return _honest_fit(self, parameters, config)


GpflClient.fit = _slow_fit
"""


@pytest.mark.timeout(300)
def test_a_round_every_device_missed_is_asked_again_and_the_run_completes(
    tmp_path: Path, no_leftover_processes: None
) -> None:
    # Prepare: 3 devices, all sampled every round and all needed (min-replies 3), a 15 s
    # deadline; in round 2 all three answer 1 s after it (their late replies refused), in
    # round 4 client-0 alone does; each serves the next round at once. (With a 10 s deadline
    # and 2 s late, a loaded machine once made a device miss round 3 too, catching up.)
    timeout = 15.0
    app = rogue_app(tmp_path / "slow-app")
    client = app / "client" / "numpy_client.py"
    client.write_text(client.read_text().replace(
        ROGUE_CLIENT, SLOW_ROUND_CLIENT.format(seconds=timeout + 1)))

    # Execute
    result = launch(supernodes=3, out_dir=tmp_path / "run", echo=lambda _: None, timeout=240,
                    app_dir=app, node_env={i: {"PYTHONPATH": str(app)} for i in range(3)},
                    run_config={"num-rounds": 5, "clients-per-round": 3, "min-replies": 3,
                                "patience": 0, "seed": 3, "round-timeout": timeout})

    # Assert: round 2 lost by every device, round 3 asked them all at once and counted them
    # (before, nobody had answered their last round: round 3 asked nobody and the run stopped,
    # "too few devices: 3 connected, 0 answered their last round"). Round 4 lost by client-0
    # alone: round 5 asked whether it was alive, it answered, and all three were asked and
    # counted (before: "too few devices: 3 connected, 2 answered their last round").
    summary = result.summary
    history = {e["round"]: e for e in summary["history"] if e["round"]}
    assert sorted(history[2]["missing"]) == ["client-0", "client-1", "client-2"], history
    assert history[4]["missing"] == ["client-0"], history
    assert summary["status"] == "complete" and summary["last_round"] == 5, summary.get(
        "incomplete_reason")
    assert history[3]["replies"] == 3 and history[5]["replies"] == 3, history
    log = (tmp_path / "run" / "logs" / "flwr-run.log").read_text()
    assert "missed round 2 and no other: taken as a round lost on the server's side" in log
    assert "round 5: 1 of 1 answered; they count this round" in log
    assert flower_processes() == []


#: Appended to a copy of the client that both devices run: in round 2, once (a marker file in
#: the folder named below says it happened; the resumed launch runs the same copy), client-0
#: charges its release and then holds its reply until it is stopped: a release charged and in
#: flight. client-1 holds *before* its charge and charges only once it is told to stop
#: (SIGTERM), as a device that finishes its round while the federation shuts down; then it exits.
HOLDING_CLIENT = """

import signal as _signal
import time as _time
from pathlib import Path as _Path

_honest_fit = GpflClient.fit
_MARKERS = _Path({markers!r})


def _holding_fit(self, parameters, config):
    name = self.policy.client_name
    marker = _MARKERS / name
    if int(config.get("server-round", 0)) != 2 or marker.exists():
        return _honest_fit(self, parameters, config)
    marker.touch()
    if name == "client-0":
        result = _honest_fit(self, parameters, config)
        _time.sleep(300)  # the executor's SIGTERM handler ends this: the reply never leaves
        return result
    stopped = []
    previous = _signal.signal(_signal.SIGTERM, lambda signum, frame: stopped.append(signum))
    deadline = _time.monotonic() + 300
    while not stopped and _time.monotonic() < deadline:
        _time.sleep(0.05)
    # The launcher signals the whole tree and the runner signals its executor again: a second
    # SIGTERM during the fit would end it before the charge, so the handler stays until then.
    result = _honest_fit(self, parameters, config)  # charged after the SuperLink died
    _signal.signal(_signal.SIGTERM, previous)
    if stopped:
        raise SystemExit(128 + stopped[0])
    return result


GpflClient.fit = _holding_fit
"""


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``condition`` every 0.1 s; fail the test, saying ``what``, after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout:g} s for {what}")
        time.sleep(0.1)


@pytest.mark.timeout(300)
def test_a_run_whose_superlink_is_killed_is_reported_incomplete_and_resumes(
    tmp_path: Path, no_leftover_processes: None
) -> None:
    # Prepare: 3 rounds planned, both devices asked every round, both running the holding
    # client. Once round 1 is recorded, the test waits until client-0's ledger holds its round-2
    # release (it then holds its reply) and client-1 holds before its charge, and SIGKILLs the
    # SuperLink and everything under it (the ServerApp). Nothing else is done for the launcher:
    # it must notice, end `flwr run` and say the run is incomplete.
    out = tmp_path / "run"
    markers = tmp_path / "markers"
    markers.mkdir()
    app = rogue_app(tmp_path / "holding-app")
    client = app / "client" / "numpy_client.py"
    client.write_text(client.read_text().replace(
        ROGUE_CLIENT, HOLDING_CLIENT.format(markers=str(markers))))
    # The quickstart's server update, stalling at every validation that is not a new best, so
    # that its restores run over real processes and across the resume.
    run_config = {"num-rounds": 3, "clients-per-round": 2, "patience": 0, "seed": 5,
                  "server-update": "plateau", "anneal-after": 1}
    names = ("client-0", "client-1")
    killed: list[str] = []

    def kill_superlink(line: str, fed: Federation) -> None:
        if "[gpfl] round 1/3" in line and not killed:
            wait_until(lambda: ledger_spend(out / "ledgers", names)["client-0"][0] == 2, 60,
                       "client-0 to charge its round-2 release")
            wait_until((markers / "client-1").exists, 60, "client-1 to hold before its charge")
            signal_tree(fed.procs.procs["superlink"].pid, signal.SIGKILL)
            killed.append(line)

    first = launch(supernodes=2, out_dir=out, echo=lambda _: None, timeout=200, app_dir=app,
                   run_config=run_config, on_line=kill_superlink,
                   node_env={i: {"PYTHONPATH": str(app)} for i in range(2)})
    assert killed and first.status == "incomplete" and not first.finished
    assert first.died["superlink"] == -signal.SIGKILL
    assert "SuperLink exited" in first.summary["incomplete_reason"]
    # The default SuperLink keeps its state in memory (no database to start it again on).
    assert not (out / SUPERLINK_DATABASE).exists()
    assert first.summary["last_round"] == 1
    assert "gpfl launch --resume" in describe(first)
    # The ledgers hold every release, the two of round 2 included: client-0's, charged before
    # the kill, and client-1's, charged while the launcher stopped it (before: read before the
    # SuperNodes were stopped, the launch reported client-1 one release short). What the launch
    # reports is what the ledger files hold once it returned.
    on_disk = ledger_spend(out / "ledgers", names)
    ledgers = first.summary["ledgers"]["per_client"]
    for name, client_record in first.summary["privacy"]["per_client"].items():
        assert client_record["participations"] == 1
        assert on_disk[name][0] == 2, (name, on_disk)  # one more than the rounds recorded
        assert ledgers[name]["releases"] == 2 and ledgers[name]["spend"] == pytest.approx(
            on_disk[name][1])
    assert json.loads((out / "summary.json").read_text())["ledgers"]["per_client"] == ledgers
    assert flower_processes() == []

    # Execute: `gpfl launch --resume` (its arguments): a new federation (new SuperNodes, new
    # node ids, the same devices' ledgers) continues the run directory.
    second = launch(**resume_arguments(out), echo=lambda _: None, timeout=200)

    # Assert: rounds 2 and 3 ran once each, after the one of the checkpoint.
    summary = second.summary
    assert second.finished and summary["status"] == "complete"
    assert [e["round"] for e in summary["history"]] == [0, 1, 2, 3]
    assert [r["after_round"] for r in summary["resumed"]] == [1]
    assert summary["rounds_completed"] == 3
    # Assert: no release is forgotten or charged twice: each device took part in the 3 rounds,
    # its ledger holds those releases plus the one lost in round 2, and what the summary reports
    # is what the ledger holds.
    for name, client_record in summary["privacy"]["per_client"].items():
        ledger = PrivacyLedger(out / "ledgers" / f"{name}.json", delta=1e-5).spent()
        assert client_record["participations"] == 3 and len(client_record["node_ids"]) == 2
        assert ledger.releases == 4
        assert client_record["spend"] == pytest.approx(ledger.d_privacy)
        assert ledger.d_privacy == pytest.approx(ledger.releases * N_OVER_NU)
    with pytest.raises(ResumeError, match="complete; nothing to resume"):
        resume_arguments(out)
    assert flower_processes() == []


@pytest.mark.timeout(300)
def test_a_dead_serverapp_ends_the_launch_at_once_with_its_reason(
    tmp_path: Path, no_leftover_processes: None
) -> None:
    # Prepare: the ServerApp process alone (the launcher's deploy.serverapp_runner) is
    # SIGKILLed once round 1 is recorded; the SuperLink and the SuperNodes live on.
    import time

    import psutil

    killed: list[float] = []

    def command(p: psutil.Process) -> list[str]:
        # A child that has just exited (a ClientApp) may be a zombie, or gone, by now.
        try:
            return p.cmdline()[:3]
        except psutil.Error:
            return []

    def kill_serverapp(line: str, fed: Federation) -> None:
        if "[gpfl] round 1/" in line and not killed:
            apps = [p for p in psutil.Process().children(recursive=True)
                    if "deploy.serverapp_runner" in command(p)
                    or any(Path(part).name == "flwr-serverapp" for part in command(p))]
            assert len(apps) == 1
            apps[0].kill()
            killed.append(time.monotonic())

    # Execute
    result = launch(supernodes=2, out_dir=tmp_path / "run", echo=lambda _: None, timeout=200,
                    run_config={"num-rounds": 30, "clients-per-round": 2, "patience": 0},
                    on_line=kill_serverapp)

    # Assert: the launcher saw the ServerApp go (before, it waited for Flower to notice, about
    # a minute, and then could only say that `flwr run` had ended); resumable.
    ended = time.monotonic()
    assert killed
    assert result.status == "incomplete" and not result.finished
    assert "the ServerApp exited during the run" in result.summary["incomplete_reason"]
    assert "gpfl launch --resume" in describe(result)
    print(f"the launch ended {ended - killed[0]:.1f} s after the ServerApp was killed")
    assert flower_processes() == []


#: Appended to a copy of the client: the device named client-1 sends garbage every round
#: (after charging its ledger honestly): NaN in round 1, 4, ...; a wrong shape in round 2, 5,
#: ...; its release times 1e12 in round 3, 6, ...
ROGUE_CLIENT = """

import numpy as _np

_honest_fit = GpflClient.fit


def _rogue_fit(self, parameters, config):
    arrays, count, metrics = _honest_fit(self, parameters, config)
    if self.policy.client_name != "client-1" or not arrays:
        return arrays, count, metrics
    kind = int(config.get("server-round", 0)) % 3
    if kind == 1:
        arrays = [_np.full_like(a, _np.nan) for a in arrays]
    elif kind == 2:
        arrays = [a.reshape(-1)[:-1] for a in arrays]
    else:
        arrays = [a * _np.float32(1e12) for a in arrays]
    return arrays, count, metrics


GpflClient.fit = _rogue_fit
"""


def rogue_app(folder: Path) -> Path:
    """Copy the Flower app to ``folder`` with :data:`ROGUE_CLIENT` in its client."""
    root = Path(__file__).resolve().parent.parent
    folder.mkdir()
    shutil.copy(root / "pyproject.toml", folder / "pyproject.toml")
    for package in ("settings", "mechanisms", "strategies", "client", "server", "tasks"):
        shutil.copytree(root / package, folder / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    client = folder / "client" / "numpy_client.py"
    client.write_text(client.read_text() + ROGUE_CLIENT)
    return folder


@pytest.mark.timeout(400)
def test_a_run_survives_a_garbage_sending_device_and_a_killed_one(
    tmp_path: Path, no_leftover_processes: None
) -> None:
    # Prepare: 3 SuperNodes, all sampled, a 20 s deadline. client-1 runs a rogue client (the
    # app it is handed, and its own installation, are the rogue copy) that sends NaN, a wrong
    # shape and a 1e12-times release in rounds 1, 2, 3; SuperNode 2 is SIGKILLed (its whole
    # tree) once round 1 is recorded.
    app = rogue_app(tmp_path / "rogue-app")
    killed: list[int] = []
    lines: list[str] = []

    def kill_supernode(line: str, fed: Federation) -> None:
        if "[gpfl] round 1/3" in line and not killed:
            killed.extend(signal_tree(fed.procs.procs["supernode-2"].pid, signal.SIGKILL))

    # Execute
    result = launch(
        supernodes=3, out_dir=tmp_path / "run", echo=lines.append, timeout=360, app_dir=app,
        run_config={"num-rounds": 3, "clients-per-round": 3, "patience": 0, "seed": 7,
                    "round-timeout": 20.0},
        node_env={1: {"PYTHONPATH": str(app)}}, on_line=kill_supernode,
    )

    # Assert: the run did all its rounds, and the launch said which device died.
    summary = result.summary
    assert killed and result.finished and summary["status"] == "complete"
    assert summary["last_round"] == 3
    assert result.died == {"supernode-2": -signal.SIGKILL}
    assert any("supernode-2 exited" in line for line in lines)
    # Assert: each garbage reply was dropped, with the device and the reason, every round.
    expected = {1: "non-finite values", 2: "shape", 3: "beyond"}
    for entry in summary["history"][1:]:
        reasons = [reason for device, reason in entry["dropped"] if device == "client-1"]
        assert len(reasons) == 1 and expected[entry["round"]] in reasons[0], entry
    assert summary["privacy"]["per_client"]["client-1"]["dropped"] == 3
    # Assert: the killed device took part until it died: in round 1, and in round 2 as well
    # when the kill (sent once round 1's line reaches the launcher, about a second late: about
    # a round under load) landed after its round-2 reply; never in round 3. The hypotheses
    # stayed finite and of the task's scale (the 1e12 release would have moved one to ~1e12).
    client2 = summary["privacy"]["per_client"]["client-2"]
    assert client2["participations"] in (1, 2) and client2["last_round"] < 3, client2
    values = np.array(summary["last_hypotheses"], dtype=float)
    assert np.isfinite(values).all() and np.abs(values).max() < 100
    assert flower_processes() == []
