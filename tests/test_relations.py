"""Every guarantee names its neighbouring relation: events, ledger, `gpfl ledger`, replies, summary.

Device-level releases (Laplace, Gaussian, sign) are under ``device-replace`` (the device's whole
local data set replaced by any other), record-level ones under the device's ``add-remove`` or
``replace-one``, a release without noise under ``none``; an entry written before device-level
events named their relation reads as its kind's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from client.ledger_view import format_ledger
from deploy.rundir import ledger_report
from mechanisms import (
    GaussianReleaseEvent,
    MetricPrivacyEvent,
    NeighbourhoodEvent,
    NonPrivateEvent,
    PrivacyLedger,
    RecordLevelEvent,
    SignReleaseEvent,
)
from mechanisms.events import RELATIONS, PrivacyEvent, event_from_dict
from server.results import privacy_report
from strategies.replies import ReplyMetrics, parse_metrics
from tests import test_client, test_client_record_level

DELTA = 1e-5


@pytest.mark.parametrize(("event", "relation"), [
    (MetricPrivacyEvent(((0.5, 2.0),)), "device-replace"),
    (NeighbourhoodEvent((7850,), 5.0), "device-replace"),
    (GaussianReleaseEvent(3.0), "device-replace"),
    (SignReleaseEvent(3.0), "device-replace"),
    (NonPrivateEvent(), "none"),
    (RecordLevelEvent(0.1, 2.0, 10, "add-remove"), "add-remove"),
    (RecordLevelEvent(0.1, 2.0, 10, "replace-one"), "replace-one"),
])
def test_every_event_names_its_relation_and_keeps_it_in_its_json_form(
    event: PrivacyEvent, relation: str,
) -> None:
    d = event.to_dict()

    assert event.relation == relation and relation in RELATIONS
    assert d["relation"] == relation
    assert event_from_dict(d) == event and event_from_dict(d).relation == relation


@pytest.mark.parametrize(("d", "relation"), [
    ({"kind": "metric", "layers": [[0.5, 2.0]]}, "device-replace"),
    ({"kind": "neighbourhood", "dimensions": [4], "noise_multiplier": 2.0}, "device-replace"),
    ({"kind": "gaussian", "noise_multiplier": 2.0}, "device-replace"),
    ({"kind": "sign", "noise_multiplier": 2.0}, "device-replace"),
    ({"kind": "none"}, "none"),
])
def test_an_entry_written_without_a_relation_reads_as_its_kinds(
    d: dict[str, Any], relation: str,
) -> None:
    assert event_from_dict(d).relation == relation
    assert event_from_dict(d) == event_from_dict({**d, "relation": relation})


@pytest.mark.parametrize("d", [
    {"kind": "gaussian", "noise_multiplier": 2.0, "relation": "add-remove"},
    {"kind": "metric", "layers": [[0.5, 2.0]], "relation": "none"},
    {"kind": "none", "relation": "device-replace"},
    {"kind": "sign", "noise_multiplier": 2.0, "relation": 1},
    {"kind": "dpsgd", "sampling_rate": 0.1, "noise_multiplier": 2.0, "steps": 3,
     "relation": "device-replace", "selection_noise_multiplier": 0.0},
    {"kind": "dpsgd", "sampling_rate": 0.1, "noise_multiplier": 2.0, "steps": 3,
     "selection_noise_multiplier": 0.0},
])
def test_an_entry_under_another_relation_is_refused(d: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="relation"):
        event_from_dict(d)


def test_gpfl_ledger_prints_each_releases_relation_and_what_it_protects(tmp_path: Path) -> None:
    # Prepare
    path = tmp_path / "ledgers" / "client-0.json"
    ledger = PrivacyLedger(path, delta=DELTA)
    ledger.charge(GaussianReleaseEvent(8.0), cap=None, round=1)
    ledger.charge(RecordLevelEvent(0.1, 2.0, 10, "add-remove"), cap=None, round=2)
    ledger.charge(RecordLevelEvent(0.1, 2.0, 10, "add-remove"), cap=None, round=3)

    # Execute
    lines = format_ledger(path).splitlines()

    # Assert: a relation column, then a line per relation saying what it protects.
    assert lines[1].split()[5] == "relation"
    assert [line.split()[4] for line in lines[2:5]] == ["device-replace", "add-remove",
                                                        "add-remove"]
    assert lines[-2:] == [
        "relation device-replace (1 of the releases): device level: the device's whole local "
        "data set replaced by any other (d-privacy: at the distance between the two data sets' "
        "models)",
        "relation add-remove (2 of the releases): record level: one record of the device added "
        "or removed"]


def test_each_release_reply_names_its_relation(tmp_path: Path) -> None:
    # Execute: a device-level (Laplace) release, a record-level one under the device's
    # default relation and one under add-remove.
    _, _, laplace = test_client.fit(test_client.make_client(tmp_path / "a"))
    _, _, default = test_client_record_level.make_client(tmp_path / "b").fit(
        test_client_record_level.hypotheses(1), {"num-hypotheses": 1, "server-round": 1})
    _, _, chosen = test_client_record_level.make_client(
        tmp_path / "c", node={"neighbouring": "add-remove"}).fit(
        test_client_record_level.hypotheses(1), {"num-hypotheses": 1, "server-round": 1})

    # Assert
    assert (laplace["declined"], default["declined"], chosen["declined"]) == (0, 0, 0)
    assert laplace["relation"] == "device-replace"
    assert default["relation"] == "replace-one" and chosen["relation"] == "add-remove"


def test_the_server_keeps_a_known_relation_and_refuses_another() -> None:
    good = {"client-name": "client-3", "releases": 1}

    parsed = parse_metrics({**good, "relation": "add-remove"}, need_sigma=False)
    refused = parse_metrics({**good, "relation": "all of it"}, need_sigma=False)

    assert isinstance(parsed, ReplyMetrics) and parsed.values["relation"] == "add-remove"
    assert isinstance(refused, str) and refused.startswith("metric 'relation' must be one of")


class Record:
    def __init__(self, metrics: dict[str, Any]) -> None:
        self.participations = 1
        self.metrics = metrics


def test_the_summary_names_the_relation_of_each_devices_spend(tmp_path: Path) -> None:
    # Prepare: two devices' replies, and their ledgers on disk.
    clients = {"1": Record({"client-name": "client-0", "spend-record-epsilon": 1.5,
                            "relation": "add-remove"}),
               "2": Record({"client-name": "client-1", "spend-record-epsilon": 2.5,
                            "relation": "replace-one"})}
    for name, relation in (("client-0", "add-remove"), ("client-1", "replace-one")):
        ledger = PrivacyLedger(tmp_path / f"{name}.json", delta=DELTA)
        ledger.charge(RecordLevelEvent(0.1, 2.0, 10, relation), cap=None, round=1)
        ledger.charge(GaussianReleaseEvent(8.0), cap=None, round=2)  # another family
    gaussian = PrivacyLedger(tmp_path / "other.json", delta=DELTA)
    gaussian.charge(GaussianReleaseEvent(8.0), cap=None, round=1)

    # Execute
    report = privacy_report("dpsgd", clients)
    read = ledger_report(sorted(tmp_path.glob("client-*.json")), "dpsgd")
    device_level = ledger_report([tmp_path / "other.json"], "gaussian")

    # Assert: each spend with the relation of the releases it composes.
    assert {n: c["relation"] for n, c in report["per_client"].items()} == {
        "client-0": "add-remove", "client-1": "replace-one"}
    assert read is not None and device_level is not None
    assert {n: c["relation"] for n, c in read["per_client"].items()} == {
        "client-0": "add-remove", "client-1": "replace-one"}
    assert device_level["per_client"]["other"]["relation"] == "device-replace"
    assert np.isclose(device_level["per_client"]["other"]["spend"],
                      PrivacyLedger(tmp_path / "other.json", delta=DELTA).spent().epsilon)
