"""The NumPyClient driven directly (no Flower processes): choice, training, sanitizing, budget."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from client.numpy_client import GpflClient
from client.settings import ClientSettings, ConfigError
from mechanisms import LedgerCorruptError, PrivacyLedger
from tasks import load_task

RUN: dict[str, Any] = {
    "task": "synthetic", "num-hypotheses": 2, "num-rounds": 10, "local-epochs": 1,
    "learning-rate": 0.1, "batch-size": 10, "mechanism": "laplace",
    "calibration": "neighbourhood", "noise-multiplier": 5.0, "epsilon": 1.0, "delta": 1e-5,
    "clip": 1.0, "privacy-budget": 0.0, "seed": 3, "optima": "5,6;4,-4.5", "users": 0,
    "samples-per-user": 10, "validation-users": 4, "data-seed": 0,
}
HYPOTHESES = [np.array([5.0, 6.0], np.float32), np.array([4.0, -4.5], np.float32)]


def make_client(tmp_path: Path, partition: int = 0, **overrides: Any) -> GpflClient:
    run = {**RUN, **overrides}
    node = {"partition-id": partition, "num-partitions": 4, "ledger-dir": str(tmp_path)}
    return GpflClient(load_task(run), ClientSettings.from_configs(run, node))


def fit(client: GpflClient, rnd: int = 1) -> tuple[list[np.ndarray], int, dict[str, Any]]:
    return client.fit(list(HYPOTHESES), {"num-hypotheses": 2, "server-round": rnd})


def test_release_is_sanitized_and_reveals_no_cluster_or_sample_count(tmp_path: Path) -> None:
    # Partition 1 belongs to group 1 (user u -> group u % 2): it trains hypothesis 1.
    client = make_client(tmp_path, partition=1)
    trained = client.task.train(
        [HYPOTHESES[1]], client.task.client_dataset(1, 4), epochs=1, learning_rate=0.1,
        batch_size=10, rng=np.random.default_rng(0),
    )[0]

    released, count, metrics = fit(client)

    assert count == 1
    assert len(released) == 1 and released[0].dtype == np.float32
    # The noise norm has mean 5‖δ‖; a release equal to the trained model is impossible.
    assert not np.allclose(released[0], trained, atol=1e-6)
    assert not any("cluster" in key or "hypothesis" in key for key in metrics)
    # Neighbourhood calibration: σ would reveal ‖δ‖, so it is not declared.
    assert "sigma" not in metrics
    assert metrics["declined"] == 0 and metrics["releases"] == 1


def test_charge_is_on_disk_when_fit_returns(tmp_path: Path) -> None:
    client = make_client(tmp_path)

    fit(client)

    spend = PrivacyLedger(tmp_path / "client-0.json", delta=1e-5).spent()
    assert spend.releases == 1
    assert spend.d_privacy == pytest.approx(2 / 5)  # n/ν with n = 2, ν = 5


def test_client_declines_once_its_cap_would_be_passed(tmp_path: Path) -> None:
    # Cap 0.8 = two releases of n/ν = 0.4 each; the third would pass it.
    spends = []
    for rnd in (1, 2, 3):
        client = make_client(tmp_path, **{"privacy-budget": 0.8})  # rebuilt per message
        released, _, metrics = fit(client, rnd)
        spends.append((len(released), metrics["declined"], metrics["spend-d"]))

    assert spends[0] == (1, 0, pytest.approx(0.4))
    assert spends[1] == (1, 0, pytest.approx(0.8))
    assert spends[2] == (0, 1, pytest.approx(0.8))
    ledger = PrivacyLedger(tmp_path / "client-0.json", delta=1e-5).spent()
    assert (ledger.releases, ledger.declines) == (2, 1)


def test_node_config_cap_overrides_the_run_config(tmp_path: Path) -> None:
    run = {**RUN, "privacy-budget": 100.0}
    node = {"partition-id": 0, "num-partitions": 4, "ledger-dir": str(tmp_path),
            "privacy-budget": 0.3}
    client = GpflClient(load_task(run), ClientSettings.from_configs(run, node))

    released, _, metrics = fit(client)

    assert released == [] and metrics["declined"] == 1


def test_no_mechanism_releases_the_trained_model(tmp_path: Path) -> None:
    client = make_client(tmp_path, mechanism="none")
    trained = client.task.train(
        [HYPOTHESES[0]], client.task.client_dataset(0, 4), epochs=1, learning_rate=0.1,
        batch_size=10, rng=np.random.default_rng(0),
    )[0]

    released, _, metrics = fit(client)

    # One full batch of 10 samples: the step does not depend on the shuffle.
    np.testing.assert_allclose(released[0], trained, rtol=1e-6)
    assert metrics["sigma"] == 0.0


def test_gaussian_client_declares_its_budget_and_sigma(tmp_path: Path) -> None:
    client = make_client(tmp_path, mechanism="gaussian", epsilon=2.0, delta=1e-5)

    _, _, metrics = fit(client)

    assert metrics["budget-epsilon"] == 2.0 and metrics["budget-delta"] == 1e-5
    assert metrics["sigma"] > 0
    assert 0 < metrics["spend-epsilon"] <= 2.0


def test_corrupt_ledger_stops_the_client(tmp_path: Path) -> None:
    (tmp_path / "client-0.json").write_text('{"format": "gpfl-privacy-ledger", "vers')

    with pytest.raises(LedgerCorruptError):
        make_client(tmp_path)


def test_per_client_epsilons_cycle_over_partitions(tmp_path: Path) -> None:
    run = {**RUN, "mechanism": "gaussian", "client-epsilons": "1,5,10"}
    eps = [
        ClientSettings.from_configs(run, {"partition-id": p, "num-partitions": 4}).privacy.epsilon
        for p in range(4)
    ]
    assert eps == [1.0, 5.0, 10.0, 1.0]


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ({"noise-multiplier": 0.0}, "noise-multiplier"),
        ({"noise-multiplier": -1.0}, "noise-multiplier"),
        ({"mechanism": "laplase"}, "mechanism"),
        ({"calibration": "fixed", "epsilon": float("inf")}, "epsilon"),
        ({"mechanism": "gaussian", "delta": 1.5}, "delta"),
        ({"mechanism": "gaussian", "clip": 0}, "clip"),
        ({"local-epochs": 0}, "local-epochs"),
        ({"learning-rate": "fast"}, "learning-rate"),
        ({"mechanism": "none", "privacy-budget": 1.0}, "privacy-budget"),
        ({"client-epsilons": "1,x"}, "client-epsilons"),
        ({"device": "tpu"}, "device"),
    ],
)
def test_invalid_settings_name_the_setting_and_value(override: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        ClientSettings.from_configs({**RUN, **override}, {"partition-id": 0, "num-partitions": 1})


def test_partition_outside_the_federation_is_refused() -> None:
    with pytest.raises(ConfigError, match="partition-id"):
        ClientSettings.from_configs(RUN, {"partition-id": 4, "num-partitions": 4})
