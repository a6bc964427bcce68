"""A SuperLink killed mid-round and started again on Flower's persistent state; the run goes on.

``gpfl launch --superlink-database`` runs the SuperLink with ``--database <run dir>/superlink.db``
(without it, Flower's in-memory state, and a dead SuperLink ends the run). Its ServerApp and
SuperNodes outlive it and retry their connections, so the launcher starts it again on the same
ports and database and follows the same run (``flwr log``). Kept small: 2 SuperNodes, 3 rounds.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from server.launcher import SUPERLINK_DATABASE, Federation, launch
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
    # a device round 2 either way: its instruction lost with the SuperLink (not trained, not
    # charged; Flower marks an instruction delivered when a device's pull reaches the
    # SuperLink, so a pull the kill cut off loses it, and the device, missing that round, then
    # rests in round 3: sampled twice, one release; if both lost it, round 2 was lost on the
    # server's side and both are asked in round 3) or its reply lost in flight (charged, not
    # counted: one participation fewer). It can never cost a charge twice, nor a charge without
    # an instruction: at most one release a round the device was asked, and at most one round
    # lost to the kill.
    names = sorted(summary["privacy"]["per_client"])
    assert names == ["client-0", "client-1"]
    spend = ledger_spend(out / "ledgers", names)
    for name in names:
        releases, d_privacy = spend[name]
        client = summary["privacy"]["per_client"][name]
        assert 2 <= client["sampled"] <= 3, (name, client, history)
        assert client["sampled"] - 1 <= releases <= client["sampled"], (name, client, releases)
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
