"""``python -m experiments all --jobs N``: several experiments at once, one process each.

A federation of the direct engine keeps about one core busy, so on a 2-core machine two
experiments side by side finish sooner than one after the other. Each experiment runs as its own
``python -m experiments NAME`` process (its own folder, the shared cache), in the order of
``all``, with two exceptions:

* an experiment in :data:`ALONE` measures time (rounds per minute, memory) and runs before the
  others, with nothing beside it;
* an experiment in :data:`AFTER` waits for the one whose federations it reuses (``leakage``
  reads those of ``accuracy-vs-nu`` from the cache), so that no federation runs twice.

Every process is started in its own session and, on an error or Ctrl-C, stopped with every
process it started (SIGTERM, then SIGKILL after :data:`GRACE_S`), so nothing is left running.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Sequence

from client.process_tree import terminate_tree

__all__ = ["AFTER", "ALONE", "run_jobs"]

#: Experiments that measure time: each runs with no other experiment beside it.
ALONE = ("scale",)
#: Experiment -> the experiment whose federations it reuses (it starts after that one ends).
AFTER = {"leakage": "accuracy-vs-nu"}
#: Seconds a stopped experiment gets to end before it is killed.
GRACE_S = 10.0
#: Seconds between looks at the running experiments.
POLL_S = 0.5


def run_jobs(names: Sequence[str], command: Callable[[str], list[str]], jobs: int) -> list[str]:
    """Run the experiments ``names``, at most ``jobs`` at a time; return those that failed.

    ``command(name)`` is the argument list of one experiment's process.
    """
    if jobs < 1:
        raise ValueError(f"--jobs must be >= 1, got {jobs}")
    failed: list[str] = []
    alone = [n for n in names if n in ALONE]
    pending = [n for n in names if n not in ALONE]
    running: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for name in alone:
            proc = _start(command(name))
            running[name] = proc
            if proc.wait() != 0:
                failed.append(name)
            del running[name]
        while pending or running:
            for name in list(pending):
                if len(running) >= jobs:
                    break
                if AFTER.get(name) in pending or AFTER.get(name) in running:
                    continue
                running[name] = _start(command(name))
                pending.remove(name)
            time.sleep(POLL_S)
            for name, proc in list(running.items()):
                if proc.poll() is not None:
                    del running[name]
                    if proc.returncode != 0:
                        failed.append(name)
    finally:
        for proc in running.values():
            _stop(proc)
    return failed


def _start(argv: list[str]) -> subprocess.Popen[bytes]:
    # Its own session: the experiment and whatever it starts form one process group.
    return subprocess.Popen(argv, start_new_session=True)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop an experiment and every process it started: SIGTERM, then SIGKILL after `GRACE_S`.

    :func:`deploy.processes.terminate_tree` collects the whole tree before it signals, so a
    federation the experiment started in a session of its own is stopped with it.
    """
    terminate_tree([proc.pid], GRACE_S)
    proc.wait()


def experiment_command(name: str, options: Sequence[str]) -> list[str]:
    """Return the argument list that runs experiment ``name`` with ``options``."""
    return [sys.executable, "-m", "experiments", name, *options]
