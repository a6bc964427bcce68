"""What ``flwr run`` is handed: a copy of the app without the folders ``.gitignore`` ignores.

Where gpfl is installed without its source (``pip install gpfl`` or ``pip install .``), there is
no app folder to copy: :func:`installed_app` writes one from the installed packages and the
settings' declarations, so that ``gpfl launch`` runs the code that is installed.

``flwr run <dir>`` builds the run's FAB from *every* file under ``dir`` (Flower's
``collect_files`` walks the whole tree and resolves each path) and only then drops what its
include rules and the app's ``.gitignore`` leave out. A checkout with its ``.venv`` and
``runs/`` inside holds ~54,000 files: the FAB took 4.09 s of CPU to build from it, and 0.10 s
to copy plus 0.07 s to build from the copy (1,070 files;
``python -m experiments.benchmarks.bench_fab``), in every launch and every test that launches.
:func:`stage_app` copies the app without the folders and files its ``.gitignore`` ignores,
matched by Flower's own pattern code; Flower would have dropped each of them, so the FAB built
from the copy is the same, byte for byte (tests/test_server_fab.py), and so is its hash, which
devices may pin.
"""

from __future__ import annotations

import importlib
import os
import shutil
import tomllib
import warnings
from importlib import metadata
from pathlib import Path
from typing import Any

import tomli_w
from flwr.cli.utils import build_pathspec, load_gitignore_patterns

from settings.render import pyproject_block

__all__ = ["APP_PACKAGES", "APP_TABLE", "installed_app", "stage_app"]

#: The packages a FAB carries: the ServerApp's and the ClientApp's code.
APP_PACKAGES = ("settings", "mechanisms", "strategies", "client", "server", "tasks")

#: pyproject.toml's ``[tool.flwr.app]`` but its config (rendered from the declarations); a test
#: holds it against the checkout's pyproject.toml.
APP_TABLE: dict[str, Any] = {
    "publisher": "gpfl",
    "fab-include": [f"{package}/**/*.py" for package in APP_PACKAGES],
    "components": {"serverapp": "server.app:app", "clientapp": "client.app:app"},
}


def stage_app(app_dir: Path, into: Path) -> Path:
    """Copy ``app_dir`` into ``into/<its name>`` without what its ``.gitignore`` ignores.

    Parameters
    ----------
    app_dir : Path
        The Flower app (``pyproject.toml`` at its top).
    into : Path
        A folder of the launch's own; the copy keeps the app folder's name (Flower checks it).

    Returns
    -------
    Path
        The copy, or ``app_dir`` itself when it has no ``.gitignore`` (nothing to leave out).
    """
    app_dir = app_dir.resolve()
    gitignore = app_dir / ".gitignore"
    if not gitignore.is_file():
        return app_dir
    with warnings.catch_warnings():
        # Flower's pattern code still asks pathspec for its deprecated "gitwildmatch" name;
        # the patterns match as they do in flwr's own build, which is the point here.
        warnings.simplefilter("ignore", DeprecationWarning)
        ignored = build_pathspec(load_gitignore_patterns(gitignore))
    dest = into / app_dir.name
    # A fresh copy each time: a file deleted or newly ignored since must not linger.
    shutil.rmtree(dest, ignore_errors=True)
    for dirpath, dirnames, filenames in os.walk(app_dir, followlinks=False):
        here = Path(dirpath)
        rel = here.relative_to(app_dir)
        # Pruned in place, so os.walk never enters them; "dir/" is how a folder matches.
        dirnames[:] = [d for d in dirnames
                       if not ignored.match_file(f"{(rel / d).as_posix()}/")]
        for name in filenames:
            source = here / name
            relative = (rel / name).as_posix()
            if source.is_symlink() or ignored.match_file(relative):
                continue  # Flower skips links and ignored files too
            target = dest / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
    return dest


def installed_app(into: Path) -> Path:
    """Write the Flower app of this installation into ``into/gpfl``; return that folder.

    The app's packages (:data:`APP_PACKAGES`, their ``.py`` files) are copied from where they
    are installed, and its ``pyproject.toml`` is written from the installed distribution's
    metadata, :data:`APP_TABLE` and the run-config defaults of :mod:`settings.declarations`:
    the FAB ``flwr run`` builds from it runs the installed code.

    Parameters
    ----------
    into : Path
        A folder of the launch's own (the run directory): the app is written afresh each time.
    """
    dest = into / "gpfl"
    shutil.rmtree(dest, ignore_errors=True)
    for package in APP_PACKAGES:
        source = Path(importlib.import_module(package).__file__ or "").parent
        for path in sorted(source.rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            target = dest / package / path.relative_to(source)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
    info = metadata.metadata("gpfl")
    config = tomllib.loads(pyproject_block())["tool"]["flwr"]["app"]["config"]
    project = {"name": "gpfl", "version": info["Version"], "description": info["Summary"],
               "license": info["License-Expression"] or info["License"] or ""}
    document = {"project": project, "tool": {"flwr": {"app": {**APP_TABLE, "config": config}}}}
    (dest / "pyproject.toml").write_text(tomli_w.dumps(document), encoding="utf-8")
    return dest
