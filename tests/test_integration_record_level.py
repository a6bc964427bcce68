"""Record-level privacy (mechanism dpsgd, OSO-DPSGD) over real Flower processes.

A SuperLink and 4 SuperNodes (``gpfl supernode``), each with its own CSV of the tabular task and
a policy that allows ``dpsgd`` (devices 0-1 under add/remove, 2-3 under replace-one). One run of
2 rounds, k = 2: each device chooses its hypothesis by a charged report-noisy-min, trains with
OSO-DPSGD and releases. Its ledger must hold the composed record-level ε of exactly those
releases, each under the device's relation, and the run's summary C and the step over rounds.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from experiments.tabular_seeds import RUN, device_nodes, write_files
from mechanisms import PrivacyLedger, RecordLevelEvent
from mechanisms.record_accounting import record_epsilon
from server.launcher import Federation, project_root, stream_lines
from tests.conftest import close_federation, descendants

pytestmark = pytest.mark.integration

NAMES = tuple(f"client-{i}" for i in range(4))
RELATIONS = ("add-remove", "add-remove", "replace-one", "replace-one")
RECORD_RUN: dict[str, Any] = {
    **RUN, "mechanism": "dpsgd", "num-rounds": 2, "record-clipping": "oso",
    "record-steps": 20, "record-sampling-rate": 0.1, "batch-size": 20, "learning-rate": 0.5,
    "record-noise-multiplier": 1.5, "record-clip-rate": 0.05, "record-lr-rate": 0.05,
}


@pytest.fixture(scope="module")
def federation(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Federation]:
    work = tmp_path_factory.mktemp("record-fed")
    files = write_files(work / "data", 0)
    before = descendants()
    fed = Federation(workdir=work)
    try:
        fed.start_superlink()
        for i, own in device_nodes(files, 0).items():
            fed.start_supernode(i, {"partition-id": i, "num-partitions": 4,
                                    "ledger-dir": str(work / "ledgers"), **own,
                                    "mechanisms": "dpsgd", "neighbouring": RELATIONS[i],
                                    "record-noise-multiplier": 1.0,
                                    "cap-record-epsilon": 50.0})
        yield fed
    finally:
        close_federation(fed, before)


def test_oso_record_level_run_charges_the_composed_epsilon(federation: Federation) -> None:
    fed = federation
    out = fed.workdir / "record"
    proc = fed.submit(project_root(), {**RECORD_RUN, "seed": 0, "out-dir": str(out)})
    for _ in stream_lines(proc, fed.logs / "record.log", timeout=300):
        pass
    fed.procs.procs.pop("flwr-run", None)
    if proc.stdout is not None:
        proc.stdout.close()
    summary = json.loads((out / "summary.json").read_text())

    assert summary["status"] == "complete"
    assert all(e["replies"] == 4 for e in summary["history"][1:])
    for i, name in enumerate(NAMES):
        ledger = PrivacyLedger(fed.workdir / "ledgers" / f"{name}.json", delta=1e-5)
        events = [e.event for e in ledger.entries()]
        expected = RecordLevelEvent(0.1, 1.5, 20, RELATIONS[i], 1.5)
        assert events == [expected, expected]
        spend = ledger.spent()
        assert spend.record_epsilon == pytest.approx(record_epsilon(events, 1e-5), rel=1e-12)
        assert spend.record_epsilon > 0 and spend.epsilon == 0 and spend.d_privacy == 0
        record = summary["privacy"]["per_client"][name]
        assert record["spend"] == pytest.approx(spend.record_epsilon)
        schedule = record["record_schedule"]
        assert [row[0] for row in schedule] == [1, 2]
        assert all(row[1] > 0 and row[2] > 0 for row in schedule)
        print(name, RELATIONS[i], f"record ε = {spend.record_epsilon:.3f}",
              "C, step by round:", schedule)
    # replace-one doubles the sensitivity: the same releases cost more.
    per = {n: summary["privacy"]["per_client"][n]["spend"] for n in NAMES}
    assert per["client-2"] > per["client-0"]
