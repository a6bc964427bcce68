"""docs/TASKS.md's tutorial, run as written: the skeleton, the edits, the plugin installed and run.

``gpfl new-task example-linear`` writes a skeleton; the tutorial's edits (its "replace ... with
..." pairs) applied to it must give ``examples/gpfl-task-example-linear``, whose files the
document shows in full; its commands (the ``bash`` block after the marker
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
from deploy.new_task import package_files
from tests.conftest import flower_processes

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "TASKS.md"
EXAMPLE = ROOT / "examples" / "gpfl-task-example-linear"


def tutorial_files() -> dict[str, str]:
    """The files the tutorial shows: a block right after a line naming ``examples/...``."""
    text = DOC.read_text()
    found = re.findall(r"`(examples/gpfl-task-example-linear/[^`]+)`:\n\n```[a-z]*\n(.*?)```", text,
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
    assert set(files) == {
        "examples/gpfl-task-example-linear/pyproject.toml",
        "examples/gpfl-task-example-linear/gpfl_task_example_linear/__init__.py"}
    for path, shown in files.items():
        assert (ROOT / path).read_text() == shown, f"docs/TASKS.md shows another {path}"


def tutorial_edits() -> list[tuple[str, str]]:
    """The tutorial's "replace ... with ..." pairs, in order."""
    return re.findall(r"replace\n\n```python\n(.*?)```\n\nwith\n\n```python\n(.*?)```",
                      DOC.read_text(), flags=re.S)


def test_new_task_and_the_tutorials_edits_give_the_example_package() -> None:
    # Prepare: the skeleton `gpfl new-task example-linear` writes.
    files = package_files("example-linear")
    edits = tutorial_edits()
    module = "gpfl_task_example_linear/__init__.py"

    # Execute: the tutorial's edits, each on exactly one place of the skeleton's task.
    text = files[module]
    for old, new in edits:
        assert text.count(old) == 1, f"the tutorial's edit does not fit the skeleton:\n{old}"
        text = text.replace(old, new)

    # Assert: the example package is the skeleton with the edits, file for file.
    assert edits, "docs/TASKS.md lost its edits"
    assert sorted(str(p.relative_to(EXAMPLE)) for p in EXAMPLE.rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts and ".egg-info" not in str(p)
                  ) == sorted(files)
    for relative, expected in {**files, module: text}.items():
        assert (EXAMPLE / relative).read_text() == expected, relative


def installed() -> bool:
    done = subprocess.run([sys.executable, "-m", "pip", "show", "gpfl-task-example-linear"],
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
        # The task's own setting reached the run over real processes as given.
        first = json.loads((outs[0] / "summary.json").read_text())
        assert first["config"]["task-settings"] == "noise-level=0.2"
        assert json.loads((outs[1] / "launch.json").read_text())["engine"] == "simulation"
        assert flower_processes() == []
    finally:
        if not was_installed:
            subprocess.run([sys.executable, "-m", "pip", "uninstall", "-q", "-y",
                            "gpfl-task-example-linear"], check=False, capture_output=True)
