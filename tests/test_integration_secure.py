"""Secure clusters over real Flower processes: SecAgg+ between 6 SuperNodes, one killed mid-way.

``gpfl launch`` with ``aggregation-privacy = "secure-clusters"``: the ServerApp runs Flower's
``SecAggPlusWorkflow`` each round and every device its ``secaggplus_mod`` (through gpfl's cohort
rules). What only real processes show: that the ServerApp's received messages hold masked
integer vectors and no plain model (checked on every reply by ``server.secure_round``'s grid
wrapper, written to ``secure_rounds.jsonl``), that the hypotheses reach the synthetic task's
optima from the sums alone, that a device killed during a round leaves that round and the
next ones to SecAgg+'s threshold, and that every device's ledger holds both guarantees.

The local floor is weak on purpose (ε = 500 over 20 rounds, a device policy that allows it):
6 devices cannot learn under a strong local guarantee in 20 rounds, and the test is about the
protocol; docs/RESULTS.md measures the privacy-utility trade-off.
"""

from __future__ import annotations

import json
import re
import signal
import threading
import time
from pathlib import Path

import pytest

from deploy.launcher import Federation, launch
from mechanisms import PrivacyLedger
from mechanisms.events import DistributedGaussianEvent
from tests.conftest import flower_processes
from tests.test_integration_faults import signal_tree

pytestmark = pytest.mark.integration

ROUNDS = 20
MIN_COHORT = 4


@pytest.mark.timeout(420)
def test_secure_clusters_learn_from_sums_alone_and_survive_a_killed_device(
    tmp_path: Path, no_leftover_processes: None
) -> None:
    # Prepare: 6 SuperNodes, all sampled every round, SecAgg+ threshold 4. Once round 2 is
    # recorded, a watcher reads SuperNode 5's log and SIGKILLs its whole process tree the moment
    # its client has charged and trained in round 3: inside SecAgg+'s collect stage, after it
    # shared its keys (its masks must then be removed from the others' shares) and about when it
    # masks and sends its vector (if that went out, its own mask is rebuilt from the others').
    killed: list[int] = []
    trained = re.compile(r"gpfl device: run \S+ round 3 federation \S+: client-5 served")
    log = tmp_path / "run" / "logs" / "supernode-5.log"

    def kill_when_trained(fed: Federation) -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if log.is_file() and trained.search(log.read_text(errors="replace")):
                killed.extend(signal_tree(fed.procs.procs["supernode-5"].pid, signal.SIGKILL))
                return
            time.sleep(0.01)

    def watch(line: str, fed: Federation) -> None:
        if "secure round 2:" in line and not watchers:
            watchers.append(threading.Thread(target=kill_when_trained, args=(fed,), daemon=True))
            watchers[0].start()

    watchers: list[threading.Thread] = []

    # Execute
    result = launch(
        supernodes=6, out_dir=tmp_path / "run", echo=lambda _: None, timeout=360,
        run_config={"aggregation-privacy": "secure-clusters", "mechanism": "gaussian",
                     "num-rounds": ROUNDS, "epsilon": 500.0, "seed": 1, "local-epochs": 5,
                     "patience": 0, "server-update": "plateau", "min-cohort": MIN_COHORT,
                     "round-timeout": 10.0},
        policy={"epsilon": 1000.0, "cap-epsilon": 10_000.0},
        on_line=watch,
    )
    for watcher in watchers:
        watcher.join(timeout=5)

    # Assert: the run did all its rounds, each one changed the hypotheses (none was lost to the
    # kill), and the killed device stopped taking part.
    summary = result.summary
    assert killed and result.finished and summary["status"] == "complete", summary["status"]
    assert summary["last_round"] == ROUNDS
    rounds = summary["history"][1:]
    assert [r["kept"] for r in rounds] == [None] * ROUNDS
    assert all(r["replies"] == 6 for r in rounds[:2])
    # Round 3, the one it died in, was recovered by SecAgg+ with 5 shares or with its own.
    assert rounds[2]["replies"] in (5, 6)
    assert all(MIN_COHORT <= r["replies"] <= 5 for r in rounds[3:]), [r["replies"] for r in rounds]
    dead = summary["privacy"]["per_client"]["client-5"]
    assert dead["last_round"] in (2, 3) and dead["participations"] in (2, 3)
    # Assert: every reply the ServerApp received held no arrays, and each share in a sum came
    # as an integer masked vector (one per device in the round's sum).
    checks = [json.loads(line) for line in
              (tmp_path / "run" / "secure_rounds.jsonl").read_text().splitlines()]
    assert [c["round"] for c in checks] == list(range(1, ROUNDS + 1))
    assert all(c["plain_replies"] == 0 for c in checks)
    assert [c["masked_vectors"] for c in checks] == [r["replies"] for r in rounds]
    assert all(c["bytes_received_per_device"] > 0 for c in checks)
    # Assert: the hypotheses reached both optima of the synthetic task (start: about 7 away).
    assert max(summary["optima_distances"]) < 1.0, summary["optima_distances"]
    # Assert: each ledger holds both guarantees: the local floor it charged (RDP ε) and the
    # central ε of the sums, smaller, for a cohort of 4.
    for i in range(6):
        ledger = PrivacyLedger(tmp_path / "run" / "ledgers" / f"client-{i}.json", delta=1e-5)
        events = [entry.event for entry in ledger.entries()]
        assert events and all(isinstance(e, DistributedGaussianEvent) and e.cohort == MIN_COHORT
                              for e in events)
        spend = ledger.spent()
        assert 0 < spend.central_epsilon < spend.epsilon
    assert flower_processes() == []
