"""Real Flower processes on localhost: a SuperLink and SuperNodes talking gRPC.

These tests run `deploy.launcher.launch` — the code behind `gpfl launch` — and check
the results, the privacy accounting and that nothing is left running.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from deploy.launcher import Federation, launch
from mechanisms import PrivacyLedger
from tests.conftest import flower_processes

pytestmark = pytest.mark.integration

N_OVER_NU = 2 / 5  # cost of one release: n/ν with n = 2, ν = 5


@pytest.mark.timeout(900)
def test_private_clustered_federation_of_real_processes(
    tmp_path: Path, no_leftover_processes: None
) -> None:
    # Prepare: 8 SuperNodes = 8 users, the paper's settings otherwise (k = 2, ν = 5,
    # s = 0.1, B = 10) with 3 local epochs; every user trains every round. With 8 users
    # and ν = 5, reaching the optima takes far more rounds than a real-process test can
    # afford: the 0.5-accuracy claim is checked on the Simulation Engine with the paper's
    # 100 users (test_experiments_quick.py, the synthetic ablation). Here: the whole path
    # over gRPC, the accounting, and learning (in a NumPy re-run of this setting over 10
    # seeds the best validation loss after 12 rounds was at most 0.81 × round 0's).
    lines: list[str] = []
    run_config = {
        "num-rounds": 12, "clients-per-round": 8, "local-epochs": 3, "patience": 0,
        "noise-multiplier": 5.0, "num-hypotheses": 2, "seed": 7,
    }

    # Execute
    result = launch(supernodes=8, run_config=run_config, out_dir=tmp_path / "run",
                    echo=lines.append, timeout=800)

    # Assert: a line per round, a summary and a figure
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary == result.summary
    assert summary["rounds_completed"] == 12
    assert sum("[gpfl] round" in line for line in lines) == 13  # rounds 0..12
    assert result.figure is not None and result.figure.exists()
    # Assert: all replies were clustered and the model learnt.
    last = summary["history"][-1]
    assert sum(last["cluster_sizes"]) == last["replies"] == 8
    assert summary["best_val_loss"] < 0.9 * summary["history"][0]["val_loss"]
    assert np.asarray(summary["hypotheses"]).shape == (2, 2)
    # Assert: every client's reported spend is participations × n/ν, and its ledger agrees.
    per_client = summary["privacy"]["per_client"]
    assert len(per_client) == 8
    for name, client in per_client.items():
        assert client["participations"] == 12
        assert client["spend"] == pytest.approx(client["participations"] * N_OVER_NU)
        ledger = PrivacyLedger(tmp_path / "run" / "ledgers" / f"{name}.json", delta=1e-5)
        assert ledger.spent().d_privacy == pytest.approx(client["spend"])
    assert summary["privacy"]["max"] == pytest.approx(12 * N_OVER_NU)
    # Assert: nothing of the federation is left (the fixture checks every descendant too).
    assert flower_processes() == []


@pytest.mark.timeout(600)
def test_capped_supernode_declines_and_a_restart_keeps_its_spend(
    tmp_path: Path, no_leftover_processes: None
) -> None:
    # Prepare: 3 SuperNodes, all asked every round; SuperNode 0 may spend 0.8 = two
    # releases (rounds 1 and 2), so it declines round 3. Once round 3 is over it is killed
    # (with everything it started) and restarted with the same node config: a new process,
    # a new Flower node id, the same ledger. (All three asked, not a sample of them: with a
    # sample a seed cannot fix, since node ids are drawn at start, client 0 could go unasked
    # until its restart and never report its name.)
    restarted: list[int] = []

    def kill_and_restart(line: str, fed: Federation) -> None:
        if "[gpfl] round 3/" in line and not restarted:
            fed.restart_supernode(0)
            restarted.append(3)

    # Execute
    result = launch(
        supernodes=3, out_dir=tmp_path / "run", echo=lambda _: None, timeout=500,
        run_config={"num-rounds": 8, "clients-per-round": 3, "patience": 0, "seed": 1},
        node_configs={0: {"cap-d-privacy": 0.8}}, on_line=kill_and_restart,
    )

    # Assert: the run finished all its rounds with the other clients going on.
    summary = result.summary
    assert restarted == [3]
    assert summary["history"][-1]["round"] == 8
    clients = summary["privacy"]["per_client"]
    capped = clients["client-0"]
    # Client 0 released in rounds 1 and 2, declined round 3, and never spent past its cap,
    # across the restart: its new node id, asked once it registered (within the five rounds
    # left, ~2 s each: 5 of 5 runs here, 2 with both cores busy), declined from the same
    # ledger.
    ledger = PrivacyLedger(tmp_path / "run" / "ledgers" / "client-0.json", delta=1e-5).spent()
    assert ledger.d_privacy <= 0.8 + 1e-9
    assert ledger.releases == capped["participations"] == 2
    assert capped["declines"] >= 1
    assert capped["spend"] == pytest.approx(ledger.d_privacy)
    # The uncapped clients took part whenever sampled; declines are not failures.
    assert all(c["declines"] == 0 for n, c in clients.items() if n != "client-0")
    assert sum(e["failures"] for e in summary["history"]) == 0 or restarted
    # Every decline the server counted is in the ledger. The ledger may hold one more: the
    # round-3 line is printed when round 3 ends, so round 4's message can reach the old
    # process, which records its decline and is killed before the reply leaves.
    assert sum(e["declined"] for e in summary["history"]) == capped["declines"]
    assert capped["declines"] <= ledger.declines <= capped["declines"] + 1


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("kwargs", "message"), [
    ({"run_config": {"noise-multiplier": -1.0}},
     r"noise-multiplier must be a number > 0 and <= 1e\+06 in the run config, "
     r"got noise-multiplier=-1\.0"),
    ({"node_configs": {1: {"device": "tpu"}}}, r"node config of SuperNode 1.*device.*tpu"),
    ({"run_config": {"no-such-key": 1}}, r"no-such-key"),
    ({"run_config": {"task": "no-such-task"}},
     r"task='no-such-task' is not installed here: no package registers it"),
])
def test_a_bad_setting_fails_the_launch_before_any_process_starts(
    tmp_path: Path, no_leftover_processes: None, kwargs: dict[str, Any], message: str
) -> None:
    from deploy.launcher import LaunchError

    with pytest.raises(LaunchError, match=message):
        launch(supernodes=2, out_dir=tmp_path / "run", echo=lambda _: None, timeout=120,
               **kwargs)
    # Nothing was started: no process, no log, nothing written into the run directory.
    assert list((tmp_path / "run").iterdir()) == []
    assert flower_processes() == []
