"""The NumPyClient driven directly (no Flower processes): policy, choice, training, budget."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from client.app import device_task
from client.numpy_client import RELEASE_FAILED, GpflClient, InstructionError, ReleaseFailedError
from client.policy import DevicePolicy, PolicyError
from client.release import plan_release
from client.settings import ClientSettings, PrivacySettings
from mechanisms import PrivacyLedger, calibrate_gaussian_noise_multiplier
from settings import federation_defaults

RUN: dict[str, Any] = {
    **federation_defaults(), "num-rounds": 10, "seed": 3, "validation-users": 4,
}
HYPOTHESES = [np.array([5.0, 6.0], np.float32), np.array([4.0, -4.5], np.float32)]
N_OVER_NU = 2 / 5  # one neighbourhood release of the 2-parameter model at nu = 5


def make_client(tmp_path: Path, partition: int = 0, node: dict[str, Any] | None = None,
                **run: Any) -> GpflClient:
    policy = DevicePolicy.load(
        {"partition-id": partition, "num-partitions": 4, "ledger-dir": str(tmp_path),
         **(node or {})}, environ={})
    config = {**RUN, **run}
    return GpflClient(device_task(config, policy), config, policy)


def fit(client: GpflClient, rnd: int = 1) -> tuple[list[np.ndarray], int, dict[str, Any]]:
    return client.fit(list(HYPOTHESES), {"num-hypotheses": 2, "server-round": rnd})


def trained_model(client: GpflClient, hypothesis: int, partition: int) -> np.ndarray:
    return client.task.train(
        [HYPOTHESES[hypothesis]], client.task.client_dataset(partition, 4), epochs=1,
        learning_rate=0.1, batch_size=10, rng=np.random.default_rng(0),
    )[0]


def test_release_is_sanitized_and_reveals_no_cluster_or_sample_count(tmp_path: Path) -> None:
    # Partition 1 belongs to group 1 (user u -> group u % 2): it trains hypothesis 1.
    client = make_client(tmp_path, partition=1)
    trained = trained_model(client, 1, 1)

    released, count, metrics = fit(client)

    assert count == 1
    assert len(released) == 1 and released[0].dtype == np.float32
    # The noise norm has mean 5‖δ‖; a release equal to the trained model is impossible.
    assert not np.allclose(released[0], trained, atol=1e-6)
    assert not any("cluster" in key or "hypothesis" in key for key in metrics)
    # Neighbourhood calibration: σ would reveal ‖δ‖, so it is not declared.
    assert "sigma" not in metrics
    assert metrics["declined"] == 0 and metrics["releases"] == 1


def test_charge_is_on_disk_and_the_reported_spend_is_exactly_n_over_nu(tmp_path: Path) -> None:
    for rnd in (1, 2, 3):
        _, _, metrics = fit(make_client(tmp_path), rnd)  # rebuilt per message, like Flower

    spend = PrivacyLedger(tmp_path / "client-0.json", delta=1e-5).spent()
    assert spend.releases == 3
    # Exact public sums (==): the reported spend carries no bits of ‖δ‖.
    assert spend.d_privacy == metrics["spend-d"] == N_OVER_NU + N_OVER_NU + N_OVER_NU


def test_client_declines_once_its_device_cap_would_be_passed(tmp_path: Path) -> None:
    # The device's cap 0.8 = two releases of n/ν = 0.4; the run asks for more (100).
    spends = []
    for rnd in (1, 2, 3):
        client = make_client(tmp_path, node={"cap-d-privacy": 0.8}, **{"cap-d-privacy": 100.0})
        released, _, metrics = fit(client, rnd)
        spends.append((len(released), metrics["declined"], metrics["spend-d"]))

    assert spends[0] == (1, 0, pytest.approx(0.4))
    assert spends[1] == (1, 0, pytest.approx(0.8))
    assert spends[2] == (0, 1, pytest.approx(0.8))
    ledger = PrivacyLedger(tmp_path / "client-0.json", delta=1e-5).spent()
    assert (ledger.releases, ledger.declines) == (2, 1)


def test_a_stricter_cap_requested_by_the_run_is_applied(tmp_path: Path) -> None:
    client = make_client(tmp_path, **{"cap-d-privacy": 0.3})  # device default 50
    released, _, metrics = fit(client)
    assert released == [] and metrics["declined"] == 1 and metrics["declined-by"] == "budget"


def test_a_mechanism_the_policy_forbids_is_declined_before_anything_is_computed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = make_client(tmp_path, mechanism="none")  # the default policy never allows none
    touched: list[str] = []
    monkeypatch.setattr(client.task, "client_dataset", lambda *a: touched.append("data"))

    released, _, metrics = fit(client)

    assert released == [] and touched == []
    assert metrics["declined"] == 1 and metrics["declined-by"] == "policy"
    assert "mechanism='none'" in metrics["decline-reason"]
    assert not (tmp_path / "client-0.json").exists()  # nothing charged, nothing recorded


def test_a_device_that_allows_none_releases_the_trained_model(tmp_path: Path) -> None:
    client = make_client(tmp_path, node={"mechanisms": "none"}, mechanism="none")
    trained = trained_model(client, 0, 0)

    released, _, metrics = fit(client)

    # One full batch of 10 samples: the step does not depend on the shuffle.
    np.testing.assert_allclose(released[0], trained, rtol=1e-6)
    assert metrics["sigma"] == 0.0


@pytest.mark.parametrize(
    ("request_", "bound", "field", "applied"),
    [
        ({"noise-multiplier": 0.01}, {"noise-multiplier": 4.0}, "noise_multiplier", 4.0),
        ({"noise-multiplier": 9.0}, {"noise-multiplier": 4.0}, "noise_multiplier", 9.0),
        ({"public-radius": 1e-9}, {}, "public_radius", 1.0),
        ({"d-epsilon": 1e6}, {"d-epsilon": 2.0}, "d_epsilon", 2.0),
        ({"delta": 0.5}, {}, "delta", 1e-5),
        ({"epsilon": 1e5}, {"epsilon": 3.0}, "epsilon", 3.0),
        ({"cap-epsilon": 1e9}, {}, "cap_epsilon", 10.0),
    ],
)
def test_the_stricter_of_request_and_policy_is_applied(
    request_: dict[str, Any], bound: dict[str, Any], field: str, applied: float
) -> None:
    policy = DevicePolicy.load(bound, environ={})
    privacy = ClientSettings.resolve({**RUN, **request_}, policy).privacy
    assert getattr(privacy, field) == applied


def test_device_settings_in_the_run_config_are_ignored(tmp_path: Path) -> None:
    policy = DevicePolicy.load({"ledger-dir": str(tmp_path / "mine")}, environ={})
    settings = ClientSettings.resolve({**RUN, "ledger-dir": str(tmp_path / "fresh")}, policy)
    assert settings.ledger_path == tmp_path / "mine" / "client-0.json"


def test_the_ledger_delta_is_the_devices_whatever_the_run_asks(tmp_path: Path) -> None:
    policy = DevicePolicy.load({"delta": 1e-6}, environ={})
    privacy = ClientSettings.resolve({**RUN, "delta": 1e-9}, policy).privacy
    assert privacy.delta == 1e-9 and privacy.ledger_delta == 1e-6


def test_gaussian_client_declares_its_budget_and_sigma(tmp_path: Path) -> None:
    client = make_client(tmp_path, mechanism="gaussian", epsilon=2.0, delta=1e-5)

    _, _, metrics = fit(client)

    assert metrics["budget-epsilon"] == 2.0 and metrics["budget-delta"] == 1e-5
    assert metrics["sigma"] > 0
    assert 0 < metrics["spend-epsilon"] <= 2.0


@pytest.mark.parametrize("mechanism", ["gaussian", "sign"])
def test_the_plan_states_the_noise_scale_the_release_draws(mechanism: str) -> None:
    # Prepare: two hypotheses 0.5 apart, 7 coordinates clipped element-wise to 0.5.
    privacy = PrivacySettings(
        mechanism=mechanism, calibration="neighbourhood", noise_multiplier=1.0, d_epsilon=1.0,
        public_radius=1.0, least_radius=0.01, per_layer=False, epsilon=2.0, delta=1e-5,
        ledger_delta=1e-5, clip=0.5, clip_mode="elementwise", planned_releases=10,
        cap_d_privacy=100.0, cap_epsilon=100.0)
    first = [np.zeros(3, np.float32), np.ones((2, 2), np.float32)]
    second = [np.array([0.5, 0.0, 0.0], np.float32), np.ones((2, 2), np.float32)]

    # Execute
    plan = plan_release(privacy, [first, second], max_abs=10.0)

    # Assert: z (2c sqrt(n) + D) for the Gaussian, z 2c sqrt(n) for the sign, bit for bit.
    z = calibrate_gaussian_noise_multiplier(2.0, 1e-5, 10)
    sensitivity = 2.0 * 0.5 * math.sqrt(7)
    assert plan.spread == 0.5
    expected = z * (sensitivity + plan.spread) if mechanism == "gaussian" else z * sensitivity
    assert plan.metrics["sigma"] == expected


def test_corrupt_ledger_stops_the_client_and_sends_no_details(tmp_path: Path) -> None:
    (tmp_path / "client-0.json").write_text('{"format": "gpfl-privacy-ledger", "vers')

    with pytest.raises(ReleaseFailedError) as caught:
        fit(make_client(tmp_path))
    # The fixed text, and only the device's public name and the failure's class.
    assert str(caught.value) == f"{RELEASE_FAILED} [device=client-0 class=ledger]"


def test_any_failure_after_the_charge_sends_the_fixed_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = make_client(tmp_path)

    def leak(*args: Any, **kwargs: Any) -> None:
        raise ValueError("private value 3.14159 of the local data")

    monkeypatch.setattr("mechanisms.laplace.EuclideanLaplace.sanitize_exact", leak)
    with pytest.raises(ReleaseFailedError) as caught:
        fit(client)

    assert str(caught.value) == f"{RELEASE_FAILED} [device=client-0 class=release]"
    assert caught.value.__cause__ is None and caught.value.__suppress_context__
    # The charge stands: a crash after charging never undoes it.
    assert PrivacyLedger(tmp_path / "client-0.json", delta=1e-5).spent().releases == 1


def test_evaluate_sends_nothing_data_dependent(tmp_path: Path) -> None:
    client = make_client(tmp_path)
    near = [np.array([5.0, 6.0], np.float32), np.array([4.0, -4.5], np.float32)]
    far = [np.array([50.0, 60.0], np.float32), np.array([40.0, -45.0], np.float32)]

    a = client.evaluate(near, {"num-hypotheses": 2})
    b = client.evaluate(far, {"num-hypotheses": 2})

    assert a == b and a[0] == 0.0 and a[1] == 0


@pytest.mark.parametrize(
    ("parameters", "config", "named"),
    [
        (HYPOTHESES[:1], {"num-hypotheses": 2}, "expected num-hypotheses=2"),
        ([np.zeros(3, np.float32)] * 2, {"num-hypotheses": 2}, "shape"),
        ([np.zeros(2, np.int64)] * 2, {"num-hypotheses": 2}, "floating-point"),
        ([np.array([np.nan, 0], np.float32)] * 2, {"num-hypotheses": 2}, "non-finite"),
        (HYPOTHESES, {"num-hypotheses": 0}, "num-hypotheses"),
        (HYPOTHESES, {"num-hypotheses": 2, "server-round": -1}, "server-round"),
        ([np.array([1e30, 0], np.float32)] * 2, {"num-hypotheses": 2}, "max-parameter=1e"),
        ([np.array([0, -2e6], np.float32)] * 2, {"num-hypotheses": 2}, "magnitude 2e"),
    ],
)
def test_a_malformed_instruction_is_refused_and_nothing_is_charged(
    tmp_path: Path, parameters: list[np.ndarray], config: dict[str, Any], named: str
) -> None:
    with pytest.raises(InstructionError, match=named):
        make_client(tmp_path).fit(list(parameters), config)
    assert not (tmp_path / "client-0.json").exists()


def test_an_instruction_beyond_the_devices_max_parameter_charges_and_releases_nothing(
    tmp_path: Path,
) -> None:
    # Prepare: one honest round is charged; the device accepts values up to 10 only.
    client = make_client(tmp_path, node={"max-parameter": 10.0})
    fit(client)
    ledger = tmp_path / "client-0.json"
    before = ledger.read_bytes()
    huge = [np.array([5.0, 60.0], np.float32), np.array([4.0, -4.5], np.float32)]

    # Execute / Assert: refused with a message naming the bound, the ledger untouched.
    with pytest.raises(InstructionError, match=r"hypothesis 0, layer 0.*max-parameter=10"):
        client.fit(huge, {"num-hypotheses": 2, "server-round": 2})
    assert ledger.read_bytes() == before
    assert PrivacyLedger(ledger, delta=1e-5).spent().releases == 1


def test_per_client_epsilons_cycle_over_partitions() -> None:
    run = {**RUN, "mechanism": "gaussian", "client-epsilons": "1,5,10"}
    eps = [
        ClientSettings.resolve(
            run, DevicePolicy.load({"partition-id": p, "num-partitions": 4}, environ={})
        ).privacy.epsilon
        for p in range(4)
    ]
    assert eps == [1.0, 5.0, 10.0, 1.0]


def test_an_invalid_request_is_declined_naming_the_setting(tmp_path: Path) -> None:
    client = make_client(tmp_path, **{"noise-multiplier": -1.0})
    released, _, metrics = fit(client)
    assert released == [] and metrics["declined-by"] == "policy"
    assert "noise-multiplier" in metrics["decline-reason"]


@pytest.mark.parametrize(
    ("node", "named"),
    [
        ({"cap-epsilon": -1}, "cap-epsilon"),
        ({"device": "tpu"}, "device"),
        ({"mechanisms": "laplace,rot13"}, "mechanisms"),
        ({"num-rounds": 3}, "num-rounds is a run-config setting"),
        ({"privacy-budget": 1.0}, "privacy-budget"),
    ],
)
def test_invalid_device_settings_name_the_setting(node: dict[str, Any], named: str) -> None:
    with pytest.raises(PolicyError, match=named):
        DevicePolicy.load(node, environ={})


def test_policy_file_from_the_node_config_or_the_environment(tmp_path: Path) -> None:
    path = tmp_path / "policy.toml"
    path.write_text('mechanisms = "gaussian"\ncap-epsilon = 2.5\nnoise-multiplier = 3.0\n')

    from_node = DevicePolicy.load({"policy-file": str(path), "noise-multiplier": 7.0}, environ={})
    from_env = DevicePolicy.load({}, environ={"GPFL_POLICY": str(path)})

    assert from_node.mechanisms == ("gaussian",) and from_node["cap-epsilon"] == 2.5
    assert from_node["noise-multiplier"] == 7.0  # the node config overrides the file
    assert from_env["noise-multiplier"] == 3.0
    assert DevicePolicy.load({}, environ={})["cap-epsilon"] == 10.0  # the device default


def test_a_policy_file_with_a_bad_value_or_a_run_key_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "policy.toml"
    path.write_text("num-rounds = 3\n")
    with pytest.raises(PolicyError, match="num-rounds"):
        DevicePolicy.load({"policy-file": str(path)}, environ={})
    with pytest.raises(PolicyError, match="does not exist"):
        DevicePolicy.load({"policy-file": str(tmp_path / "missing.toml")}, environ={})


def test_partition_outside_the_federation_is_declined() -> None:
    policy = DevicePolicy.load({"partition-id": 4, "num-partitions": 4}, environ={})
    from client.policy import PolicyDecline

    with pytest.raises(PolicyDecline, match="partition-id"):
        ClientSettings.resolve(RUN, policy)
