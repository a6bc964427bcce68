"""A SuperLink killed mid-round and started again on Flower's persistent state; the run goes on.

``gpfl launch --superlink-database`` runs the SuperLink with ``--database <run dir>/superlink.db``
(without it, Flower's in-memory state, and a dead SuperLink ends the run). Its ServerApp and
SuperNodes outlive it and retry their connections, so the launcher starts it again on the same
ports and database and follows the same run (``flwr log``). Kept small: 2 SuperNodes, 3 rounds.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from deploy.launcher import SUPERLINK_DATABASE, Federation, describe, launch
from tests.conftest import flower_processes, ledger_spend

pytestmark = pytest.mark.integration

N_OVER_NU = 2 / 5  # cost of one release: n/ν with n = 2, ν = 5


@pytest.mark.timeout(300)
def test_a_superlink_killed_mid_round_restarts_on_its_database_and_the_run_completes(
    tmp_path: Path, no_leftover_processes: None
) -> None:
    # Prepare: 3 rounds, both devices sampled every round. When round 2 starts, the SuperLink
    # process alone is SIGKILLed (its ServerApp and the SuperNodes keep running), with round 2's
    # instructions being pushed, in its database, or on their way to the devices.
    out = tmp_path / "run"
    killed: list[int] = []

    def kill_superlink(line: str, fed: Federation) -> None:
        if "[ROUND 2]" in line and not killed:
            superlink = fed.procs.procs["superlink"]
            superlink.send_signal(signal.SIGKILL)
            killed.append(superlink.pid)

    # Execute
    result = launch(supernodes=2, out_dir=out, echo=lambda _: None, timeout=240,
                    run_config={"num-rounds": 3, "clients-per-round": 2, "patience": 0,
                                "seed": 7},
                    superlink_database=True, on_line=kill_superlink)

    # Assert: the SuperLink died once and the same run (no resume) did all its rounds.
    summary = result.summary
    assert killed and result.died["superlink"] == -signal.SIGKILL
    assert (out / SUPERLINK_DATABASE).is_file()
    assert result.finished and summary["status"] == "complete"
    assert [e["round"] for e in summary["history"]] == [0, 1, 2, 3]
    assert not summary.get("resumed")
    # Assert: the rounds after the restart were played: round 3 got replies.
    history = summary["history"]
    assert history[-1]["replies"] >= 1, history
    # Assert: every device's spend exactly once, and what summary.json reports (the devices'
    # reports and the ledgers read after the run) is what each ledger holds. The kill can cost
    # a device a round either way: its instruction lost with the SuperLink (not trained, not
    # charged; Flower marks an instruction delivered when a device's pull reaches the
    # SuperLink, so a pull the kill cut off loses it) or its reply lost in flight (charged, not
    # counted: one participation fewer). A device still reconnecting when the next round
    # starts (Flower's SuperNode waits up to 20 s between tries, and the SuperLink answers for
    # a node whose heartbeat is overdue) misses that one too; a device that missed a round
    # rests the next, unless every device missed it together (then round 2 was lost on the
    # server's side and both are asked again in round 3). The kill can never cost a charge
    # twice, nor a charge without an instruction: at most one release a round the device was
    # asked, each round it was asked is accounted for in its record, and round 1, before the
    # kill, was released.
    names = sorted(summary["privacy"]["per_client"])
    assert names == ["client-0", "client-1"]
    spend = ledger_spend(out / "ledgers", names)
    for name in names:
        releases, d_privacy = spend[name]
        client = summary["privacy"]["per_client"][name]
        assert 2 <= client["sampled"] <= 3, (name, client, history)
        assert 1 <= releases <= client["sampled"], (name, client, releases)
        assert client["sampled"] == (client["participations"] + client["declines"]
                                     + client["dropped"] + client["failures"]
                                     + client["missing"]), (name, client)
        assert client["participations"] <= releases <= client["participations"] + 1, (
            name, client, releases)
        assert d_privacy == pytest.approx(releases * N_OVER_NU)
        assert summary["ledgers"]["per_client"][name]["spend"] == pytest.approx(d_privacy)
        # What the device's counted replies reported lags its ledger by the release whose
        # reply the kill lost, if it was not asked again after it (it rested in round 3); the
        # ledgers read after the run, above, hold that release.
        lost = releases - client["participations"]
        assert client["spend"] == pytest.approx(d_privacy) or (
            lost == 1 and client["spend"] == pytest.approx(d_privacy - N_OVER_NU)), (
            name, client, releases)
    assert flower_processes() == []


#: Flower 1.39's heartbeat window for a running ServerApp task (2 x 30 s; a unit test checks it
#: against the installed Flower): a restarted SuperLink that answers later refuses its token.
WINDOW_S = 60.0


def _hold_the_next_superlink(fed: Federation, old_pid: int, hold_s: float,
                             held: list[int], done: threading.Event) -> None:
    """SIGSTOP the SuperLink the launcher starts in place of ``old_pid``, for ``hold_s``."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not done.is_set():
        proc = fed.procs.procs.get("superlink")
        if proc is not None and proc.pid != old_pid and proc.poll() is None:
            os.kill(proc.pid, signal.SIGSTOP)
            held.append(proc.pid)
            done.wait(hold_s)
            try:
                os.kill(proc.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
            return
        time.sleep(0.01)


@pytest.mark.timeout(300)
def test_a_superlink_back_later_than_flowers_window_ends_the_run_resumable_with_its_reason(
    tmp_path: Path, no_leftover_processes: None
) -> None:
    # Prepare: as above, but the SuperLink started again is held (SIGSTOP, as on a host too
    # loaded to schedule it) for longer than Flower's heartbeat window: its database says the
    # ServerApp's token expired while it was away.
    out = tmp_path / "run"
    killed: list[int] = []
    held: list[int] = []
    killed_at: list[float] = []
    done = threading.Event()

    def kill_superlink(line: str, fed: Federation) -> None:
        if "[ROUND 2]" in line and not killed:
            superlink = fed.procs.procs["superlink"]
            superlink.send_signal(signal.SIGKILL)
            killed.append(superlink.pid)
            killed_at.append(time.monotonic())
            threading.Thread(target=_hold_the_next_superlink, daemon=True, args=(
                fed, superlink.pid, WINDOW_S + 10, held, done)).start()

    # Execute
    try:
        result = launch(supernodes=2, out_dir=out, echo=lambda _: None, timeout=240,
                        run_config={"num-rounds": 3, "clients-per-round": 2, "patience": 0,
                                    "seed": 7},
                        superlink_database=True, on_line=kill_superlink)
    finally:
        done.set()
    ended = time.monotonic()

    # Assert: the run ended resumable (round 1 is kept), within the window and half a minute of
    # the kill, saying in one line what happened and why it could not go on.
    assert killed and held
    summary = result.summary
    assert result.status == "incomplete" and summary["last_round"] >= 1
    reason = summary["incomplete_reason"]
    assert "started again on its database" in reason, reason
    assert f"more than {WINDOW_S:.0f} s (Flower's heartbeat window)" in reason, reason
    assert "\n" not in reason
    assert ended - killed_at[0] <= WINDOW_S + 30, ended - killed_at[0]
    assert "launch --resume" in describe(result)
    # Assert: every release the devices made is in their ledgers and in summary.json.
    names = sorted(summary["privacy"]["per_client"])
    spend = ledger_spend(out / "ledgers", names)
    for name in names:
        assert summary["ledgers"]["per_client"][name]["spend"] == pytest.approx(spend[name][1])
    assert flower_processes() == []
