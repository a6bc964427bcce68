"""Record-level privacy (mechanism dpsgd, OSO-DPSGD) over real Flower processes, as launched.

`launch` (what `gpfl launch` runs): a SuperLink and 4 SuperNodes (``gpfl supernode``), each with
its own CSV of the tabular task and a policy that allows ``dpsgd`` (devices 0-1 under add/remove,
2-3 under replace-one). One run of 2 rounds, k = 2: each device chooses its hypothesis by a
charged report-noisy-min, trains with OSO-DPSGD and releases. Its ledger must hold the composed
record-level ε of exactly those releases, each under the device's relation, and the run's
summary C and the step over rounds, and each device's relation.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from deploy.launcher import launch
from experiments.reproductions.tabular_seeds import RUN, device_nodes, write_files
from mechanisms import PrivacyLedger, RecordLevelEvent
from mechanisms.record_accounting import record_epsilon
from tests.conftest import flower_processes

pytestmark = pytest.mark.integration

NAMES = tuple(f"client-{i}" for i in range(4))
RELATIONS = ("add-remove", "add-remove", "replace-one", "replace-one")
RECORD_RUN: dict[str, Any] = {
    **RUN, "mechanism": "dpsgd", "num-rounds": 2, "record-clipping": "oso",
    "record-steps": 20, "record-sampling-rate": 0.1, "batch-size": 20, "learning-rate": 0.5,
    "record-noise-multiplier": 1.5, "record-clip-rate": 0.05, "record-lr-rate": 0.05,
}
#: Every device's own bounds (the launch policy): dpsgd only, ν at least 1, its record cap.
POLICY: dict[str, Any] = {"mechanisms": "dpsgd", "record-noise-multiplier": 1.0,
                          "cap-record-epsilon": 50.0}


@pytest.mark.timeout(600)
def test_oso_record_level_run_charges_the_composed_epsilon(
    tmp_path: Path, no_leftover_processes: None,
) -> None:
    # Prepare: each device's file, seeded noise (opted in) and relation.
    files = write_files(tmp_path / "data", 0)
    nodes = {i: {**own, "neighbouring": RELATIONS[i]}
             for i, own in device_nodes(files, 0).items()}
    lines: list[str] = []

    # Execute
    result = launch(supernodes=4, run_config={**RECORD_RUN, "seed": 0},
                    out_dir=tmp_path / "run", node_configs=nodes, policy=POLICY,
                    echo=lines.append, timeout=300)

    # Assert: the run did its rounds with every device.
    summary = result.summary
    assert result.finished and summary["status"] == "complete", lines
    assert all(e["replies"] == 4 for e in summary["history"][1:])
    for i, name in enumerate(NAMES):
        # Assert: the ledger holds exactly the charged releases, composed, under the relation.
        ledger = PrivacyLedger(result.out_dir / "ledgers" / f"{name}.json", delta=1e-5)
        events = [e.event for e in ledger.entries()]
        expected = RecordLevelEvent(0.1, 1.5, 20, RELATIONS[i], 1.5)
        assert events == [expected, expected]
        spend = ledger.spent()
        assert spend.record_epsilon == pytest.approx(record_epsilon(events, 1e-5), rel=1e-12)
        assert spend.record_epsilon > 0 and spend.epsilon == 0 and spend.d_privacy == 0
        # Assert: the summary reports that spend, its relation, and C and the step by round.
        record = summary["privacy"]["per_client"][name]
        assert record["spend"] == pytest.approx(spend.record_epsilon)
        assert record["relation"] == RELATIONS[i]
        assert summary["ledgers"]["per_client"][name]["spend"] == spend.record_epsilon
        assert summary["ledgers"]["per_client"][name]["relation"] == RELATIONS[i]
        schedule = record["record_schedule"]
        assert [row[0] for row in schedule] == [1, 2]
        assert all(row[1] > 0 and row[2] > 0 for row in schedule)
        print(name, RELATIONS[i], f"record ε = {spend.record_epsilon:.3f}",
              "C, step by round:", schedule)
    # replace-one doubles the sensitivity: the same releases cost more.
    per = {n: summary["privacy"]["per_client"][n]["spend"] for n in NAMES}
    assert per["client-2"] > per["client-0"]
    assert flower_processes() == []
