"""Faults over real Flower processes: a device stuck past the deadline, a killed SuperLink.

What only real processes show: that Flower's round timeout (the instructions' TTL on the
SuperLink) really ends a round whose device hangs, and that a run killed mid-way continues from
its checkpoint with ``resume-from``. Kept small (2 SuperNodes, a few rounds): a round costs
~6-12 s here, a launch ~15 s to start.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import psutil
import pytest

from mechanisms import PrivacyLedger
from server.launcher import Federation, launch
from tests.conftest import flower_processes

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
    if missed[0]["round"] == 2:  # thawed in time to answer round 3
        assert summary["history"][3]["replies"] == 2
    # Assert: reported spend is what each ledger holds (a release charged while frozen and
    # refused as late is in the next report, which carries the ledger's total).
    for name in ("client-0", "client-1"):
        ledger = PrivacyLedger(tmp_path / "run" / "ledgers" / f"{name}.json", delta=1e-5)
        if per_client[name]["last_round"] == 3:
            assert per_client[name]["spend"] == pytest.approx(ledger.spent().d_privacy)
    assert flower_processes() == []


@pytest.mark.timeout(300)
def test_a_run_whose_superlink_is_killed_resumes_from_its_checkpoint(
    tmp_path: Path, no_leftover_processes: None
) -> None:
    # Prepare: 3 rounds planned; the SuperLink and everything under it (the ServerApp) is
    # SIGKILLed as soon as round 1 is recorded, with round 2 possibly in flight.
    out = tmp_path / "run"
    run_config = {"num-rounds": 3, "clients-per-round": 2, "patience": 0, "seed": 5}
    killed: list[str] = []

    def kill_superlink(line: str, fed: Federation) -> None:
        if "[gpfl] round 1/3" in line and not killed:
            signal_tree(fed.procs.procs["superlink"].pid, signal.SIGKILL)
            fed.procs.stop("superlink")  # reaps what was killed
            # `flwr run --stream` keeps trying to reach the SuperLink for a while: end it (by
            # PID; the launcher reaps it) so that the launch returns at once.
            fed.procs.procs["flwr-run"].terminate()
            killed.append(line)

    first = launch(supernodes=2, out_dir=out, echo=lambda _: None, timeout=200,
                   run_config=run_config, on_line=kill_superlink)
    assert killed and first.summary["status"] == "running"
    assert first.summary["last_round"] == 1

    # Execute: a new federation (new SuperNodes, new node ids, the same devices' ledgers)
    # continues the run directory.
    second = launch(supernodes=2, out_dir=out, echo=lambda _: None, timeout=200,
                    run_config={**run_config, "resume-from": str(out)})

    # Assert: rounds 2 and 3 ran once each, after the one of the checkpoint.
    summary = second.summary
    assert summary["status"] == "complete"
    assert [e["round"] for e in summary["history"]] == [0, 1, 2, 3]
    assert [r["after_round"] for r in summary["resumed"]] == [1]
    assert summary["rounds_completed"] == 3
    # Assert: no release is forgotten or charged twice: each device took part in the 3 rounds,
    # its ledger holds those releases (plus one if it released in round 2 before the kill), and
    # what the summary reports is what the ledger holds.
    for name, client in summary["privacy"]["per_client"].items():
        ledger = PrivacyLedger(out / "ledgers" / f"{name}.json", delta=1e-5).spent()
        assert client["participations"] == 3 and len(client["node_ids"]) == 2
        assert ledger.releases in (3, 4)
        assert client["spend"] == pytest.approx(ledger.d_privacy)
        assert ledger.d_privacy == pytest.approx(ledger.releases * N_OVER_NU)
    assert flower_processes() == []
