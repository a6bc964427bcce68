"""The client's privacy ledger through its façade: composition, caps, refusals, persistence.

The store's safety properties (corrupt, missing, rolled-back files, crashes, concurrent
writers, temporaries) are in ``test_mechanisms_ledger_store.py``; files written by earlier
code in ``test_mechanisms_ledger_compat.py``. Both use the helpers defined here.
"""

from __future__ import annotations

import json
import math
import signal
import stat
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest

from client.ledger_view import format_ledger
from mechanisms import (
    BudgetExceededError,
    GaussianReleaseEvent,
    MetricPrivacyEvent,
    NeighbourhoodEvent,
    NonPrivateEvent,
    PrivacyEvent,
    PrivacyLedger,
    RecordLevelEvent,
    SignReleaseEvent,
    Spend,
    calibrate_gaussian_noise_multiplier,
    gaussian_epsilon,
)
from mechanisms.calibration import composed_gaussian_epsilon_pld, composed_gaussian_epsilon_rdp
from mechanisms.record_accounting import record_epsilon

ROOT = Path(__file__).resolve().parents[1]
DELTA = 1e-5
#: How a refused Gaussian or sign charge names its unit.
CHARGED_UNIT = r"ε \(the smaller of RDP's and PLD's\) at δ=1e-05"


def metric(cost: float) -> MetricPrivacyEvent:
    """A one-layer d-privacy event of the given cost (radius 2)."""
    return MetricPrivacyEvent(((cost / 2.0, 2.0),))


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "ledgers" / "client-0.json"


def lock_of(path: Path) -> Path:
    return path.with_name(path.name + ".lock")


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file in ``folder`` and its bytes."""
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def run_python(code: str, **kwargs: object) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,  # type: ignore[call-overload]
    )


def kill_after_one_line(child: subprocess.Popen[str]) -> tuple[str, str]:
    """Read one line of ``child``'s output, SIGKILL it, and return that line and its stderr."""
    with child:
        assert child.stdout is not None and child.stderr is not None
        line = child.stdout.readline()
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
        return line, child.stderr.read()


# -- composition -------------------------------------------------------------------------------


def test_new_ledger_is_empty_and_writes_nothing(path: Path) -> None:
    # Execute
    spend = PrivacyLedger(path, delta=DELTA).spent()

    # Assert
    assert spend == Spend(d_privacy=0.0, epsilon=0.0, delta=0.0, releases=0, declines=0)
    assert not path.exists()


def test_d_privacy_costs_add_up(path: Path) -> None:
    # Prepare
    ledger = PrivacyLedger(path, delta=DELTA)

    # Execute
    ledger.charge(metric(0.4), cap=None, round=1)
    ledger.charge(MetricPrivacyEvent(((0.1, 3.0), (0.25, 2.0))), cap=None, round=2)
    spend = ledger.spent()

    # Assert: 0.4 + (0.3 + 0.5); no Gaussian releases, so no (epsilon, delta).
    assert spend.d_privacy == pytest.approx(1.2, rel=1e-12)
    assert (spend.epsilon, spend.delta, spend.releases) == (0.0, 0.0, 2)


def test_neighbourhood_spend_is_exactly_the_sum_of_n_over_nu(path: Path) -> None:
    # Prepare: R releases of n = 7850 parameters at nu = 3, as the Laplace mechanism
    # records them; their ||delta|| (1e-3 to 1e3) does not enter the event at all.
    n, nu, rounds = 7850, 3.0, 25
    ledger = PrivacyLedger(path, delta=DELTA)

    # Execute
    for r in range(rounds):
        ledger.charge(NeighbourhoodEvent((n,), nu), cap=None, round=r)
    spend = PrivacyLedger(path, delta=DELTA).spent()

    # Assert: == on floats, on purpose: the reported spend is a function of (n, nu, R).
    assert spend.d_privacy == math.fsum([n / nu] * rounds)
    assert (spend.epsilon, spend.delta, spend.releases) == (0.0, 0.0, rounds)


def test_neighbourhood_and_metric_events_add_in_one_d_privacy_spend(path: Path) -> None:
    # Prepare
    ledger = PrivacyLedger(path, delta=DELTA)

    # Execute: 4/2 + 0.5 * 3 + (3 + 1)/4
    ledger.charge(NeighbourhoodEvent((4,), 2.0), cap=None)
    ledger.charge(MetricPrivacyEvent(((0.5, 3.0),)), cap=None)
    spend = ledger.charge(NeighbourhoodEvent((3, 1), 4.0), cap=4.5)

    # Assert
    assert spend.d_privacy == 4.5
    with pytest.raises(BudgetExceededError, match="d-privacy"):
        ledger.charge(NeighbourhoodEvent((1,), 1e6), cap=4.5)


def test_a_cap_admits_exactly_the_releases_that_fit(path: Path) -> None:
    # Prepare: 3 x 0.1 sums to 0.30000000000000004 in floating point; it must fit a cap of 0.3.
    ledger = PrivacyLedger(path, delta=DELTA)
    for _ in range(3):
        ledger.charge(metric(0.1), cap=0.3)

    # Execute / Assert
    with pytest.raises(BudgetExceededError):
        ledger.charge(metric(0.1), cap=0.3)
    assert ledger.spent().releases == 3


def test_gaussian_epsilon_composes_with_rdp_and_grows(path: Path) -> None:
    # Prepare
    ledger = PrivacyLedger(path, delta=DELTA)

    # Execute
    spends = [ledger.charge(GaussianReleaseEvent(5.0), cap=None) for _ in range(3)]

    # Assert
    assert spends[0].epsilon < spends[1].epsilon < spends[2].epsilon
    assert spends[2].epsilon == pytest.approx(gaussian_epsilon(5.0, 3, DELTA), rel=1e-12)
    assert spends[2].delta == DELTA
    assert spends[2].d_privacy == 0.0
    assert ledger.spent() == spends[2]


def test_sign_releases_cost_what_gaussian_releases_cost(path: Path) -> None:
    # Prepare
    ledger = PrivacyLedger(path, delta=DELTA)

    # Execute
    ledger.charge(GaussianReleaseEvent(4.0), cap=None)
    ledger.charge(SignReleaseEvent(4.0), cap=None)
    ledger.charge(GaussianReleaseEvent(9.0), cap=None)

    # Assert: the sign release composes as a Gaussian one with the same multiplier.
    two_at_4 = gaussian_epsilon(4.0, 2, DELTA)
    assert ledger.spent().epsilon > two_at_4
    expected = PrivacyLedger(path.with_name("other.json"), delta=DELTA)
    for z in (4.0, 4.0, 9.0):
        expected.charge(GaussianReleaseEvent(z), cap=None)
    assert ledger.spent().epsilon == pytest.approx(expected.spent().epsilon, rel=1e-12)


def test_the_planned_releases_fit_a_cap_equal_to_the_target(path: Path) -> None:
    # Prepare: the client's cap is its target epsilon; z is calibrated for 5 releases.
    z = calibrate_gaussian_noise_multiplier(1.0, DELTA, 5)
    ledger = PrivacyLedger(path, delta=DELTA)

    # Execute
    for _ in range(5):
        spend = ledger.charge(GaussianReleaseEvent(z), cap=1.0)

    # Assert
    assert spend.epsilon <= 1.0
    with pytest.raises(BudgetExceededError, match=CHARGED_UNIT):
        ledger.charge(SignReleaseEvent(z), cap=1.0)


def test_the_cap_admits_the_releases_pld_admits_beyond_rdp(path: Path) -> None:
    # Prepare: z calibrated (by RDP) for 30 releases within ε = 1; the cap is that ε. RDP
    # would decline the 31st release; PLD's ε of 35 releases is still below 1, of 36 above.
    z = calibrate_gaussian_noise_multiplier(1.0, DELTA, 30)
    rdp = composed_gaussian_epsilon_rdp({z: 31}, DELTA)
    assert rdp > 1.0
    assert composed_gaussian_epsilon_pld({z: 35}, DELTA) <= 1.0
    assert composed_gaussian_epsilon_pld({z: 36}, DELTA) > 1.0
    ledger = PrivacyLedger(path, delta=DELTA)

    # Execute
    for i in range(35):
        spend = ledger.charge((GaussianReleaseEvent, SignReleaseEvent)[i % 2](z), cap=1.0)
    before = path.read_bytes()
    with pytest.raises(BudgetExceededError, match=CHARGED_UNIT) as info:
        ledger.charge(GaussianReleaseEvent(z), cap=1.0)

    # Assert: 35 charged, the 36th refused and nothing written; the spend reports both bounds.
    assert spend.releases == 35 and path.read_bytes() == before
    assert spend.epsilon == spend.epsilon_pld < 1.0 < spend.epsilon_rdp
    assert info.value.spent == spend.epsilon
    assert info.value.would_spend == composed_gaussian_epsilon_pld({z: 36}, DELTA)


def test_many_releases_are_composed_quickly(path: Path) -> None:
    # Prepare: 300 events in the file (written directly, as 300 charges would).
    events = [{"time": "2025-01-01T00:00:00+00:00", "round": i,
               "event": {"kind": "gaussian", "noise_multiplier": 20.0 + (i % 3)}}
              for i in range(300)]
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"format": "gpfl-privacy-ledger", "version": 1, "delta": DELTA,
                                "declines": 0, "events": events}))

    # Execute
    spend = PrivacyLedger(path, delta=DELTA).spent()

    # Assert
    assert spend.releases == 300
    assert spend.epsilon > gaussian_epsilon(22.0, 300, DELTA)
    assert spend.epsilon < gaussian_epsilon(20.0, 300, DELTA)


def test_each_family_is_compared_with_its_own_cap_only(path: Path) -> None:
    # Prepare: the d-privacy cap 2.0 is used up exactly; the rdp cap is the epsilon of
    # two releases at z = 6.
    z = 6.0
    rdp_cap = gaussian_epsilon(z, 2, DELTA)
    ledger = PrivacyLedger(path, delta=DELTA)
    ledger.charge(NeighbourhoodEvent((8,), 4.0), cap=2.0)
    with pytest.raises(BudgetExceededError):
        ledger.charge(NeighbourhoodEvent((8,), 4.0), cap=2.0)

    # Execute / Assert: Gaussian and sign releases still fit under the rdp cap, although
    # their epsilon (about 1.4) plus the d-privacy spend would pass either cap.
    ledger.charge(GaussianReleaseEvent(z), cap=rdp_cap)
    ledger.charge(SignReleaseEvent(z), cap=rdp_cap)
    assert ledger.spent().epsilon == pytest.approx(rdp_cap, rel=1e-12)

    # ... and, the rdp cap now used up, a d-privacy release still fits under its own cap.
    with pytest.raises(BudgetExceededError, match="RDP"):
        ledger.charge(GaussianReleaseEvent(z), cap=rdp_cap)
    ledger.charge(NeighbourhoodEvent((8,), 4.0), cap=4.0)
    assert ledger.spent().d_privacy == 4.0


@pytest.mark.parametrize("d_privacy_spent", [0.0, 1e6])
def test_a_gaussian_release_past_the_rdp_cap_is_refused_whatever_the_d_privacy_spend(
    path: Path, d_privacy_spent: float
) -> None:
    # Prepare: the rdp spend after one release at z = 6 is below the cap; a second
    # release would pass it. The d-privacy spend, zero or huge, must not matter.
    z = 6.0
    cap = 0.5 * (gaussian_epsilon(z, 1, DELTA) + gaussian_epsilon(z, 2, DELTA))
    ledger = PrivacyLedger(path, delta=DELTA)
    if d_privacy_spent:
        ledger.charge(MetricPrivacyEvent(((d_privacy_spent, 1.0),)), cap=None)
    ledger.charge(GaussianReleaseEvent(z), cap=cap)
    before = path.read_bytes()

    # Execute / Assert
    with pytest.raises(BudgetExceededError, match=CHARGED_UNIT) as info:
        ledger.charge(GaussianReleaseEvent(z), cap=cap)
    assert info.value.spent == pytest.approx(gaussian_epsilon(z, 1, DELTA), rel=1e-12)
    assert info.value.would_spend == pytest.approx(gaussian_epsilon(z, 2, DELTA), rel=1e-12)
    assert path.read_bytes() == before


def test_non_private_releases_are_counted_and_refused_under_any_cap(path: Path) -> None:
    # Prepare
    ledger = PrivacyLedger(path, delta=DELTA)

    # Execute
    spend = ledger.charge(NonPrivateEvent(), cap=None)

    # Assert: recorded with cap=None (the device allows the baseline), refused under any
    # finite cap, even one no other release has touched.
    assert (spend.releases, spend.d_privacy, spend.epsilon) == (1, 0.0, 0.0)
    before = path.read_bytes()
    for cap in (1e9, 0.0):
        with pytest.raises(BudgetExceededError, match="cannot fit under any cap"):
            ledger.charge(NonPrivateEvent(), cap=cap)
    assert ledger.spent().releases == 1
    assert path.read_bytes() == before


# -- refusals change nothing -------------------------------------------------------------------


def test_a_refused_charge_leaves_the_file_byte_for_byte(path: Path) -> None:
    # Prepare
    ledger = PrivacyLedger(path, delta=DELTA)
    ledger.charge(metric(1.5), cap=2.0, round=1)
    before = path.read_bytes()

    # Execute
    with pytest.raises(BudgetExceededError) as info:
        ledger.charge(metric(0.75), cap=2.0, round=2)

    # Assert
    assert path.read_bytes() == before
    message = str(info.value)
    assert "spent 1.5" in message and "2.25" in message and "cap 2" in message
    assert (info.value.spent, info.value.cost, info.value.cap) == (1.5, 0.75, 2.0)


@pytest.mark.parametrize(
    ("event", "cap", "round_", "error", "pattern"),
    [
        ("not an event", None, None, TypeError, "cannot charge 'not an event'"),
        ({"kind": "metric", "layers": [[1.0, 1.0]]}, None, None, TypeError, "cannot charge"),
        (metric(1.0), -1.0, None, ValueError, "cap must be non-negative and finite"),
        (metric(1.0), math.nan, None, ValueError, "cap must be non-negative and finite"),
        (metric(1.0), math.inf, None, ValueError, "None for no cap"),
        (metric(1.0), None, -3, ValueError, "round must be a non-negative integer"),
        (metric(1.0), None, 2.0, ValueError, "round must be a non-negative integer"),
    ],
)
def test_invalid_charges_change_nothing(
    path: Path, event: object, cap: float | None, round_: object,
    error: type[Exception], pattern: str,
) -> None:
    # Prepare
    ledger = PrivacyLedger(path, delta=DELTA)
    ledger.charge(metric(1.0), cap=None)
    before = path.read_bytes()

    # Execute / Assert
    with pytest.raises(error, match=pattern):
        ledger.charge(event, cap=cap, round=round_)  # type: ignore[arg-type]
    assert path.read_bytes() == before


@dataclass(frozen=True)
class _HomeMadeEvent(PrivacyEvent):
    """An event the ledger was never taught to compose, though it looks like d-privacy."""

    kind: ClassVar[str] = "metric"
    family: ClassVar[str] = "d-privacy"
    cost: float = 0.0


@pytest.mark.parametrize(
    "event",
    [_HomeMadeEvent(), PrivacyEvent()],
    ids=["subclass-posing-as-d-privacy", "base-class"],
)
def test_an_unknown_event_type_is_refused_before_touching_the_file(
    path: Path, event: PrivacyEvent
) -> None:
    # Prepare
    ledger = PrivacyLedger(path, delta=DELTA)
    ledger.charge(metric(1.0), cap=None)
    before = snapshot(path.parent)

    # Execute / Assert
    with pytest.raises(TypeError, match="cannot charge"):
        ledger.charge(event, cap=None)
    assert snapshot(path.parent) == before


def test_a_tampered_non_finite_event_is_refused_before_any_change(path: Path) -> None:
    # Prepare: events validate themselves on construction; bypass that as a bug could.
    ledger = PrivacyLedger(path, delta=DELTA)
    event = GaussianReleaseEvent(2.0)
    object.__setattr__(event, "noise_multiplier", math.nan)

    # Execute / Assert
    with pytest.raises(ValueError, match="noise_multiplier must be positive and finite"):
        ledger.charge(event, cap=None)
    assert not path.exists()


# -- persistence and format --------------------------------------------------------------------


def test_a_new_ledger_object_sees_everything_persisted(path: Path) -> None:
    # Prepare
    first = PrivacyLedger(path, delta=DELTA)
    first.charge(metric(0.5), cap=None, round=3)
    first.charge(GaussianReleaseEvent(6.0), cap=None, round=4)
    first.record_decline()

    # Execute
    second = PrivacyLedger(path, delta=DELTA)

    # Assert
    assert second.spent() == first.spent()
    assert second.spent().declines == 1
    assert [(e.event, e.round) for e in second.entries()] == [
        (metric(0.5), 3), (GaussianReleaseEvent(6.0), 4)]


def test_file_format_is_versioned_json_private_to_the_user(path: Path) -> None:
    # Prepare
    ledger = PrivacyLedger(path, delta=DELTA)

    # Execute
    ledger.charge(metric(0.5), cap=None, round=7)
    document = json.loads(path.read_text())

    # Assert
    assert document["format"] == "gpfl-privacy-ledger"
    assert document["version"] == 1
    assert document["generation"] == 1
    assert document["declines"] == 0
    (entry,) = document["events"]
    assert entry["round"] == 7
    assert entry["event"] == {"kind": "metric", "layers": [[0.25, 2.0]],
                              "relation": "device-replace"}
    assert entry["time"].endswith("+00:00")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sorted(p.name for p in path.parent.iterdir()) == ["client-0.json", "client-0.json.lock"]
    assert stat.S_IMODE(lock_of(path).stat().st_mode) == 0o600
    assert lock_of(path).read_text() == "gpfl-privacy-ledger generation 00000000000000000001\n"


def test_neighbourhood_events_are_stored_as_public_numbers(path: Path) -> None:
    # Execute
    PrivacyLedger(path, delta=DELTA).charge(NeighbourhoodEvent((784, 10), 5.0), cap=None)

    # Assert
    (entry,) = json.loads(path.read_text())["events"]
    assert entry["event"] == {"kind": "neighbourhood", "dimensions": [784, 10],
                              "noise_multiplier": 5.0, "relation": "device-replace"}
    assert PrivacyLedger(path, delta=DELTA).entries()[0].event == NeighbourhoodEvent(
        (784, 10), 5.0)


def test_every_write_increments_the_generation_in_file_and_lock(path: Path) -> None:
    # Prepare
    ledger = PrivacyLedger(path, delta=DELTA)

    # Execute
    ledger.charge(metric(0.5), cap=None)
    ledger.record_decline()
    ledger.charge(GaussianReleaseEvent(3.0), cap=None)
    with pytest.raises(BudgetExceededError):
        ledger.charge(metric(0.5), cap=0.1)  # a refusal writes nothing

    # Assert
    assert json.loads(path.read_text())["generation"] == 3
    assert lock_of(path).read_text() == "gpfl-privacy-ledger generation 00000000000000000003\n"


def test_declines_are_counted_and_persisted(path: Path) -> None:
    # Execute
    PrivacyLedger(path, delta=DELTA).record_decline()
    spend = PrivacyLedger(path, delta=DELTA).record_decline()

    # Assert
    assert (spend.declines, spend.releases) == (2, 0)
    assert spend.to_dict() == {"d_privacy": 0.0, "epsilon": 0.0, "delta": 0.0,
                               "releases": 0, "declines": 2, "record_epsilon": 0.0,
                               "epsilon_rdp": 0.0, "epsilon_pld": 0.0,
                               "central_epsilon": 0.0}


def test_ledger_delta_is_validated(path: Path) -> None:
    with pytest.raises(ValueError, match=r"delta must be in the open interval \(0, 1\), got d"):
        PrivacyLedger(path, delta=0)


# -- the human-readable dump -------------------------------------------------------------------


def test_format_ledger_lists_events_and_totals(path: Path) -> None:
    # Prepare
    ledger = PrivacyLedger(path, delta=DELTA)
    ledger.charge(metric(0.4), cap=None, round=1)
    ledger.charge(MetricPrivacyEvent(((0.1, 1.0), (0.2, 1.0))), cap=None, round=2)
    ledger.charge(GaussianReleaseEvent(8.0), cap=None)
    ledger.charge(NeighbourhoodEvent((7850,), 5.0), cap=None, round=4)
    ledger.charge(NeighbourhoodEvent((784, 10), 4.0), cap=None, round=5)
    ledger.charge(RecordLevelEvent(0.1, 2.0, 10, "replace-one", 2.0), cap=None, round=6)
    ledger.record_decline()

    # Execute
    text = format_ledger(path)

    # Assert: every entry names its neighbouring relation.
    lines = text.splitlines()
    device = "device-replace"
    assert lines[0] == f"privacy ledger {path}"
    assert lines[1].split() == ["#", "time", "(UTC)", "round", "kind", "relation", "parameters",
                                "d-cost"]
    assert lines[2].split()[2:] == ["1", "metric", device, "ε=0.2,", "r=2", "0.4"]
    assert lines[3].split()[2:] == ["2", "metric", device, "2", "layers", "0.3"]
    assert lines[4].split()[2:] == ["-", "gaussian", device, "z=8", "-"]
    assert lines[5].split()[2:] == ["4", "neighbourhood", device, "n=7850,", "ν=5", "1570"]
    assert lines[6].split()[2:] == ["5", "neighbourhood", device, "2", "layers,", "ν=4",
                                    "198.5"]
    assert lines[7].split()[2:6] == ["6", "dpsgd", "replace-one", "q=0.1,"]
    assert "releases: 6   declines: 1" in text
    assert "d-privacy (Σ ε·r): 1769.2" in text
    record = record_epsilon([RecordLevelEvent(0.1, 2.0, 10, "replace-one", 2.0)], DELTA)
    assert f"record-level DP-SGD (RDP): ε = {record:.6g} at δ = 1e-05" in text
    rdp = composed_gaussian_epsilon_rdp({8.0: 1}, DELTA)
    pld = composed_gaussian_epsilon_pld({8.0: 1}, DELTA)
    assert pld < rdp
    assert (f"Gaussian/sign: ε = {pld:.6g} at δ = 1e-05 (charged: the smaller of "
            f"RDP ε = {rdp:.6g} and PLD ε = {pld:.6g})") in lines


def test_format_ledger_without_a_file_says_so(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no privacy ledger at"):
        format_ledger(tmp_path / "missing.json")
    with pytest.raises(FileNotFoundError, match="not a file"):
        format_ledger(tmp_path)


# -- gpfl ledger: caps, what is left, federations ----------------------------------------------


def gpfl_ledger(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """Run ``gpfl ledger ARGV`` in this process; return its exit status, stdout and stderr."""
    from deploy.cli import main

    status = main(["ledger", *argv])
    out, err = capsys.readouterr()
    return status, out, err


def charged_ledger(path: Path) -> PrivacyLedger:
    """A ledger of two federations' releases (d-privacy and Gaussian) and an untagged one."""
    ledger = PrivacyLedger(path, delta=1e-6)
    ledger.charge(metric(0.4), cap=None, round=1, federation="fed-a")
    ledger.charge(metric(0.4), cap=None, round=2, federation="fed-a")
    ledger.charge(GaussianReleaseEvent(8.0), cap=None, round=4, federation="fed-b")
    ledger.charge(metric(0.2), cap=None)
    ledger.record_decline()
    return ledger


def test_gpfl_ledger_json_gives_the_caps_what_is_left_and_the_spend_of_the_file(
    path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Prepare: the device's policy file and a node-config key over it, as gpfl supernode
    # takes them.
    spend = charged_ledger(path).spent()
    policy = tmp_path / "policy.toml"
    policy.write_text('cap-d-privacy = 2.0\ncap-epsilon = 4.0\ndelta = 1e-6\n'
                      f'ledger-path = "{path}"\n')

    # Execute
    status, out, err = gpfl_ledger([str(path), "--policy", str(policy), "--node-config",
                                    "cap-epsilon=3", "--json"], capsys)

    # Assert: the caps are the device's (the node config over the file), at its δ; the spend
    # is the ledger's own composition; what is left is cap - spent.
    assert status == 0, err
    report = json.loads(out)
    assert report["delta"] == 1e-6
    assert (report["releases"], report["declines"]) == (spend.releases, spend.declines)
    assert report["spent"]["d-privacy"] == spend.d_privacy
    assert report["spent"]["epsilon"] == spend.epsilon
    assert report["caps"]["given"] is True and "policy file" in report["caps"]["source"]
    assert report["caps"]["policy-ledger"] == str(path)
    budgets = {b["cap-setting"]: b for b in report["budgets"]}
    assert {k: (b["cap"], b["spent"], b["remaining"]) for k, b in budgets.items()} == {
        "cap-d-privacy": (2.0, spend.d_privacy, 2.0 - spend.d_privacy),
        "cap-epsilon": (3.0, spend.epsilon, 3.0 - spend.epsilon),
        "cap-record-epsilon": (10.0, 0.0, 10.0),
    }
    assert budgets["cap-epsilon"]["unit"] == "epsilon at delta=1e-06"
    # The federations the entries were tagged with, in the order of their first release.
    feds = [(f["federation"], f["releases"], f["first-round"], f["last-round"])
            for f in report["federations"]]
    assert feds == [("fed-a", 2, 1, 2), ("fed-b", 1, 4, 4), (None, 1, None, None)]
    assert report["federations"][0]["spent"]["d-privacy"] == pytest.approx(0.8)
    assert [e["federation"] for e in report["entries"]] == ["fed-a", "fed-a", "fed-b", None]


def test_gpfl_ledger_text_names_the_caps_and_says_when_they_are_the_defaults(
    path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Prepare
    spend = charged_ledger(path).spent()

    # Execute
    status, out, _ = gpfl_ledger([str(path)], capsys)

    # Assert: the table and totals as before, then the caps (the declared defaults: the file
    # holds none), each with what is left, then the federations.
    assert status == 0
    lines = out.splitlines()
    assert lines[0] == f"privacy ledger {path}"
    assert "releases: 4   declines: 1" in lines
    assert any(line.startswith("caps from device defaults: the ledger file holds no caps")
               for line in lines)
    assert f"cap-d-privacy = 50 d-privacy (Laplace releases, the sum of epsilon*r): spent " \
           f"{spend.d_privacy:.6g}, {50 - spend.d_privacy:.6g} left" in lines
    assert any(line.startswith("cap-epsilon = 10 epsilon at delta=1e-06 ") for line in lines)
    assert any(line.startswith("cap-record-epsilon = 10 ") for line in lines)
    assert "federations the releases were made for: 3" in lines
    assert any(line.startswith("  fed-a: 2 releases, rounds 1-2, ") for line in lines)


def test_gpfl_ledger_stops_on_a_corrupt_ledger_or_bad_settings(
    path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Prepare
    path.parent.mkdir(parents=True)
    path.write_text("{not json")

    # Execute / Assert: a clear error and status 1, in text and in JSON; nothing printed.
    for extra in ([], ["--json"]):
        status, out, err = gpfl_ledger([str(path), *extra], capsys)
        assert (status, out) == (1, "")
        assert err.startswith("gpfl: ") and str(path) in err and "will not be reset" in err
    charged_ledger(tmp_path / "good.json")
    status, out, err = gpfl_ledger([str(tmp_path / "good.json"), "--node-config",
                                    "cap-epsilon=-3"], capsys)
    assert (status, out) == (1, "") and "cap-epsilon" in err
    status, _, err = gpfl_ledger([str(tmp_path / "good.json"), "--policy",
                                  str(tmp_path / "missing.toml")], capsys)
    assert status == 1 and "does not exist" in err
