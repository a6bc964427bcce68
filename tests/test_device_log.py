"""The device's one log line per round: what it says, and that the reply does not change."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from client.app import device_task
from client.numpy_client import GpflClient
from client.policy import DevicePolicy
from mechanisms import PrivacyLedger
from settings import federation_defaults

RUN: dict[str, Any] = {
    **federation_defaults(), "num-rounds": 10, "seed": 3, "validation-users": 4,
}
HYPOTHESES = [np.array([5.0, 6.0], np.float32), np.array([4.0, -4.5], np.float32)]
LOGGER = "client.numpy_client"

#: The reply's metric keys as they were before the device logged a line per round: the line
#: is device-local, so a reply must carry exactly these, no more.
RELEASE_KEYS = {"budget-delta", "budget-epsilon", "client-name", "declined", "mechanism",
                "relation", "releases", "spend-d", "spend-delta", "spend-epsilon",
                "spend-epsilon-pld", "spend-epsilon-rdp", "spend-record-epsilon"}
GAUSSIAN_KEYS = RELEASE_KEYS | {"sigma"}
BUDGET_DECLINE_KEYS = RELEASE_KEYS | {"decline-reason", "declined-by"}


def fit(
    folder: Path, rnd: int, node: dict[str, Any] | None = None, **run: Any,
) -> tuple[list[np.ndarray], int, dict[str, Any]]:
    """One round of partition 1, with seeded noise (so that two runs release the same)."""
    policy = DevicePolicy.load(
        {"partition-id": 1, "num-partitions": 4, "ledger-dir": str(folder),
         "allow-seeded-noise": True, "noise-seed": 7, **(node or {})}, environ={})
    config = {**RUN, **run}
    client = GpflClient(device_task(config, policy), config, policy, run_id=42)
    return client.fit(list(HYPOTHESES), {"num-hypotheses": 2, "server-round": rnd,
                                         "federation-id": "fed-a"})


def nearest(rnd_folder: Path) -> int:
    """The hypothesis partition 1's data fits best, by the task's own loss (what it trains from)."""
    policy = DevicePolicy.load({"partition-id": 1, "num-partitions": 4,
                                "ledger-dir": str(rnd_folder)}, environ={})
    task = device_task(RUN, policy)
    data = task.client_dataset(1, 4)
    losses = [float(task.loss([h], data)) for h in HYPOTHESES]
    return int(np.argmin(losses))


def round_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    records = [r for r in caplog.records if r.getMessage().startswith("gpfl device:")]
    caplog.clear()
    return records


def test_a_laplace_release_and_a_budget_decline_each_log_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Prepare: a cap of 1.0 = two releases of n/ν = 2/5 = 0.4; the third would pass it.
    caplog.set_level(logging.INFO, logger=LOGGER)
    node = {"cap-d-privacy": 1.0}

    # Execute / Assert: one line a round, with the charge, the spend, the cap and what is left.
    prefix = "gpfl device: run 42 round {} federation fed-a: client-1 "
    picked = nearest(tmp_path)
    fit(tmp_path, 1, node)
    [line] = round_lines(caplog)
    assert line.levelno == logging.INFO
    assert line.getMessage() == prefix.format(1) + (
        f"served: hypothesis {picked} of 2, laplace release charged 0.4 d-privacy "
        "(spent 0.4 of cap 1, 0.6 left)")
    fit(tmp_path, 2, node)
    [line] = round_lines(caplog)
    assert line.getMessage() == prefix.format(2) + (
        f"served: hypothesis {picked} of 2, laplace release charged 0.4 d-privacy "
        "(spent 0.8 of cap 1, 0.2 left)")
    released, _, metrics = fit(tmp_path, 3, node)
    [line] = round_lines(caplog)
    assert released == [] and metrics["declined-by"] == "budget"
    assert line.levelno == logging.WARNING
    assert line.getMessage() == prefix.format(3) + (
        "declines (budget): a laplace release would cost 0.4 d-privacy "
        "(spent 0.8 of cap 1, 0.2 left); nothing charged")
    assert PrivacyLedger(tmp_path / "client-1.json", delta=1e-5).spent().d_privacy == 0.8


def test_a_gaussian_release_logs_what_it_added_to_the_composed_epsilon(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Prepare
    caplog.set_level(logging.INFO, logger=LOGGER)
    node = {"mechanisms": "gaussian", "cap-epsilon": 0.6}
    ledger = PrivacyLedger(tmp_path / "client-1.json", delta=1e-5)
    line = re.compile(
        r"gpfl device: run 42 round (\d+) federation fed-a: client-1 served: hypothesis [01] of 2, "
        r"gaussian release charged (\S+) epsilon at delta=1e-05 "
        r"\(spent (\S+) of cap 0\.6, (\S+) left\)")

    spent = 0.0
    for rnd in (1, 2):
        # Execute
        fit(tmp_path, rnd, node, mechanism="gaussian")

        # Assert: the cost is what the ledger's composed ε grew by; the spend is the ledger's.
        [record] = round_lines(caplog)
        match = line.fullmatch(record.getMessage())
        assert match is not None, record.getMessage()
        after = ledger.spent().epsilon
        assert match.groups() == (str(rnd), f"{after - spent:.6g}", f"{after:.6g}",
                                  f"{0.6 - after:.6g}")
        spent = after


def test_a_policy_decline_logs_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)

    released, _, metrics = fit(tmp_path, 5, {"mechanisms": "laplace"}, mechanism="gaussian")

    [line] = round_lines(caplog)
    assert released == [] and metrics["declined-by"] == "policy"
    assert line.getMessage() == (
        "gpfl device: run 42 round 5 federation fed-a: client-1 declines (policy): "
        f"{metrics['decline-reason']}; nothing charged")


@pytest.mark.parametrize(("node", "run", "keys"), [
    ({}, {}, [RELEASE_KEYS, RELEASE_KEYS]),
    ({"mechanisms": "gaussian"}, {"mechanism": "gaussian"}, [GAUSSIAN_KEYS, GAUSSIAN_KEYS]),
    ({"cap-d-privacy": 0.5}, {}, [RELEASE_KEYS, BUDGET_DECLINE_KEYS]),
], ids=["laplace", "gaussian", "budget-decline"])
def test_the_reply_is_the_same_with_and_without_the_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, node: dict[str, Any],
    run: dict[str, Any], keys: list[set[str]],
) -> None:
    # Prepare: the same rounds on two fresh ledgers, the line logged in one only.
    def replies(folder: Path, logged: bool) -> list[tuple[list[bytes], int, str]]:
        caplog.set_level(logging.INFO if logged else logging.CRITICAL, logger=LOGGER)
        out = []
        for rnd in (1, 2):
            arrays, count, metrics = fit(folder, rnd, node, **run)
            out.append(([a.tobytes() for a in arrays], count, repr(sorted(metrics.items()))))
            assert set(metrics) == keys[rnd - 1]
        return out

    # Execute
    with_line = replies(tmp_path / "logged", True)
    assert len(round_lines(caplog)) == 2
    without = replies(tmp_path / "quiet", False)

    # Assert: byte for byte the same reply (seeded noise), and no key beyond the ones before.
    assert round_lines(caplog) == []
    assert with_line == without
