"""What ``flwr run`` is handed: a copy of the app without the folders ``.gitignore`` ignores.

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

import os
import shutil
import warnings
from pathlib import Path

from flwr.cli.utils import build_pathspec, load_gitignore_patterns

__all__ = ["stage_app"]


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
