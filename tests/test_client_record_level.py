"""The record-level mode (mechanism dpsgd): policy bounds, the charge before data, the ledger."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from client.app import device_task
from client.numpy_client import GpflClient
from client.policy import DevicePolicy
from mechanisms import PrivacyLedger, RecordLevelEvent
from mechanisms.record_accounting import record_epsilon
from settings import federation_defaults
from tasks import Task
from tasks.digits import DigitsTask

RUN: dict[str, Any] = {**federation_defaults(), "task": "digits", "model": "logistic",
                       "mechanism": "dpsgd", "num-rounds": 3, "seed": 3, "batch-size": 8,
                       "record-steps": 5, "record-sampling-rate": 0.1,
                       "record-noise-multiplier": 2.0}


def make_client(tmp_path: Path, built: list[str] | None = None, node: dict[str, Any] | None = None,
                **run: Any) -> GpflClient:
    p = DevicePolicy.load({"partition-id": 0, "num-partitions": 4, "ledger-dir": str(tmp_path),
                           "mechanisms": "dpsgd,gaussian", **(node or {})}, environ={})
    config = {**RUN, **run}

    def build() -> Task:
        if built is not None:
            built.append(config["task"])
        return device_task(config, p)

    return GpflClient(build, config, p)


def hypotheses(k: int) -> list[np.ndarray]:
    task = DigitsTask(model="logistic")
    rng = np.random.default_rng(0)
    return [a for _ in range(k) for a in task.init_parameters(rng)]


def ledger_of(tmp_path: Path) -> PrivacyLedger:
    return PrivacyLedger(tmp_path / "client-0.json", delta=1e-5)


def test_a_record_level_release_is_charged_in_its_own_unit_before_training(
    tmp_path: Path,
) -> None:
    c = make_client(tmp_path)
    released, _, metrics = c.fit(hypotheses(1), {"num-hypotheses": 1, "server-round": 1})
    assert metrics["declined"] == 0 and len(released) == 2
    entries = ledger_of(tmp_path).entries()
    assert len(entries) == 1
    event = entries[0].event
    assert event == RecordLevelEvent(0.1, 2.0, 5, "replace-one", 0.0)
    assert event.relation == "replace-one"
    expected = record_epsilon([event], 1e-5)
    assert metrics["spend-record-epsilon"] == pytest.approx(expected)
    assert metrics["spend-epsilon"] == 0.0 and metrics["spend-d"] == 0.0
    assert metrics["record-clip-final"] > 0 and metrics["record-lr-final"] > 0
    # replace-one (the device default): the charged sensitivity of a clipped sum is 2C.
    assert metrics["record-sensitivity"] == 2.0 * RUN["record-clip"]


def test_the_device_least_noise_multiplier_and_relation_bound_the_request(
    tmp_path: Path,
) -> None:
    node = {"record-noise-multiplier": 3.0, "neighbouring": "add-remove"}
    c = make_client(tmp_path, node=node, **{"record-noise-multiplier": 0.5})
    _, _, metrics = c.fit(hypotheses(1), {"num-hypotheses": 1, "server-round": 1})
    event = ledger_of(tmp_path).entries()[0].event
    assert isinstance(event, RecordLevelEvent)
    assert event.noise_multiplier == 3.0 and event.relation == "add-remove"
    assert metrics["record-sensitivity"] == RUN["record-clip"]


def test_dpsgd_is_declined_unless_the_device_allows_it(tmp_path: Path) -> None:
    built: list[str] = []
    c = make_client(tmp_path, built, node={"mechanisms": "gaussian"})
    released, _, metrics = c.fit(hypotheses(1), {"num-hypotheses": 1, "server-round": 1})
    assert released == [] and metrics["declined-by"] == "policy" and built == []
    assert "mechanism='dpsgd'" in metrics["decline-reason"]
    assert not list(tmp_path.iterdir())


def test_the_record_cap_declines_before_anything_is_trained(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    event = RecordLevelEvent(0.1, 2.0, 5, "replace-one", 0.0)
    one, two = record_epsilon([event], 1e-5), record_epsilon([event, event], 1e-5)
    assert one < two
    c = make_client(tmp_path, node={"cap-record-epsilon": (one + two) / 2})
    _, _, first = c.fit(hypotheses(1), {"num-hypotheses": 1, "server-round": 1})
    assert first["declined"] == 0

    def touched(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the private part ran after the cap declined")

    monkeypatch.setattr("client.numpy_client.release_record", touched)
    _, _, metrics = c.fit(hypotheses(1), {"num-hypotheses": 1, "server-round": 2})
    assert metrics["declined-by"] == "budget" and "record cap" in metrics["decline-reason"]
    assert len(ledger_of(tmp_path).entries()) == 1
    assert metrics["spend-record-epsilon"] == pytest.approx(one)


def test_with_two_hypotheses_the_choice_is_charged(tmp_path: Path) -> None:
    c = make_client(tmp_path)
    released, _, metrics = c.fit(hypotheses(2), {"num-hypotheses": 2, "server-round": 1})
    assert metrics["declined"] == 0 and len(released) == 2
    event = ledger_of(tmp_path).entries()[0].event
    assert isinstance(event, RecordLevelEvent) and event.selection_noise_multiplier == 2.0
    without = record_epsilon([RecordLevelEvent(0.1, 2.0, 5, "replace-one", 0.0)], 1e-5)
    assert metrics["spend-record-epsilon"] > without


def test_a_task_without_a_per_record_loss_is_declined_before_the_charge(
    tmp_path: Path,
) -> None:
    c = make_client(tmp_path, task="synthetic")
    released, _, metrics = c.fit([np.zeros(2, np.float32)],
                                 {"num-hypotheses": 1, "server-round": 1})
    assert released == [] and metrics["declined-by"] == "policy"
    assert not (tmp_path / "client-0.json").exists()


def test_a_request_whose_noise_could_overflow_is_declined_before_anything_is_read(
    tmp_path: Path,
) -> None:
    built: list[str] = []
    c = make_client(tmp_path, built, node={"data-path": str(tmp_path / "absent.csv")},
                    **{"record-clip": 1e6, "record-clip-rate": 10.0, "record-steps": 100_000})
    released, _, metrics = c.fit(hypotheses(1), {"num-hypotheses": 1, "server-round": 1})
    assert released == [] and metrics["declined-by"] == "policy" and built == []
    assert "record-clip=1000000.0" in metrics["decline-reason"]
    assert not (tmp_path / "client-0.json").exists()


def test_the_release_check_refuses_a_release_without_its_charged_noise() -> None:
    from client.record_release import RecordPlan, verify_record_release
    from mechanisms.invariant import ReleaseRefused
    from mechanisms.record_clipping import NoiseSplit, split_noise
    from tasks.dpsgd import RecordTrace

    n, steps = 100, 3
    split = split_noise("oso", 1.0)
    plan = RecordPlan(RecordLevelEvent(0.1, 1.0, steps, "add-remove", 0.0), split, "oso")
    sigma = split.gradient * 2.0
    model = [np.zeros(n, np.float32)]

    def trace(energy: float, sigmas: float = sigma, count: int = steps) -> RecordTrace:
        return RecordTrace(clips=[2.0] * (count + 1), learning_rates=[0.1] * (count + 1),
                           noise_energy=[energy] * count, noise_sigma=[sigmas] * count,
                           dimension=n)

    verify_record_release(plan, trace(n * sigma ** 2), reference=model, released=model)
    for bad in (trace(0.01 * n * sigma ** 2), trace(n * sigma ** 2, sigmas=0.5 * sigma),
                trace(n * sigma ** 2, count=steps - 1)):
        with pytest.raises(ReleaseRefused):
            verify_record_release(plan, bad, reference=model, released=model)
    weaker = RecordPlan(plan.event, NoiseSplit(1.0, 1.0), "oso")  # combined ν = 0.71 < 1
    with pytest.raises(ReleaseRefused, match="less noise"):
        verify_record_release(weaker, trace(n * 4.0), reference=model, released=model)
    with pytest.raises(ReleaseRefused, match="finite"):
        verify_record_release(plan, trace(n * sigma ** 2), reference=model,
                              released=[np.full(n, np.nan, np.float32)])
