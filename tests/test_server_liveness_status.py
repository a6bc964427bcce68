"""The launch's budget table, the honest run statuses and the watch's deadlines (no Flower run).

The budget table must agree with the ledger that will decline: it is checked here against a
real ledger charged release after release until it refuses. The statuses are checked on privacy
reports built as the ServerApp builds them; the deadlines on stand-in processes.
"""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from client.numpy_client import ReleaseFailedError
from client.policy import DevicePolicy
from client.record_release import plan_record_release
from client.settings import ClientSettings
from deploy import cli, processes, serverapp_runner, superlink_state
from deploy.budget import budget_lines, meaning, plan_budgets, weakness
from deploy.processes import Liveness, ProcessSet, ProcessWatch
from mechanisms import BudgetExceededError, NeighbourhoodEvent, PrivacyLedger
from mechanisms.record_accounting import record_epsilon
from server import results
from server.results import device_health, health_status
from strategies.intake import _FAILURE_TAG

SYNTHETIC = [(2,)]  # the synthetic task's model: θ in R^2


def node(tmp_path: Path, i: int, **extra: Any) -> dict[str, Any]:
    return {"partition-id": i, "num-partitions": 2, "ledger-dir": str(tmp_path / "ledgers"),
            **extra}


def test_the_budget_table_counts_what_the_ledger_will_charge(tmp_path: Path) -> None:
    # Prepare: ν = 5 on a 2-parameter model costs 2/5 a release; client-0's cap 1.2 pays 3,
    # client-1 keeps the default cap (50) and has already spent 0.8 (two releases).
    run_config = {"num-rounds": 10, "noise-multiplier": 5.0}
    spent = PrivacyLedger(tmp_path / "ledgers" / "client-1.json", delta=1e-5)
    for _ in range(2):
        spent.charge(NeighbourhoodEvent((2,), 5.0), cap=50.0)

    # Execute
    plans = plan_budgets(run_config, {0: node(tmp_path, 0, **{"cap-d-privacy": 1.2}),
                                      1: node(tmp_path, 1)}, SYNTHETIC)

    # Assert: the cost is the event's n/ν, the counts are the ledger's own.
    first, second = plans
    assert first.name == "client-0" and first.cost == pytest.approx(0.4)
    assert first.cap == 1.2 and first.cap_setting == "cap-d-privacy"
    assert first.releases == 3 and not first.covers
    assert second.spent == pytest.approx(0.8) and second.releases == 10 and second.covers
    ledger = PrivacyLedger(tmp_path / "own.json", delta=1e-5)
    charged = 0
    with pytest.raises(BudgetExceededError):
        while True:
            ledger.charge(NeighbourhoodEvent((2,), 5.0), cap=1.2)
            charged += 1
    assert charged == first.releases
    lines = budget_lines(plans)
    assert any("client-0: one release costs 0.4 d-privacy" in line for line in lines)
    assert any("cap-d-privacy=1.2 pays 3 of the 10 rounds" in line and "raise cap-d-privacy"
               in line for line in lines)
    assert not any("client-1:" in line and "of the 10 rounds" in line for line in lines)


def test_a_gaussian_release_is_planned_with_the_accountant(tmp_path: Path) -> None:
    # Gaussian releases compose by RDP: the cap (cap-epsilon) pays fewer releases than the
    # planned ones only when the planned ones exceed it.
    plans = plan_budgets({"num-rounds": 6, "mechanism": "gaussian", "epsilon": 2.0,
                          "planned-releases": 12},
                         {0: node(tmp_path, 0, **{"cap-epsilon": 1.0, "mechanisms": "gaussian"})},
                         SYNTHETIC)
    (plan,) = plans
    assert plan.cap_setting == "cap-epsilon" and plan.unit.startswith("RDP epsilon")
    assert 0 < plan.cost < 1.0 and plan.releases is not None and 0 < plan.releases < 6


def test_a_record_level_release_is_planned_with_the_devices_own_plan(tmp_path: Path) -> None:
    # Prepare: DP-SGD with a cap that pays some rounds; the device's ledger charges the event
    # of its own plan (plan_record_release) for each release, with k = 2's noisy choice.
    run_config = {"num-rounds": 10, "mechanism": "dpsgd", "record-steps": 20,
                  "record-noise-multiplier": 8.0, "record-sampling-rate": 0.05}
    nodes = {0: node(tmp_path, 0, **{"cap-record-epsilon": 3.0, "mechanisms": "dpsgd"})}

    # Execute
    (plan,) = plan_budgets(run_config, nodes, SYNTHETIC, hypotheses=2)

    # Assert: planned (not skipped), in the record family's unit, and the count is what a real
    # ledger charges before it refuses.
    assert plan.note == "" and plan.unit.startswith("record-level RDP epsilon")
    assert plan.cap_setting == "cap-record-epsilon" and plan.cap == 3.0
    assert plan.releases is not None and 0 < plan.releases < 10
    settings = ClientSettings.resolve(run_config, DevicePolicy.load(
        {**nodes[0], "partition-id": 0}))
    event = plan_record_release(settings, [[np.zeros(2, np.float32)]] * 2).event
    assert event.selection_noise_multiplier > 0.0  # k = 2 charges the choice too
    ledger = PrivacyLedger(tmp_path / "own.json", delta=settings.privacy.ledger_delta)
    charged = 0
    with pytest.raises(BudgetExceededError):
        while True:
            ledger.charge(event, cap=3.0)
            charged += 1
    assert charged == plan.releases
    assert plan.cost == pytest.approx(record_epsilon([event], settings.privacy.ledger_delta))
    lines = budget_lines([plan])
    (advice,) = [line for line in lines if "raise cap-record-epsilon" in line]
    assert "raise record-noise-multiplier" in advice
    assert any("for each record of the device" in line for line in lines)


def test_the_budget_says_what_a_release_means_and_warns_where_the_model_size_decides(
        tmp_path: Path) -> None:
    # Prepare: ν = 5 on the 2-parameter synthetic model (0.4 a release), on a 62-parameter
    # logistic model (62/5 = 12.4 a release), and a Gaussian run at ε = 8 over 40 rounds.
    laplace = {"num-rounds": 40, "noise-multiplier": 5.0}
    gaussian = {"num-rounds": 40, "mechanism": "gaussian", "epsilon": 8.0}
    logistic = [(61,), (1,)]

    # Execute
    (small,) = plan_budgets(laplace, {0: node(tmp_path, 0)}, SYNTHETIC)
    (large,) = plan_budgets(laplace, {0: node(tmp_path, 1)}, logistic)
    (noisy,) = plan_budgets(gaussian, {0: node(tmp_path / "g", 0)}, logistic)

    # Assert: each cost is said as the factor it bounds and what the cap buys; the warning
    # comes where n/ν makes the factor large, and names the mechanisms that are not.
    assert "up to a factor e^0.4; the factor stays under e within the whole neighbourhood" in (
        meaning(small))
    assert "cap-d-privacy=50 (spent 0) pays a release every round the run asks for" in (
        meaning(small))
    assert weakness(small) == ""
    assert "e^12.4; the factor stays under e only within r/12.4 of it" in meaning(large)
    assert "pays 4 releases, fewer than the 40 rounds the run asks for" in meaning(large)
    assert weakness(large).startswith("one release costs 12.4 (62 parameters: the neighbourhood "
                                      "calibration charges n/ν), a factor e^12.4")
    assert "mechanism='gaussian'" in weakness(large) and "mechanism='dpsgd'" in weakness(large)
    assert f"gpfl: WARNING for client-1: {weakness(large)}" in budget_lines([large])
    assert noisy.cost is not None
    assert large.to_dict()["warning"] == weakness(large)
    assert large.to_dict()["meaning"] == meaning(large)
    assert f"(ε = {noisy.cost:.3g}, δ)-differentially private for the device's whole data" in (
        meaning(noisy))
    assert 0 < noisy.cost < 2.0 and weakness(noisy) == ""


def report(**clients: dict[str, Any]) -> dict[str, dict[str, Any]]:
    base = {"sampled": 5, "participations": 0, "declines": 0, "failures": 0, "dropped": 0,
            "missing": 0, "releases": 0, "declined_by": "", "decline_reason": "", "failure": ""}
    return {name: {**base, **c} for name, c in clients.items()}


def test_a_run_whose_devices_ran_out_of_budget_is_not_complete() -> None:
    per_client = report(**{
        "client-0": {"participations": 3, "declines": 7, "releases": 3, "declined_by": "budget",
                     "decline_reason": "the next release would pass this device's d-privacy cap"},
        "client-1": {"participations": 10, "releases": 10}})
    health = device_health(per_client)
    assert health["budget_exhausted"] == {"client-0": {"releases": 3,
                                                       "cap_setting": "cap-d-privacy"}}
    status, reason = health_status(health, last_round=10, rounds_completed=3) or ("", "")
    assert status == "budget-exhausted"
    assert "client-0" in reason and "3 of 10 rounds" in reason and "cap-d-privacy" in reason
    # Every round still had its replies: complete, the device named in `devices`.
    assert health_status(health, last_round=10, rounds_completed=10) is None


def test_a_run_where_most_devices_failed_throughout_is_not_complete() -> None:
    per_client = report(**{
        "client-0": {"participations": 5},
        "client-1": {"failures": 5, "failure": "ledger"},
        "client-2": {"dropped": 5},
        "node 7": {"missing": 5}})
    health = device_health(per_client)
    assert health["failing"] == {"client-1": "ledger", "client-2": "bad-replies",
                                 "node 7": "no-reply"}
    status, reason = health_status(health, last_round=5, rounds_completed=5) or ("", "")
    assert status == "devices-failed"
    assert "3 of 4 devices" in reason and "client-1 (ledger)" in reason
    # One of three failing is named, not a failed run.
    two_working = report(**{"a": {"participations": 5}, "b": {"participations": 5},
                            "c": {"failures": 5, "failure": "release"}})
    assert health_status(device_health(two_working), 5, 5) is None


def test_a_device_failure_names_the_device_and_its_class_only() -> None:
    text = str(ReleaseFailedError("client-3", "ledger"))
    match = _FAILURE_TAG.search(f"error status CLIENT_APP_RAISED_EXCEPTION: <'{text}'>")
    assert match is not None and match.groups() == ("client-3", "ledger")


def test_each_status_has_its_exit_code() -> None:
    assert results.exit_status("complete", True) == 0
    assert results.exit_status("incomplete", False) == results.EXIT_INCOMPLETE == 3
    assert results.exit_status("diverged", False) == 4
    assert results.exit_status("budget-exhausted", False) == results.EXIT_BUDGET == 5
    assert results.exit_status("devices-failed", False) == results.EXIT_DEVICES_FAILED == 6


def test_the_runner_and_the_watch_agree_and_match_flower() -> None:
    from flwr.common import constant

    assert serverapp_runner.EXIT_REFUSED == processes.EXIT_REFUSED
    assert serverapp_runner.REFUSED_MARK == processes.REFUSED_MARK
    assert constant.HEARTBEAT_DEFAULT_INTERVAL == serverapp_runner.CLAIM_WINDOW_S
    assert constant.HEARTBEAT_PATIENCE == 2
    assert superlink_state.RESTART_WINDOW_S == (
        constant.HEARTBEAT_PATIENCE * constant.HEARTBEAT_DEFAULT_INTERVAL)
    assert serverapp_runner.GUARD_INTERVAL_S < constant.HEARTBEAT_DEFAULT_INTERVAL / 5


@pytest.mark.parametrize("task", sorted(serverapp_runner.RUNTIMES))
def test_the_runner_wraps_the_function_flowers_entry_calls_by_its_global_name(task: str) -> None:
    # The runner stops its heartbeat guard when the app returns by replacing the function
    # Flower's runtime entry calls (a module global): a Flower that called it another way
    # would leave the guard running past the token's revocation. Pinned on the installed Flower.
    import importlib
    import inspect

    runtime = serverapp_runner.RUNTIMES[task]
    module = importlib.import_module(runtime.module)
    assert callable(getattr(module, runtime.app_call))
    assert f"{runtime.app_call}(" in inspect.getsource(getattr(module, runtime.entry))


def watch_with(tmp_path: Path, liveness: Liveness) -> tuple[ProcessSet, ProcessWatch]:
    procs = ProcessSet()
    for name in ("superlink", "flwr-run"):
        procs.start(name, ["sleep", "60"], tmp_path / f"{name}.log")
    return procs, ProcessWatch(procs, lambda _: None, interval=0.05, liveness=liveness)


def test_the_watch_ends_a_run_without_a_serverapp_line_at_the_startup_deadline(
    tmp_path: Path,
) -> None:
    procs, watch = watch_with(tmp_path, Liveness(startup_s=0.5, stall_s=60))
    try:
        with watch:
            procs.procs["flwr-run"].wait(timeout=10)
        assert watch.stop_reason is not None
        assert "the ServerApp did not start within" in watch.stop_reason
        assert "--startup-timeout" in watch.stop_reason
    finally:
        assert procs.stop_all() == []


def test_the_watch_ends_a_run_whose_rounds_stopped(tmp_path: Path) -> None:
    procs, watch = watch_with(tmp_path, Liveness(startup_s=60, stall_s=0.6))
    try:
        with watch:
            watch.saw("INFO [gpfl] task=synthetic k=2")
            for r in range(3):  # rounds keep it going
                time.sleep(0.3)
                watch.saw(f"INFO [gpfl] round {r}/5 val_loss 1.0")
            assert procs.procs["flwr-run"].poll() is None
            procs.procs["flwr-run"].wait(timeout=10)
        assert watch.stop_reason is not None and "no round finished" in watch.stop_reason
        assert "after round 2's line" in watch.stop_reason
    finally:
        assert procs.stop_all() == []


def test_a_refused_serverapp_ends_the_run_at_once_with_its_line(tmp_path: Path) -> None:
    # A stand-in ServerApp that writes the runner's refusal line and exits as it does.
    procs, watch = watch_with(tmp_path, Liveness(60, 60, tmp_path / "serverapp.log"))
    line = f"{processes.REFUSED_MARK}: its task token was no longer valid 71 s after ..."
    try:
        with watch:
            procs.start(processes.SERVERAPP, [sys.executable, "-c", (
                f"import sys, time; time.sleep(0.3); sys.stderr.write({line!r}); "
                f"sys.exit({processes.EXIT_REFUSED})")], tmp_path / "serverapp.log")
            procs.procs["flwr-run"].wait(timeout=10)
        assert procs.procs["flwr-run"].returncode == -signal.SIGTERM
        assert watch.stop_reason is not None
        assert watch.stop_reason.startswith("the SuperLink refused the ServerApp")
        assert "71 s after" in watch.stop_reason and "\n" not in watch.stop_reason
    finally:
        assert procs.stop_all() == []


def test_gpfl_certs_tells_device_owners_to_run_gpfl_supernode(tmp_path: Path) -> None:
    from deploy.certs import describe_deployment, make_deployment

    text = describe_deployment(make_deployment(tmp_path, ["fl.example.org"], 2, days=1,
                                               local=True))
    commands = [line.strip() for line in text.splitlines()
                if "supernode" in line and "register" not in line]
    assert any(c.startswith("gpfl supernode --root-certificates ca.crt") for c in commands)
    assert any(c.startswith("device 1: gpfl supernode") for c in commands)
    assert not any(c.startswith(("flower-supernode", "device 0: flower-supernode"))
                   for c in commands)


@pytest.mark.parametrize(("node_config", "expected"), [
    ({"ledger-dir": ""}, "ledger-dir in the node config of SuperNode 0: must name a folder"),
    ({"ledger-dir": "ledgers"}, "ledger-dir in the node config of SuperNode 0: must be an "
                                "absolute path"),
    ({"ledger-path": "a.json"}, "ledger-path in the node config of SuperNode 0: must be an "
                                "absolute path"),
    ({"policy-file": "/nonexistent/policy.toml"},
     "policy-file /nonexistent/policy.toml does not exist"),
])
def test_a_bad_ledger_location_or_policy_file_fails_the_launch_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], node_config: dict[str, Any],
    expected: str,
) -> None:
    # Through the command line, as a user meets it: one line, exit 1, nothing started.
    items = " ".join(f'{k}="{v}"' for k, v in node_config.items())
    code = cli.main(["launch", "--supernodes", "1", "--out", str(tmp_path / "run"),
                     "--node-config", f"0:{items}"])
    err = capsys.readouterr().err.strip()
    assert code == 1 and err.startswith("gpfl: launch failed: ") and expected in err, err
    assert "\n" not in err and "Traceback" not in err
    assert not (tmp_path / "run" / "logs").exists()


def test_a_bad_policy_file_in_a_node_config_fails_the_launch_naming_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text('mechanisms = "gaussian"\ncap-epsilon = "lots"\n')
    code = cli.main(["launch", "--supernodes", "1", "--out", str(tmp_path / "run"),
                     "--node-config", f'0:policy-file="{policy}"'])
    err = capsys.readouterr().err.strip()
    assert code == 1 and "\n" not in err
    assert err == (f"gpfl: launch failed: cap-epsilon must be a number >= 0 in the policy file "
                   f"{policy}, got cap-epsilon='lots'")


def test_the_command_line_start_up_deadline_is_the_launchers() -> None:
    from deploy.launcher import STARTUP_TIMEOUT_S

    args = cli.build_parser().parse_args(["launch"])
    assert args.startup_timeout == STARTUP_TIMEOUT_S
