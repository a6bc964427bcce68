"""The ledger's store: corrupt, missing and rolled-back files are refused, never reset;
crashes and concurrent writers lose nothing; temporaries of killed writers are removed."""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import pytest

from client.ledger_view import format_ledger
from mechanisms import (
    BudgetExceededError,
    LedgerCorruptError,
    LedgerMissingError,
    LedgerRollbackError,
    PrivacyLedger,
)
from mechanisms.ledger_store import temporary_path_of
from tests.test_ledger import (
    DELTA,
    kill_after_one_line,
    lock_of,
    metric,
    path,
    run_python,
    snapshot,
)

__all__ = ["path"]  # the fixture, shared with tests/test_ledger.py


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


def stale_temporary(path: Path) -> Path:
    """Leave the temporary a writer killed mid-write leaves: a partial ledger."""
    temporary = temporary_path_of(path)
    temporary.write_bytes(b'{"partial')
    return temporary


def test_the_temporary_is_one_fixed_name_beside_the_ledger(path: Path) -> None:
    assert temporary_path_of(path) == path.parent / ".client-0.json.tmp"


def test_a_stale_temporary_of_this_ledger_is_replaced_by_the_next_write(path: Path) -> None:
    # Prepare: the temporary a killed writer left, and files that must survive: another
    # ledger's temporaries (including one whose name starts with this ledger's) and
    # look-alikes.
    ledger = PrivacyLedger(path, delta=DELTA)
    ledger.charge(metric(1.0), cap=None)
    folder = path.parent
    stale = stale_temporary(path)
    keep = [folder / name for name in (
        ".client-0.json.x.tmp",                # the temporary of ledger "client-0.json.x"
        ".client-0.json.abcdefgh.tmp",         # a random name (not this store's form)
        "client-0.json.tmp",                   # no leading dot
        ".client-0.json.tmp.keep",             # another suffix
        ".client-1.json.tmp",                  # another ledger
        "notes.txt",
    )]
    for p in keep:
        p.write_bytes(b"keep me")

    # Execute
    ledger.record_decline()

    # Assert
    assert not stale.exists()
    assert all(p.read_bytes() == b"keep me" for p in keep)
    assert ledger.spent().declines == 1


def test_the_temporary_is_never_written_through_a_link(path: Path, tmp_path: Path) -> None:
    # Prepare: a symbolic link where the temporary goes, pointing at a file elsewhere.
    ledger = PrivacyLedger(path, delta=DELTA)
    ledger.charge(metric(1.0), cap=None)
    target = tmp_path / "elsewhere.txt"
    target.write_bytes(b"untouched")
    temporary_path_of(path).symlink_to(target)

    # Execute
    ledger.charge(metric(1.0), cap=None)

    # Assert: the link was removed as a stale temporary, its target left alone.
    assert target.read_bytes() == b"untouched"
    assert not os.path.lexists(temporary_path_of(path))
    assert ledger.spent().releases == 2


def test_stale_temporaries_are_left_when_a_charge_is_refused(path: Path) -> None:
    # A refusal changes nothing on disk, not even clutter.
    ledger = PrivacyLedger(path, delta=DELTA)
    ledger.charge(metric(1.0), cap=None)
    name = stale_temporary(path)
    with pytest.raises(BudgetExceededError):
        ledger.charge(metric(1.0), cap=1.0)
    assert name.exists()


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
    temporaries = sorted(path.parent.glob(f".{path.name}*.tmp"))
    assert temporaries == [temporary_path_of(path)]
    other = path.parent / ".client-1.json.tmp"  # another ledger's: never touched
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
    name = stale_temporary(path)
    path.unlink()
    before = snapshot(path.parent)

    # Execute / Assert: a refused ledger is left exactly as it is, clutter included.
    with pytest.raises(LedgerMissingError):
        PrivacyLedger(path, delta=DELTA)
    assert name.exists()
    assert snapshot(path.parent) == before


def test_opening_without_a_lock_file_creates_none_to_clean_up(path: Path) -> None:
    # Prepare: a temporary but no lock file (a writer always makes the lock file
    # first, so someone removed it); opening must not create one just to clean up.
    path.parent.mkdir(parents=True)
    name = stale_temporary(path)

    # Execute
    ledger = PrivacyLedger(path, delta=DELTA)

    # Assert: left for the next write, which takes the lock and replaces it.
    assert name.exists() and not lock_of(path).exists()
    ledger.record_decline()
    assert not name.exists()
