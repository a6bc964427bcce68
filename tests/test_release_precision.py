"""The device, not the server, fixes what leaves it: float32 on a public grid, and nothing
charged for an instruction the device can refuse from its metadata.

Driven through ``GpflClient.fit`` (the path a device runs), without Flower processes; the
real-process check of the float32 release is in ``tests/test_integration_deployment.py``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from client.app import device_task
from client.numpy_client import GpflClient, InstructionError, ReleaseFailedError
from client.policy import DevicePolicy
from mechanisms import LedgerUnavailableError, PrivacyLedger
from mechanisms.grid import on_grid_exactly
from mechanisms.laplace import laplace_grid, neighbourhood_epsilon
from mechanisms.ledger_errors import LEDGER_UNAVAILABLE
from mechanisms.ledger_store import LedgerStore
from settings import federation_defaults
from tasks import Task

RUN: dict[str, Any] = {**federation_defaults(), "num-rounds": 10, "seed": 3,
                       "validation-users": 4}
TABULAR: dict[str, Any] = {"task": "tabular", "label-column": "y", "feature-columns": "a,b",
                           "classes": "no,yes"}


def policy(ledgers: Path, **node: Any) -> DevicePolicy:
    return DevicePolicy.load({"partition-id": 0, "num-partitions": 4,
                              "ledger-dir": str(ledgers), **node}, environ={})


def synthetic_client(ledgers: Path, **node: Any) -> GpflClient:
    p = policy(ledgers, **node)
    return GpflClient(device_task(RUN, p), RUN, p)


def tabular_client(tmp_path: Path, built: list[str]) -> GpflClient:
    """A device whose task reads its own CSV file: it is built only once the round is charged."""
    data = tmp_path / "d.csv"
    data.write_text("a,b,y\n" + "".join(f"{i},{i % 3},{'yes' if i % 2 else 'no'}\n"
                                         for i in range(6)))
    p = policy(tmp_path / "ledgers", **{"data-path": str(data), "device": "cpu"})
    config = {**RUN, **TABULAR}

    def build() -> Task:
        built.append("built")  # the device's records would be read here
        return device_task(config, p)

    return GpflClient(build, config, p)


def test_float64_hypotheses_get_a_float32_release_on_the_grid_of_its_charge(
        tmp_path: Path) -> None:
    # Prepare: the server sends float64 hypotheses (it chose the precision before).
    client = synthetic_client(tmp_path)
    hypotheses = [np.array([5.0, 6.0]), np.array([4.0, -4.5])]
    trained = client.task.train(
        [hypotheses[0]], client.task.client_dataset(0, 4), epochs=RUN["local-epochs"],
        learning_rate=RUN["learning-rate"], batch_size=RUN["batch-size"],
        rng=np.random.default_rng(np.random.SeedSequence([3, 0, 1])))

    # Execute
    released, _, metrics = client.fit(hypotheses, {"num-hypotheses": 2, "server-round": 1})

    # Assert: float32, and every value on the grid of the release's own charged scale
    # (partition 0 picks hypothesis 0; epsilon = n/(nu*max(|delta|, least-radius))).
    assert metrics["declined"] == 0 and [a.dtype for a in released] == [np.float32]
    radius = max(float(np.linalg.norm(np.asarray(trained[0], np.float64) - hypotheses[0])),
                 0.01)
    spacing = laplace_grid(2, neighbourhood_epsilon(2, RUN["noise-multiplier"], radius))
    # The model's own float64 radius may differ from the device's in its last bit: one binade.
    assert on_grid_exactly(np.asarray(released[0], np.float64), spacing / 2)


@pytest.mark.parametrize("shapes", [
    [(3, 2), (2,)],                    # the right count of layers, a wrong shape
    [(2, 2)],                          # a layer missing
])
def test_a_wrong_shape_is_refused_before_the_charge_on_a_device_with_a_data_file(
        tmp_path: Path, shapes: list[tuple[int, ...]]) -> None:
    # Prepare: the tabular model is Linear(2 -> 2): shapes (2, 2) and (2,).
    built: list[str] = []
    client = tabular_client(tmp_path, built)
    instruction = [np.zeros(shape, np.float32) for shape in shapes]

    # Execute / Assert: refused from the run config's declared shapes; nothing built or charged.
    with pytest.raises(InstructionError, match="are not the task's"):
        client.fit(instruction, {"num-hypotheses": 1, "server-round": 1})
    assert built == []
    assert not (tmp_path / "ledgers").exists()


def test_the_right_shape_on_a_device_with_a_data_file_is_charged_and_released(
        tmp_path: Path) -> None:
    built: list[str] = []
    client = tabular_client(tmp_path, built)
    instruction = [np.zeros((2, 2), np.float32), np.zeros(2, np.float32)]

    released, _, metrics = client.fit(instruction, {"num-hypotheses": 1, "server-round": 1})

    assert metrics["declined"] == 0 and built == ["built"]
    assert [a.shape for a in released] == [(2, 2), (2,)]
    assert PrivacyLedger(tmp_path / "ledgers" / "client-0.json", delta=1e-5).spent().releases == 1


def test_an_instruction_beyond_max_instruction_values_is_refused_before_any_value_is_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare: 8 hypotheses of 2 values = 16 values, against a device bound of 15; a value
    # pass would meet np.isfinite, which must not run.
    client = synthetic_client(tmp_path, **{"max-instruction-values": 15})
    read: list[int] = []
    real_isfinite = np.isfinite

    def isfinite(values: Any, *args: Any, **kwargs: Any) -> Any:
        read.append(1)
        return real_isfinite(values, *args, **kwargs)

    monkeypatch.setattr(np, "isfinite", isfinite)

    # Execute / Assert
    with pytest.raises(InstructionError, match="max-instruction-values=15"):
        client.fit([np.zeros(2, np.float32)] * 8, {"num-hypotheses": 8, "server-round": 1})
    assert read == []
    assert not (tmp_path / "client-0.json").exists()


def test_a_huge_instruction_of_the_wrong_shape_costs_no_value_pass(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Two hypotheses of 2·10^6 values for a 2-parameter task: refused from the shapes alone.
    client = synthetic_client(tmp_path)
    monkeypatch.setattr(np, "isfinite", lambda *a, **k: pytest.fail("a value was read"))
    with pytest.raises(InstructionError, match="are not the task's"):
        client.fit([np.zeros(2_000_000, np.float32)] * 2,
                   {"num-hypotheses": 2, "server-round": 1})
    assert not (tmp_path / "client-0.json").exists()


def test_an_unwritable_ledger_sends_a_fixed_text_without_path_or_os_message(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # Prepare: the ledger's folder lies under a plain file, so it cannot be created (root
    # can write anywhere else, a read-only folder would not stop it).
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    client = synthetic_client(blocker / "ledgers")
    caplog.set_level(logging.ERROR)

    # Execute
    with pytest.raises(ReleaseFailedError) as failure:
        client.fit([np.array([5.0, 6.0], np.float32)], {"num-hypotheses": 1, "server-round": 1})

    # Assert: what travels is fixed; the detail (path, OS message) is in the device's log.
    assert str(blocker) not in str(failure.value) and "Errno" not in str(failure.value)
    assert str(blocker) in caplog.text


def test_the_ledger_stores_os_errors_carry_a_fixed_text(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    store = LedgerStore(blocker / "sub" / "client-0.json")
    with pytest.raises(LedgerUnavailableError) as failure:
        store.update(lambda state: state)
    assert str(failure.value) == LEDGER_UNAVAILABLE
