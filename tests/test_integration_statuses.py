"""How a launch ends when its devices run out of budget or fail, over real processes.

A run that did all its rounds is ``complete`` only when its devices worked: devices that stop
for their caps end it ``budget-exhausted`` (exit 5), most devices failing every round end it
``devices-failed`` (exit 6), and a device failing every round in an otherwise working run is
named (its ``client-name`` and its failure's class). The budget table printed before round 1 is
checked against the devices' ledgers after the run. Small federations, short rounds.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from deploy.launcher import describe, launch
from server import results
from tests.conftest import flower_processes, ledger_spend

pytestmark = pytest.mark.integration

#: Synthetic task (2 parameters), ν = 5: one release costs 2/5 in d-privacy; a cap of 1.2 pays 3.
COST, CAP = 0.4, 1.2
RUN_CONFIG = {"clients-per-round": 2, "patience": 0, "seed": 2, "round-timeout": 30}


def corrupt_ledgers(out: Path, names: list[str]) -> None:
    """Write ledgers the devices must refuse (as a disk error or a bad restore would)."""
    folder = out / "ledgers"
    folder.mkdir(parents=True)
    for name in names:
        (folder / f"{name}.json").write_text('{"format": "gpfl-privacy-ledger", "vers')


@pytest.mark.timeout(300)
def test_devices_that_stop_for_their_caps_end_the_run_budget_exhausted(
    tmp_path: Path, no_leftover_processes: None
) -> None:
    # Prepare: every device's cap pays 3 of the 10 rounds asked.
    lines: list[str] = []
    names = ["client-0", "client-1"]

    # Execute
    result = launch(supernodes=2, out_dir=tmp_path / "run", echo=lines.append, timeout=240,
                    run_config={**RUN_CONFIG, "num-rounds": 10, "noise-multiplier": 5.0},
                    policy={"cap-d-privacy": CAP})

    # Assert: the table came before round 1, said what a release costs and that the cap pays
    # 3 of 10 rounds, naming the setting; the run ended budget-exhausted, exit 5, naming the
    # devices and the rounds paid.
    first_round = next(i for i, line in enumerate(lines) if "[gpfl] round 1/" in line)
    table = [line for line in lines[:first_round] if line.startswith("gpfl: budget of")]
    assert any(f"one release costs {COST:g} d-privacy" in line for line in table), table
    assert any("cap-d-privacy=1.2 pays 3 of the 10 rounds" in line for line in table), table
    summary = result.summary
    assert result.status == "budget-exhausted" and summary["status"] == "budget-exhausted"
    assert results.exit_status(result.status, result.finished) == results.EXIT_BUDGET == 5
    assert summary["rounds_completed"] == 3 and summary["last_round"] == 10
    reason = summary["incomplete_reason"]
    assert "client-0, client-1 reached their caps (cap-d-privacy)" in reason
    assert "3 of 10 rounds" in reason
    assert "run budget-exhausted" in describe(result)
    # The table against the ledgers: each device paid what the table said its cap pays.
    spent = ledger_spend(tmp_path / "run" / "ledgers", names)
    for name in names:
        plan = summary["budget_plan"][name]
        assert plan["cost"] == pytest.approx(COST) and plan["releases"] == 3
        assert spent[name][0] == plan["releases"]
        assert spent[name][1] == pytest.approx(plan["releases"] * plan["cost"])
        assert summary["devices"]["budget_exhausted"][name]["releases"] == 3
    assert flower_processes() == []


@pytest.mark.timeout(300)
def test_most_devices_failing_every_round_end_the_run_devices_failed(
    tmp_path: Path, no_leftover_processes: None
) -> None:
    # Prepare: three of four devices' ledgers are unreadable: they fail every round.
    out = tmp_path / "run"
    corrupt_ledgers(out, ["client-1", "client-2", "client-3"])

    # Execute
    result = launch(supernodes=4, out_dir=out, echo=lambda _: None, timeout=240,
                    run_config={**RUN_CONFIG, "num-rounds": 2, "clients-per-round": 4})

    # Assert: named by client-name with the failure's class; its own status and exit code.
    summary = result.summary
    assert result.status == "devices-failed", summary["incomplete_reason"]
    assert results.exit_status(result.status, result.finished) == results.EXIT_DEVICES_FAILED == 6
    assert summary["devices"]["failing"] == {"client-1": "ledger", "client-2": "ledger",
                                             "client-3": "ledger"}
    assert "3 of 4 devices failed every round" in summary["incomplete_reason"]
    assert "client-1 (ledger)" in describe(result)
    assert not any(name.startswith("node ") for name in summary["privacy"]["per_client"])
    assert flower_processes() == []


@pytest.mark.timeout(300)
def test_a_run_whose_devices_worked_is_complete_and_names_the_one_that_did_not(
    tmp_path: Path, no_leftover_processes: None
) -> None:
    # Prepare: one of three devices fails every round; the cap pays every round.
    out = tmp_path / "run"
    corrupt_ledgers(out, ["client-2"])
    lines: list[str] = []

    # Execute
    result = launch(supernodes=3, out_dir=out, echo=lines.append, timeout=240,
                    run_config={**RUN_CONFIG, "num-rounds": 2, "clients-per-round": 3})

    # Assert
    summary = result.summary
    assert result.status == "complete" and results.exit_status(result.status, True) == 0
    assert summary["devices"]["failing"] == {"client-2": "ledger"}
    assert summary["devices"]["working"] == 2
    assert "failed every round they were asked: client-2 (ledger)" in describe(result)
    assert summary["budget_plan"]["client-0"]["covers"] is True
    assert "unusable" in summary["budget_plan"]["client-2"]["note"]
    assert not any("of the 2 rounds" in line for line in lines)
    assert flower_processes() == []
