"""mechanisms.atomic_file.write_atomic: the one writer of files a reader must trust."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

import mechanisms.atomic_file as atomic_file
from mechanisms.atomic_file import write_atomic


def test_replaces_the_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "f.json"
    write_atomic(path, "one\n")
    write_atomic(path, b"two\n")
    assert path.read_bytes() == b"two\n"
    assert sorted(p.name for p in path.parent.iterdir()) == ["f.json"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    write_atomic(path, "three\n", mode=0o644)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644 and path.read_text() == "three\n"


def test_a_failed_write_keeps_the_old_file_and_removes_the_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "f"
    write_atomic(path, "old")

    def fail(*args: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(atomic_file.os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        write_atomic(path, "new")
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["f"]


def test_a_fixed_temporary_is_created_exclusively(tmp_path: Path) -> None:
    path, tmp = tmp_path / "ledger.json", tmp_path / ".ledger.json.tmp"
    tmp.write_text("left by a killed writer")
    with pytest.raises(FileExistsError):
        write_atomic(path, "x", temporary=tmp)
    assert not path.exists()
    tmp.unlink()
    write_atomic(path, "x", temporary=tmp)
    assert path.read_text() == "x" and not tmp.exists()


@pytest.mark.parametrize(("durable", "fsyncs"), [(True, 2), (False, 0)])
def test_durable_fsyncs_the_file_and_its_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, durable: bool, fsyncs: int
) -> None:
    synced: list[bool] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        synced.append(stat.S_ISDIR(os.fstat(fd).st_mode))
        real(fd)

    monkeypatch.setattr(atomic_file.os, "fsync", fsync)
    write_atomic(tmp_path / "f", "x", durable=durable)
    assert len(synced) == fsyncs
    if durable:
        assert synced == [False, True]  # the file, then the folder (after the rename)
