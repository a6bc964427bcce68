"""``pip install .`` without extras, in a fresh virtual environment, runs ``gpfl launch``.

The environment is new (``python -m venv``); torch is installed first, pinned as ``gpfl.sh``
pins it (``GPFL_TORCH``), so that pip takes the build this machine is configured for rather than
the newest one; then a copy of the checkout's tracked files is installed without extras and
without ``-e``. The launch runs the synthetic task over a real SuperLink and SuperNodes from that
environment alone: its Flower app is written from the installed packages (``deploy.fab``). The
extras' modules are absent there, and asking for one of their features names the extra.
About a minute and a half: pip's cache holds every wheel after the first run on a machine.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from settings.extras import EXTRAS

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.timeout(900)


def run(argv: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` with this machine's pip settings but none of this test run's environment."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV") and not k.startswith("PYTEST")}
    env["MPLCONFIGDIR"] = str(cwd / "mpl")  # matplotlib's font cache, away from the home folder
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL, start_new_session=True)


def checkout_copy(into: Path) -> Path:
    """Copy the files git tracks or would track (what a clean clone has) to ``into``."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, into / name)
    return into


@pytest.fixture(scope="module")
def core_env(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new virtual environment with ``pip install .`` of this checkout, no extras."""
    if shutil.which("git") is None:
        pytest.skip("needs git to list the checkout's files")
    base = tmp_path_factory.mktemp("core-install")
    venv = base / "venv"
    steps = [
        [sys.executable, "-m", "venv", str(venv)],
        [str(venv / "bin/python"), "-m", "pip", "install", "-q",
         os.environ.get("GPFL_TORCH", "torch==2.13.0")],
        [str(venv / "bin/python"), "-m", "pip", "install", "-q",
         str(checkout_copy(base / "src"))],
    ]
    for argv in steps:
        done = run(argv, base)
        assert done.returncode == 0, (argv, done.stderr[-3000:])
    return venv


def test_the_core_install_has_none_of_the_extras(core_env: Path) -> None:
    modules = sorted({m for extra in EXTRAS.values() for m in extra.modules})
    probe = ("import importlib.util, json, sys; "
             "print(json.dumps([m for m in sys.argv[1:] if importlib.util.find_spec(m)]))")
    done = run([str(core_env / "bin/python"), "-c", probe, *modules], core_env.parent)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []


def test_the_core_install_runs_a_launch_of_the_synthetic_task(core_env: Path) -> None:
    # Execute: from a folder that is no checkout, so nothing but the environment is used.
    work = core_env.parent / "work"
    work.mkdir()
    done = run([str(core_env / "bin/gpfl"), "launch", "--supernodes", "3", "--run-config",
                "num-rounds=2", "--out", str(work / "run")], work, timeout=300)

    # Assert: both rounds, the closing lines, and the app written from the installed packages.
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((work / "run" / "summary.json").read_text())
    assert summary["status"] == "complete" and summary["rounds_completed"] == 2
    assert "[gpfl] round 2/2 val_loss" in done.stdout
    assert (work / "run" / "app" / "gpfl" / "pyproject.toml").is_file()
    assert (work / "run" / "models" / "models.json").is_file()


def test_a_feature_of_an_extra_names_it_and_starts_nothing(core_env: Path) -> None:
    work = core_env.parent / "work-extra"
    work.mkdir()
    done = run([str(core_env / "bin/gpfl"), "launch", "--supernodes", "2", "--engine",
                "simulation", "--out", str(work / "run")], work, timeout=120)
    assert done.returncode != 0
    assert ("--engine simulation needs gpfl[simulation] (Flower's Simulation Engine): pip "
            "install \"gpfl[simulation]\" (not installed here: ray)") in done.stderr
    assert not (work / "run" / "logs").exists()
