"""The app copy ``flwr run`` is handed builds the same FAB as the app folder itself."""

from __future__ import annotations

import os
import shutil
import tomllib
from pathlib import Path

import pytest
from flwr.cli.build import build_fab_from_disk

from deploy.fab import installed_app, stage_app
from deploy.federation import project_root

# Flower's FAB build asks pathspec for its deprecated "gitwildmatch" patterns.
pytestmark = pytest.mark.filterwarnings("ignore:GitWildMatchPattern:DeprecationWarning")


def make_app(root: Path) -> Path:
    """A Flower app folder: gpfl's pyproject.toml and .gitignore, a few modules, and clutter."""
    app = root / "main"
    for name in ("pyproject.toml", ".gitignore"):
        (app / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(project_root() / name, app / name)
    files = {
        "server/app.py": "APP = 1\n",
        "client/app.py": "APP = 2\n",
        "strategies/deep/nested.py": "X = 3\n",
        "settings/__init__.py": "",
        "mechanisms/__init__.py": "",
        "tasks/__init__.py": "",
        "docs/notes.md": "# notes\n",
        # What .gitignore ignores: a virtual environment, run folders, caches.
        ".venv/lib/python3.11/site-packages/torch/__init__.py": "TORCH = 1\n",
        "runs/2026/summary.json": "{}\n",
        "server/__pycache__/app.cpython-311.pyc": "compiled",
        "client/stale.pyc": "compiled",
        "gpfl.egg-info/PKG-INFO": "Name: gpfl\n",
    }
    for relative, text in files.items():
        path = app / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    os.symlink(app / "server/app.py", app / "client/link.py")  # Flower skips links
    return app


def test_the_copy_builds_the_same_fab_byte_for_byte(tmp_path: Path) -> None:
    # Prepare
    app = make_app(tmp_path / "src")

    # Execute
    staged = stage_app(app, tmp_path / "stage")

    # Assert: same folder name, same FAB bytes (so the same hash a device may pin), and the
    # ignored folders and files were never copied.
    assert staged.name == app.name and staged != app
    fab = build_fab_from_disk(app)
    assert build_fab_from_disk(staged) == fab
    copied = sorted(p.relative_to(staged).as_posix() for p in staged.rglob("*") if p.is_file())
    assert copied == [".gitignore", "client/app.py", "docs/notes.md", "mechanisms/__init__.py",
                      "pyproject.toml", "server/app.py", "settings/__init__.py",
                      "strategies/deep/nested.py", "tasks/__init__.py"]


def test_an_edit_in_the_app_changes_the_fab_of_the_copy(tmp_path: Path) -> None:
    # The copy is made per run, into the same place: a module edited since is what the next
    # run carries, and a module deleted since is gone from it.
    app = make_app(tmp_path / "src")
    first = build_fab_from_disk(stage_app(app, tmp_path / "stage"))
    (app / "server/app.py").write_text("APP = 10\n")
    (app / "docs/notes.md").unlink()
    staged = stage_app(app, tmp_path / "stage")
    assert build_fab_from_disk(staged) != first
    assert build_fab_from_disk(staged) == build_fab_from_disk(app)
    assert not (staged / "docs/notes.md").exists()


def test_an_app_without_gitignore_is_handed_over_as_it_is(tmp_path: Path) -> None:
    app = make_app(tmp_path / "src")
    (app / ".gitignore").unlink()
    assert stage_app(app, tmp_path / "stage") == app.resolve()
    assert not (tmp_path / "stage").exists()


def test_the_benchmark_builds_both_ways_and_finds_them_equal(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from experiments.benchmarks import bench_fab

    bench_fab.main(["--app", str(make_app(tmp_path / "src"))])
    out = capsys.readouterr().out
    assert "| the app folder | 14 |" in out and "| gpfl's copy (copy + build) | 9 |" in out
    assert "same FAB: True" in out


def test_an_installed_gpfl_writes_the_checkouts_app_table_and_code(tmp_path: Path) -> None:
    # Prepare: the checkout's own [tool.flwr.app] and the files its FAB carries.
    checkout = tomllib.loads((project_root() / "pyproject.toml").read_text())

    # Execute
    app = installed_app(tmp_path)
    written = tomllib.loads((app / "pyproject.toml").read_text())

    # Assert: the same app table, config included, the same version, and every .py file of the
    # FAB's packages byte for byte (here the installed packages are the checkout's).
    assert written["tool"]["flwr"]["app"] == checkout["tool"]["flwr"]["app"]
    assert written["project"]["version"] == checkout["project"]["version"]
    for package in ("settings", "mechanisms", "strategies", "client", "server", "tasks"):
        ours = {p.relative_to(project_root()) for p in (project_root() / package).rglob("*.py")}
        theirs = {p.relative_to(app) for p in (app / package).rglob("*.py")}
        assert ours == theirs
        for rel in ours:
            assert (app / rel).read_bytes() == (project_root() / rel).read_bytes()
    # ... and Flower builds a FAB from it (its validation of the pyproject included).
    assert build_fab_from_disk(app)
