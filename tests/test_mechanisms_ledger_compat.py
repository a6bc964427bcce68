"""Ledger files written by earlier code still load, report the same spend and are continued."""

from __future__ import annotations

import json
from pathlib import Path

from client.ledger_view import format_ledger
from mechanisms import (
    GaussianReleaseEvent,
    MetricPrivacyEvent,
    NeighbourhoodEvent,
    NonPrivateEvent,
    PrivacyLedger,
    SignReleaseEvent,
    Spend,
)
from mechanisms.calibration import composed_gaussian_epsilon_pld
from tests.test_ledger import (
    DELTA,
    lock_of,
    metric,
    path,
)

__all__ = ["path"]  # the fixture, shared with tests/test_ledger.py


# -- ledgers written by earlier code ----------------------------------------------------------


def test_a_version_1_file_without_generation_and_an_empty_lock_file_is_read(
    path: Path,
) -> None:
    # Prepare: what the previous version left: no "generation", an empty lock file.
    path.parent.mkdir(parents=True)
    events = [{"time": "t", "round": i, "event": {"kind": "metric", "layers": [[0.5, 1.0]]}}
              for i in range(3)]
    path.write_text(json.dumps({"format": "gpfl-privacy-ledger", "version": 1, "delta": DELTA,
                                "declines": 2, "events": events}))
    lock_of(path).touch()

    # Execute
    ledger = PrivacyLedger(path, delta=DELTA)
    spend = ledger.charge(metric(0.5), cap=None)

    # Assert: its generation was 3 + 2; the write makes it 6, in the file and the lock.
    assert (spend.releases, spend.declines, spend.d_privacy) == (4, 2, 2.0)
    assert json.loads(path.read_text())["generation"] == 6
    assert lock_of(path).read_text().endswith("00000000000000000006\n")


# Written by the code before the ledger was split into accountant, store and façade
# (commit 6c44fc6): PrivacyLedger(path, delta=1e-5), then charge(Neighbourhood((7850,), 5),
# cap=2000, round=1), charge(Metric(((0.1, 2), (0.3, 0.5))), round=2), a decline,
# charge(Gaussian(3.25), cap=10, round=3), charge(Sign(3.25), cap=10, round=4),
# charge(Gaussian(8), cap=10), charge(Neighbourhood((784, 10), 4), round=6),
# charge(NonPrivate(), round=7), a decline. Byte for byte as it was written.
LEDGER_BEFORE_THE_SPLIT = """{
 "format": "gpfl-privacy-ledger",
 "version": 1,
 "generation": 9,
 "delta": 1e-05,
 "declines": 2,
 "events": [
  {
   "time": "2026-11-23T18:24:09+00:00",
   "round": 1,
   "event": {
    "kind": "neighbourhood",
    "dimensions": [
     7850
    ],
    "noise_multiplier": 5.0
   }
  },
  {
   "time": "2026-11-23T18:24:09+00:00",
   "round": 2,
   "event": {
    "kind": "metric",
    "layers": [
     [
      0.1,
      2.0
     ],
     [
      0.3,
      0.5
     ]
    ]
   }
  },
  {
   "time": "2026-11-23T18:24:09+00:00",
   "round": 3,
   "event": {
    "kind": "gaussian",
    "noise_multiplier": 3.25
   }
  },
  {
   "time": "2026-11-23T18:24:13+00:00",
   "round": 4,
   "event": {
    "kind": "sign",
    "noise_multiplier": 3.25
   }
  },
  {
   "time": "2026-11-23T18:24:13+00:00",
   "round": null,
   "event": {
    "kind": "gaussian",
    "noise_multiplier": 8.0
   }
  },
  {
   "time": "2026-11-23T18:24:13+00:00",
   "round": 6,
   "event": {
    "kind": "neighbourhood",
    "dimensions": [
     784,
     10
    ],
    "noise_multiplier": 4.0
   }
  },
  {
   "time": "2026-11-23T18:24:13+00:00",
   "round": 7,
   "event": {
    "kind": "none"
   }
  }
 ]
}
"""
LOCK_BEFORE_THE_SPLIT = b"gpfl-privacy-ledger generation 00000000000000000009\n"
# What `gpfl ledger` prints for it (without the first line naming the path): the table that
# code printed, with the relation column added since (its entries name none: each reads as its
# kind's relation) and, after the totals, a line per relation.
TABLE_BEFORE_THE_SPLIT = [
    '#  time (UTC)                 round  kind           relation        parameters     d-cost',
    '1  2026-11-23T18:24:09+00:00  1      neighbourhood  device-replace  n=7850, ν=5    1570',
    '2  2026-11-23T18:24:09+00:00  2      metric         device-replace  2 layers       0.35',
    '3  2026-11-23T18:24:09+00:00  3      gaussian       device-replace  z=3.25         -',
    '4  2026-11-23T18:24:13+00:00  4      sign           device-replace  z=3.25         -',
    '5  2026-11-23T18:24:13+00:00  -      gaussian       device-replace  z=8            -',
    '6  2026-11-23T18:24:13+00:00  6      neighbourhood  device-replace  2 layers, ν=4  198.5',
    '7  2026-11-23T18:24:13+00:00  7      none           none            no noise       -',
    '',
    'releases: 7   declines: 2',
    'd-privacy (Σ ε·r): 1768.85',
    'Gaussian/sign: ε = 1.78427 at δ = 1e-05 (charged: the smaller of RDP ε = 1.9404 and '
    'PLD ε = 1.78427)',
    'releases without noise (no guarantee): 1',
    "relation device-replace (6 of the releases): device level: the device's whole local data "
    "set replaced by any other (d-privacy: at the distance between the two data sets' models)",
    'relation none (1 of the releases): no guarantee: released without noise',
]


def test_a_ledger_written_before_the_split_loads_with_the_same_spend(path: Path) -> None:
    # Prepare
    path.parent.mkdir(parents=True)
    path.write_text(LEDGER_BEFORE_THE_SPLIT)
    lock_of(path).write_bytes(LOCK_BEFORE_THE_SPLIT)

    # Execute
    ledger = PrivacyLedger(path, delta=DELTA)
    spend = ledger.spent()

    # Assert: the figures that code reported, to the bit (its ε was RDP's; the charge is now
    # the smaller PLD one, dp-accounting's, from the same entries); the entries as charged,
    # each under its kind's relation.
    pld = composed_gaussian_epsilon_pld({3.25: 2, 8.0: 1}, DELTA)
    assert pld < 1.9404043377646252
    assert spend == Spend(d_privacy=1768.85, epsilon=pld, delta=1e-05,
                          releases=7, declines=2, epsilon_rdp=1.9404043377646252,
                          epsilon_pld=pld)
    assert [e.round for e in ledger.entries()] == [1, 2, 3, 4, None, 6, 7]
    assert [e.event for e in ledger.entries()] == [
        NeighbourhoodEvent((7850,), 5.0), MetricPrivacyEvent(((0.1, 2.0), (0.3, 0.5))),
        GaussianReleaseEvent(3.25), SignReleaseEvent(3.25), GaussianReleaseEvent(8.0),
        NeighbourhoodEvent((784, 10), 4.0), NonPrivateEvent(),
    ]
    assert [e.event.relation for e in ledger.entries()] == ["device-replace"] * 6 + ["none"]
    assert format_ledger(path).splitlines()[1:] == TABLE_BEFORE_THE_SPLIT


def test_a_ledger_written_before_the_split_is_continued_in_the_same_format(
    path: Path,
) -> None:
    # Prepare
    path.parent.mkdir(parents=True)
    path.write_text(LEDGER_BEFORE_THE_SPLIT)
    lock_of(path).write_bytes(LOCK_BEFORE_THE_SPLIT)

    # Execute
    PrivacyLedger(path, delta=DELTA).record_decline()

    # Assert: the same document but for the two counters a decline moves and the relation each
    # event now names (written last in it, as that code's writer would have indented it).
    document = json.loads(LEDGER_BEFORE_THE_SPLIT)
    assert json.dumps(document, indent=1) + "\n" == LEDGER_BEFORE_THE_SPLIT
    document["generation"], document["declines"] = 10, 3
    for item in document["events"]:
        item["event"]["relation"] = "none" if item["event"]["kind"] == "none" else "device-replace"
    assert path.read_text() == json.dumps(document, indent=1) + "\n"
    assert PrivacyLedger(path, delta=DELTA).spent().epsilon_rdp == 1.9404043377646252
    assert lock_of(path).read_bytes() == LOCK_BEFORE_THE_SPLIT.replace(b"09\n", b"10\n")
