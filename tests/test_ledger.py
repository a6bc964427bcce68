"""The client's privacy ledger: composition, caps, persistence, crash safety, locking, rollback."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest

from mechanisms import (
    BudgetExceededError,
    GaussianReleaseEvent,
    LedgerCorruptError,
    LedgerMissingError,
    LedgerRollbackError,
    MetricPrivacyEvent,
    NeighbourhoodEvent,
    NonPrivateEvent,
    PrivacyEvent,
    PrivacyLedger,
    SignReleaseEvent,
    Spend,
    calibrate_gaussian_noise_multiplier,
    gaussian_epsilon,
)
from server.ledger_view import format_ledger

ROOT = Path(__file__).resolve().parents[1]
DELTA = 1e-5


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
    with pytest.raises(BudgetExceededError, match=r"RDP ε at δ=1e-05"):
        ledger.charge(SignReleaseEvent(z), cap=1.0)


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
    with pytest.raises(BudgetExceededError, match=r"RDP ε at δ=1e-05") as info:
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
    assert entry["event"] == {"kind": "metric", "layers": [[0.25, 2.0]]}
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
                              "noise_multiplier": 5.0}
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
                               "releases": 0, "declines": 2}


def test_ledger_delta_is_validated(path: Path) -> None:
    with pytest.raises(ValueError, match=r"delta must be in the open interval \(0, 1\), got d"):
        PrivacyLedger(path, delta=0)


# -- corrupt files are never reset -------------------------------------------------------------


GOOD = {"format": "gpfl-privacy-ledger", "version": 1, "delta": DELTA, "declines": 0,
        "events": [{"time": "t", "round": None, "event": {"kind": "none"}}]}


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"", "not valid JSON"),
        (json.dumps(GOOD).encode()[:-20], "not valid JSON"),  # truncated
        (b"\x00\xff garbage", "not valid JSON"),
        (b"[1, 2]", "not an object"),
        (json.dumps({**GOOD, "version": 2}).encode(), "format version is 2"),
        (json.dumps({**GOOD, "format": "other"}).encode(), "format is 'other'"),
        (json.dumps({k: v for k, v in GOOD.items() if k != "declines"}).encode(),
         "missing field 'declines'"),
        (json.dumps({**GOOD, "events": {}}).encode(), "events must be a list"),
        (json.dumps({**GOOD, "events": [{"time": "t", "round": None,
                                         "event": {"kind": "bogus"}}]}).encode(),
         "unknown privacy event kind 'bogus'"),
        (json.dumps({**GOOD, "events": [{"time": "t", "round": None, "event": {
            "kind": "gaussian", "noise_multiplier": 1.0}}]}).replace("1.0", "NaN").encode(),
         "non-finite number NaN"),
        (json.dumps({**GOOD, "declines": -1}).encode(), "declines must be a non-negative"),
    ],
)
def test_an_unreadable_ledger_raises_and_is_left_alone(
    path: Path, content: bytes, reason: str
) -> None:
    # Prepare
    path.parent.mkdir(parents=True)
    path.write_bytes(content)

    # Execute / Assert: opening, charging and formatting all refuse; nothing is reset.
    with pytest.raises(LedgerCorruptError, match=reason) as info:
        PrivacyLedger(path, delta=DELTA)
    assert str(path) in str(info.value)
    assert "will not be reset" in str(info.value)
    assert info.value.path == path
    with pytest.raises(LedgerCorruptError):
        format_ledger(path)
    assert path.read_bytes() == content


def test_corruption_after_opening_is_caught_before_a_charge(path: Path) -> None:
    # Prepare
    ledger = PrivacyLedger(path, delta=DELTA)
    ledger.charge(metric(1.0), cap=None)
    path.write_text('{"format": "gpfl-privacy-ledger", "ver')

    # Execute / Assert
    with pytest.raises(LedgerCorruptError):
        ledger.charge(metric(1.0), cap=None)
    with pytest.raises(LedgerCorruptError):
        ledger.record_decline()
    assert path.read_text() == '{"format": "gpfl-privacy-ledger", "ver'


# -- crashes and concurrent writers --------------------------------------------------------------


def test_a_charge_survives_the_process_being_killed_before_it_sends(path: Path) -> None:
    # Prepare: a child charges, says so, then hangs where it would send the release.
    child = run_python(f"""
        import sys, time
        from mechanisms import MetricPrivacyEvent, PrivacyLedger
        ledger = PrivacyLedger({str(path)!r}, delta={DELTA})
        ledger.charge(MetricPrivacyEvent(((0.2, 2.0),)), cap=10.0, round=5)
        print("charged", flush=True)
        time.sleep(60)
        """)

    # Execute
    line, stderr = kill_after_one_line(child)

    # Assert
    assert line.strip() == "charged", stderr
    assert child.returncode == -signal.SIGKILL
    ledger = PrivacyLedger(path, delta=DELTA)
    assert ledger.spent().d_privacy == pytest.approx(0.4)
    assert [e.round for e in ledger.entries()] == [5]


def test_two_writers_charging_concurrently_lose_nothing(path: Path) -> None:
    # Prepare: two processes, 50 charges each, released together once both are ready.
    go = path.parent.parent / "go"
    code = f"""
        import os, time
        from mechanisms import MetricPrivacyEvent, PrivacyLedger
        ledger = PrivacyLedger({str(path)!r}, delta={DELTA})
        print("ready", flush=True)
        while not os.path.exists({str(go)!r}):
            time.sleep(0.001)
        for i in range(50):
            ledger.charge(MetricPrivacyEvent(((0.5, 0.25),)), cap=None, round=i)
        ledger.record_decline()
        """
    writers = [run_python(code) for _ in range(2)]
    for w in writers:
        assert w.stdout is not None and w.stdout.readline().strip() == "ready"

    # Execute
    go.touch()
    errors = [w.communicate(timeout=120)[1] for w in writers]

    # Assert
    assert [w.returncode for w in writers] == [0, 0], errors
    spend = PrivacyLedger(path, delta=DELTA).spent()
    assert spend.releases == 100
    assert spend.declines == 2
    assert spend.d_privacy == pytest.approx(100 * 0.125)
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]


# -- the human-readable dump -------------------------------------------------------------------


def test_format_ledger_lists_events_and_totals(path: Path) -> None:
    # Prepare
    ledger = PrivacyLedger(path, delta=DELTA)
    ledger.charge(metric(0.4), cap=None, round=1)
    ledger.charge(MetricPrivacyEvent(((0.1, 1.0), (0.2, 1.0))), cap=None, round=2)
    ledger.charge(GaussianReleaseEvent(8.0), cap=None)
    ledger.charge(NeighbourhoodEvent((7850,), 5.0), cap=None, round=4)
    ledger.charge(NeighbourhoodEvent((784, 10), 4.0), cap=None, round=5)
    ledger.record_decline()

    # Execute
    text = format_ledger(path)

    # Assert
    lines = text.splitlines()
    assert lines[0] == f"privacy ledger {path}"
    assert lines[1].split() == ["#", "time", "(UTC)", "round", "kind", "parameters", "d-cost"]
    assert lines[2].split()[2:] == ["1", "metric", "ε=0.2,", "r=2", "0.4"]
    assert lines[3].split()[2:] == ["2", "metric", "2", "layers", "0.3"]
    assert lines[4].split()[2:] == ["-", "gaussian", "z=8", "-"]
    assert lines[5].split()[2:] == ["4", "neighbourhood", "n=7850,", "ν=5", "1570"]
    assert lines[6].split()[2:] == ["5", "neighbourhood", "2", "layers,", "ν=4", "198.5"]
    assert "releases: 5   declines: 1" in text
    assert "d-privacy (Σ ε·r): 1769.2" in text
    assert f"ε = {gaussian_epsilon(8.0, 1, DELTA):.6g} at δ = 1e-05" in text


def test_format_ledger_without_a_file_says_so(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no privacy ledger at"):
        format_ledger(tmp_path / "missing.json")
    with pytest.raises(FileNotFoundError, match="not a file"):
        format_ledger(tmp_path)


# -- a ledger that disappears or goes back in time is refused ---------------------------------


def test_a_deleted_ledger_is_refused_not_restarted_at_zero(path: Path) -> None:
    # Prepare
    ledger = PrivacyLedger(path, delta=DELTA)
    ledger.charge(metric(1.0), cap=None)
    ledger.record_decline()
    path.unlink()
    before = snapshot(path.parent)

    # Execute / Assert: opening, reading, charging, declining and formatting all refuse.
    with pytest.raises(LedgerMissingError) as info:
        PrivacyLedger(path, delta=DELTA)
    for call in (ledger.spent, ledger.entries, ledger.record_decline,
                 lambda: ledger.charge(metric(0.1), cap=None), lambda: format_ledger(path)):
        with pytest.raises(LedgerMissingError):
            call()
    message = str(info.value)
    assert str(path) in message and str(lock_of(path)) in message
    assert "refused rather than restarted at zero" in message
    assert "remove both" in message
    assert (info.value.recorded, info.value.path) == (2, path)
    assert isinstance(info.value, LedgerCorruptError)
    assert snapshot(path.parent) == before  # nothing written, nothing created


def test_an_older_copy_put_back_is_refused_as_a_rollback(path: Path) -> None:
    # Prepare: a copy taken after one release; two more releases; the copy put back.
    ledger = PrivacyLedger(path, delta=DELTA)
    ledger.charge(metric(1.0), cap=None)
    backup = path.with_name("backup.json")
    shutil.copy2(path, backup)
    ledger.charge(metric(1.0), cap=None)
    ledger.record_decline()
    shutil.copy2(backup, path)
    before = snapshot(path.parent)

    # Execute / Assert
    with pytest.raises(LedgerRollbackError) as info:
        PrivacyLedger(path, delta=DELTA)
    for call in (ledger.spent, ledger.record_decline,
                 lambda: ledger.charge(metric(0.1), cap=None), lambda: format_ledger(path)):
        with pytest.raises(LedgerRollbackError):
            call()
    assert (info.value.found, info.value.recorded) == (1, 3)
    assert "older copy" in str(info.value) and "remove both" in str(info.value)
    assert isinstance(info.value, LedgerCorruptError)
    assert snapshot(path.parent) == before


def test_a_rollback_written_by_hand_without_a_generation_field_is_refused(path: Path) -> None:
    # Prepare: an older file in the version-1 form without "generation": its generation
    # is its events + declines (1), below the 2 writes the lock file records.
    ledger = PrivacyLedger(path, delta=DELTA)
    ledger.charge(metric(1.0), cap=None)
    old = json.loads(path.read_text())
    del old["generation"]
    ledger.charge(metric(1.0), cap=None)
    path.write_text(json.dumps(old))

    # Execute / Assert
    with pytest.raises(LedgerRollbackError, match="generation 1"):
        PrivacyLedger(path, delta=DELTA)


def test_removing_both_files_starts_a_new_budget_deliberately(path: Path) -> None:
    # Prepare
    PrivacyLedger(path, delta=DELTA).charge(metric(1.0), cap=None)
    path.unlink()
    lock_of(path).unlink()

    # Execute
    spend = PrivacyLedger(path, delta=DELTA).charge(metric(0.25), cap=None)

    # Assert
    assert (spend.releases, spend.d_privacy) == (1, 0.25)


def test_a_new_ledger_is_empty_and_opening_it_creates_nothing(path: Path) -> None:
    # Execute
    ledger = PrivacyLedger(path, delta=DELTA)
    ledger.entries()

    # Assert: neither the ledger, the lock file nor the folder appear before a write.
    assert ledger.spent().releases == 0
    assert not path.parent.exists()


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


def test_a_ledger_ahead_of_its_lock_file_is_accepted(path: Path) -> None:
    # Prepare: as after a crash between the ledger's replace and the lock file's update
    # (or after the lock file was deleted): the record lags the ledger.
    ledger = PrivacyLedger(path, delta=DELTA)
    ledger.charge(metric(1.0), cap=None)
    ledger.charge(metric(1.0), cap=None)
    lock_of(path).write_text("gpfl-privacy-ledger generation 00000000000000000001\n")

    # Execute / Assert
    assert PrivacyLedger(path, delta=DELTA).spent().releases == 2
    ledger.charge(metric(1.0), cap=None)
    assert lock_of(path).read_text().endswith("00000000000000000003\n")


@pytest.mark.parametrize(
    "content",
    [b"garbage", b"gpfl-privacy-ledger generation 12\n",
     b"gpfl-privacy-ledger generation 00000000000000000001\nextra"],
)
def test_an_unreadable_lock_file_is_refused(path: Path, content: bytes) -> None:
    # Prepare
    ledger = PrivacyLedger(path, delta=DELTA)
    ledger.charge(metric(1.0), cap=None)
    lock_of(path).write_bytes(content)
    before = snapshot(path.parent)

    # Execute / Assert: we cannot tell how many writes were made, so nothing is trusted.
    with pytest.raises(LedgerCorruptError, match="not a generation record"):
        PrivacyLedger(path, delta=DELTA)
    with pytest.raises(LedgerCorruptError, match="not a generation record"):
        ledger.charge(metric(1.0), cap=None)
    assert snapshot(path.parent) == before


@pytest.mark.parametrize(
    ("generation", "pattern"),
    [(0, "generation must be an integer >= the 1 events and declines, got 0"),
     (True, "got True"), ("1", "got '1'"), (-1, "got -1")],
)
def test_a_file_with_a_bad_generation_is_corrupt(
    path: Path, generation: object, pattern: str
) -> None:
    # Prepare
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({**GOOD, "generation": generation}))

    # Execute / Assert
    with pytest.raises(LedgerCorruptError, match=pattern):
        PrivacyLedger(path, delta=DELTA)


# -- temporaries of killed writers --------------------------------------------------------------


def test_stale_temporaries_of_this_ledger_are_removed_by_the_next_write(path: Path) -> None:
    # Prepare: temporaries as a writer killed mid-write leaves them (same mkstemp call),
    # and files that must survive: another ledger's temporaries (including one whose name
    # starts with this ledger's), and look-alikes that mkstemp would not have made.
    ledger = PrivacyLedger(path, delta=DELTA)
    ledger.charge(metric(1.0), cap=None)
    folder = path.parent
    stale = []
    for _ in range(2):
        fd, name = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.", suffix=".tmp")
        os.write(fd, b'{"partial')
        os.close(fd)
        stale.append(Path(name))
    keep = [folder / name for name in (
        ".client-0.json.x.abcdefgh.tmp",       # temporaries of ledger "client-0.json.x"
        ".client-0.json.x.tmp",                # not mkstemp's form
        ".client-0.json.abcdefghi.tmp",        # 9 random characters, not 8
        "client-0.json.abcdefgh.tmp",          # no leading dot
        ".client-0.json.abcdefgh.tmp.keep",    # another suffix
        ".client-1.json.abcdefgh.tmp",         # another ledger
        "notes.txt",
    )]
    for p in keep:
        p.write_bytes(b"keep me")
    fd, other = tempfile.mkstemp(dir=folder, prefix=".client-0.json.x.", suffix=".tmp")
    os.close(fd)
    keep.append(Path(other))

    # Execute
    ledger.record_decline()

    # Assert
    assert not any(p.exists() for p in stale)
    assert all(p.exists() for p in keep)
    assert ledger.spent().declines == 1


def test_stale_temporaries_are_left_when_a_charge_is_refused(path: Path) -> None:
    # A refusal changes nothing on disk, not even clutter.
    ledger = PrivacyLedger(path, delta=DELTA)
    ledger.charge(metric(1.0), cap=None)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    with pytest.raises(BudgetExceededError):
        ledger.charge(metric(1.0), cap=1.0)
    assert Path(name).exists()


def test_opening_the_ledger_removes_temporaries_a_killed_writer_left(path: Path) -> None:
    # Prepare: a child charges once, then is killed inside its second write, after the
    # temporary is written and before it replaces the ledger.
    child = run_python(f"""
        import os, time
        from mechanisms import MetricPrivacyEvent, PrivacyLedger
        ledger = PrivacyLedger({str(path)!r}, delta={DELTA})
        ledger.charge(MetricPrivacyEvent(((0.5, 2.0),)), cap=None)
        def hang(src, dst):
            print("written", flush=True)
            time.sleep(60)
        os.replace = hang
        ledger.charge(MetricPrivacyEvent(((0.5, 2.0),)), cap=None)
        """)
    line, stderr = kill_after_one_line(child)
    assert line.strip() == "written", stderr
    temporaries = sorted(path.parent.glob(f".{path.name}.*.tmp"))
    assert len(temporaries) == 1
    other = path.parent / ".client-1.json.abcdefgh.tmp"  # another ledger's: never touched
    other.write_bytes(b"keep me")
    ledger_before, lock_before = path.read_bytes(), lock_of(path).read_bytes()

    # Execute
    ledger = PrivacyLedger(path, delta=DELTA)

    # Assert: the temporary is gone, the unfinished charge was never made, nothing else moved.
    assert not temporaries[0].exists()
    assert other.exists()
    assert ledger.spent().releases == 1
    assert (path.read_bytes(), lock_of(path).read_bytes()) == (ledger_before, lock_before)


def test_opening_a_refused_ledger_leaves_its_temporaries(path: Path) -> None:
    # Prepare: a stale temporary beside a ledger that has since been deleted.
    PrivacyLedger(path, delta=DELTA).charge(metric(1.0), cap=None)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    path.unlink()
    before = snapshot(path.parent)

    # Execute / Assert: a refused ledger is left exactly as it is, clutter included.
    with pytest.raises(LedgerMissingError):
        PrivacyLedger(path, delta=DELTA)
    assert Path(name).exists()
    assert snapshot(path.parent) == before


def test_opening_without_a_lock_file_creates_none_to_clean_up(path: Path) -> None:
    # Prepare: a temporary but no lock file (a writer always makes the lock file
    # first, so someone removed it); opening must not create one just to clean up.
    path.parent.mkdir(parents=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)

    # Execute
    ledger = PrivacyLedger(path, delta=DELTA)

    # Assert: left for the next write, which takes the lock and removes it.
    assert Path(name).exists() and not lock_of(path).exists()
    ledger.record_decline()
    assert not Path(name).exists()


# -- ledgers written by earlier code ----------------------------------------------------------

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
# What that code printed for it (format_ledger, without the first line naming the path).
TABLE_BEFORE_THE_SPLIT = [
    '#  time (UTC)                 round  kind           parameters     d-cost',
    '1  2026-11-23T18:24:09+00:00  1      neighbourhood  n=7850, ν=5    1570',
    '2  2026-11-23T18:24:09+00:00  2      metric         2 layers       0.35',
    '3  2026-11-23T18:24:09+00:00  3      gaussian       z=3.25         -',
    '4  2026-11-23T18:24:13+00:00  4      sign           z=3.25         -',
    '5  2026-11-23T18:24:13+00:00  -      gaussian       z=8            -',
    '6  2026-11-23T18:24:13+00:00  6      neighbourhood  2 layers, ν=4  198.5',
    '7  2026-11-23T18:24:13+00:00  7      none           no noise       -',
    '',
    'releases: 7   declines: 2',
    'd-privacy (Σ ε·r): 1768.85',
    'Gaussian/sign (RDP): ε = 1.9404 at δ = 1e-05',
    'releases without noise (no guarantee): 1',
]


def test_a_ledger_written_before_the_split_loads_with_the_same_spend(path: Path) -> None:
    # Prepare
    path.parent.mkdir(parents=True)
    path.write_text(LEDGER_BEFORE_THE_SPLIT)
    lock_of(path).write_bytes(LOCK_BEFORE_THE_SPLIT)

    # Execute
    ledger = PrivacyLedger(path, delta=DELTA)
    spend = ledger.spent()

    # Assert: the figures that code reported, to the bit; the entries as charged.
    assert spend == Spend(d_privacy=1768.85, epsilon=1.9404043377646252, delta=1e-05,
                          releases=7, declines=2)
    assert [e.round for e in ledger.entries()] == [1, 2, 3, 4, None, 6, 7]
    assert [e.event for e in ledger.entries()] == [
        NeighbourhoodEvent((7850,), 5.0), MetricPrivacyEvent(((0.1, 2.0), (0.3, 0.5))),
        GaussianReleaseEvent(3.25), SignReleaseEvent(3.25), GaussianReleaseEvent(8.0),
        NeighbourhoodEvent((784, 10), 4.0), NonPrivateEvent(),
    ]
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

    # Assert: the same document but for the two counters a decline moves.
    expected = LEDGER_BEFORE_THE_SPLIT.replace('"generation": 9', '"generation": 10').replace(
        '"declines": 2', '"declines": 3')
    assert path.read_text() == expected
    assert lock_of(path).read_bytes() == LOCK_BEFORE_THE_SPLIT.replace(b"09\n", b"10\n")
