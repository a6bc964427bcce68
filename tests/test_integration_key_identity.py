"""Over real Flower processes with SuperNode authentication: a device is its key.

One federation (``gpfl launch --auth``: TLS, a registered key per SuperNode, ``node-identity =
"key"``), 3 SuperNodes. It checks the launch itself too: every connection encrypted, every
SuperNode authenticated with a key the launcher made and registered. Once round 1 is recorded,
SuperNode 1 crashes (its process tree killed) and is started again at once with the same key,
while its dead registration is still online; at the same moment a fourth SuperNode, with a key
of its own (registered too), announces SuperNode 1's name. The restarted device comes back under
its key's node id and its replies count; the fourth is never asked to train, so it charges
nothing.

Kept small: a device that missed three rounds rests seven (strategies.sampling), so it is
asked again from round 16 on. The dead registration stays online for the SuperLink's heartbeat
window (up to 60 s), and a round without a miss takes about a second, so the run's length is its
misses: the round timeout is 25 s, so that rounds 2, 4 and 8, asked of the dead registration,
outlast that window (with 15 s the run could end before the restarted device was let back in).
The restarted SuperNode is let in only on its first attempt after the window, each attempt a
SuperNode start plus the runner's pause, so under load it can come back after round 16 began:
the rounds after 16, about a second each, leave it that margin (with 18 rounds it once came
back after the last round it could have been asked in).
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from deploy.certs import make_supernode_keys
from deploy.launcher import Federation, launch
from mechanisms import PrivacyLedger
from tests.conftest import flower_processes
from tests.test_integration_faults import signal_tree

pytestmark = pytest.mark.integration

ROUNDS = 30


# launch() leaves its Popen objects unreaped in Python's eyes (ProcessSet reaps them through
# psutil): their ResourceWarnings are collected here, inside the test.
@pytest.mark.filterwarnings("ignore::ResourceWarning",
                            "ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.timeout(560)
def test_a_restarted_authenticated_device_counts_under_its_key_and_an_impostor_is_not_asked(
    tmp_path: Path, no_leftover_processes: None
) -> None:
    # Prepare: the crash-and-restart of SuperNode 1 and the impostor, both once round 1 is in.
    impostor_key = make_supernode_keys(tmp_path / "impostor-key", 1)[0]
    impostor_ledgers = tmp_path / "impostor-ledgers"
    out = tmp_path / "run"
    events: list[str] = []

    def chaos(line: str, fed: Federation) -> None:
        if f"[gpfl] round 1/{ROUNDS}" in line and not events:
            signal_tree(fed.procs.procs["supernode-1"].pid, signal.SIGKILL)
            fed.restart_supernode(1)  # same node config, same key
            fed.register_supernode(impostor_key.public_key)
            fed.start_supernode(3, {**fed.node_configs[1], "ledger-dir": str(impostor_ledgers)},
                                ["--auth-supernode-private-key", str(impostor_key.private_key)])
            events.append("restarted")

    # Execute
    result = launch(
        supernodes=3, auth=True, out_dir=out, echo=lambda _: None, timeout=500,
        run_config={"num-rounds": ROUNDS, "clients-per-round": 3, "min-replies": 2,
                    "patience": 0, "seed": 9, "round-timeout": 25.0},
        on_line=chaos,
    )

    # Assert: `gpfl launch --auth` ran encrypted and authenticated, with keys it made.
    logs = out / "logs"
    superlink = (logs / "superlink.log").read_text(errors="replace")
    assert "--insecure" not in superlink and "authentication is disabled" not in superlink
    for i in range(3):
        assert "SuperNode ID" in (logs / f"supernode-{i}.log").read_text(errors="replace")
        assert (out / "certs" / "supernodes" / f"supernode-{i}.key.pub").is_file()
    # Assert: the dead registration was asked and missed at least once (the restart fell
    # within the heartbeat window).
    assert events == ["restarted"]
    assert result.summary["rounds_completed"] == ROUNDS
    history = [entry for entry in result.summary["history"] if entry["round"]]
    missed = [entry["round"] for entry in history if "client-1" in entry["missing"]]
    assert missed
    # Assert: client-1 is one node id (its key's) before and after, and it replied after its
    # misses: the restarted device counted (before: refused at activation, it was gone for
    # good; or, by name, the impostor took its name over).
    client = result.summary["privacy"]["per_client"]["client-1"]
    assert len(client["node_ids"]) == 1, client
    assert client["last_round"] > max(missed) and client["participations"] >= 2, (client, missed)
    # ... because the SuperLink refused the key's activation at first and the runner tried again.
    assert "starting it again" in (out / "logs" / "supernode-1.log").read_text(errors="replace")
    # Assert: no reply was dropped for its name, and the impostor never trained (before: it
    # took the name while the device was down, and the device's own node was superseded).
    assert not [d for e in history for d in e["dropped"] if "client-1" in d[0]]
    impostor_ledger = impostor_ledgers / "client-1.json"
    if impostor_ledger.exists():
        assert PrivacyLedger(impostor_ledger, delta=1e-5).spent().releases == 0
    assert flower_processes() == []
