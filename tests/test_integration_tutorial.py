"""docs/TASKS.md's tutorial, run as written: the example plugin installed and run twice.

The tutorial's files are shown in full in the document and must be the files of
``examples/gpfl-task-example``; its commands (the ``bash`` block after the marker
``<!-- tutorial-commands -->``) are run one by one from the repository's root, with one change:
their run directories (``runs/...``) go to a temporary folder. ``source .venv/bin/activate`` is
replaced by this environment's ``bin`` folder first on ``PATH`` (the same thing). The plugin is
uninstalled again afterwards unless it was installed before.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from client.process_tree import bin_dir, child_env
from tests.conftest import flower_processes

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "TASKS.md"
EXAMPLE = ROOT / "examples" / "gpfl-task-example"


def tutorial_files() -> dict[str, str]:
    """The files the tutorial shows: a block right after a line naming ``examples/...``."""
    text = DOC.read_text()
    found = re.findall(r"`(examples/gpfl-task-example/[^`]+)`:\n\n```[a-z]*\n(.*?)```", text,
                       flags=re.S)
    return dict(found)


def tutorial_commands() -> list[str]:
    text = DOC.read_text()
    block = re.search(r"<!-- tutorial-commands -->\n```bash\n(.*?)```", text, flags=re.S)
    assert block, "docs/TASKS.md lost its tutorial-commands block"
    lines = [line.split("  #")[0].strip() for line in block.group(1).splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def test_the_tutorial_shows_the_example_packages_files() -> None:
    files = tutorial_files()
    assert set(files) == {"examples/gpfl-task-example/pyproject.toml",
                          "examples/gpfl-task-example/gpfl_task_example/__init__.py"}
    for path, shown in files.items():
        assert (ROOT / path).read_text() == shown, f"docs/TASKS.md shows another {path}"


def installed() -> bool:
    done = subprocess.run([sys.executable, "-m", "pip", "show", "gpfl-task-example"],
                          capture_output=True, text=True, check=False)
    return done.returncode == 0


def test_the_tutorial_commands_finish_federations_with_the_plugin(tmp_path: Path) -> None:
    # Prepare
    commands = tutorial_commands()
    assert commands[0] == "source .venv/bin/activate"
    was_installed = installed()
    env = child_env({"PATH": f"{bin_dir()}:{child_env()['PATH']}"})
    outs = []
    try:
        # Execute
        for command in commands[1:]:
            argv = shlex.split(command)
            if "--out" in argv:
                i = argv.index("--out") + 1
                argv[i] = str(tmp_path / Path(argv[i]).name)
                outs.append(Path(argv[i]))
            done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True,
                                  timeout=420, check=False)
            assert done.returncode == 0, f"{command}\n{done.stdout[-3000:]}{done.stderr[-3000:]}"

        # Assert: one launch over real processes, one on the Simulation Engine, each finished
        # every round with the plugin's task.
        assert len(outs) == 2
        for out in outs:
            summary = json.loads((out / "summary.json").read_text())
            assert summary["status"] == "complete", out
            assert summary["task_info"]["name"] == "example-linear"
            assert summary["rounds_completed"] == summary["num_rounds"]
        assert json.loads((outs[1] / "launch.json").read_text())["engine"] == "simulation"
        assert flower_processes() == []
    finally:
        if not was_installed:
            subprocess.run([sys.executable, "-m", "pip", "uninstall", "-q", "-y",
                            "gpfl-task-example"], check=False, capture_output=True)
