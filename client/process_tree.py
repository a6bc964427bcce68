"""Start Flower's commands from this interpreter, and end a process tree by PID.

The device's runner (:mod:`client.supernode`) and the operator's launcher (:mod:`deploy`) both
start Flower's commands from this interpreter's ``bin`` folder and end what they started, the
whole tree, by PID (never by name patterns); they live here, below both, so that the device's
code does not import the operator's.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

import psutil

logger = logging.getLogger(__name__)


def bin_dir() -> Path:
    """Return the folder of this interpreter's console scripts (Flower's commands)."""
    return Path(sys.executable).parent


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for Flower processes: our ``bin`` first on PATH.

    The SuperLink and SuperNodes start ``flower-superexec`` by name.
    """
    env = dict(os.environ)
    env["PATH"] = f"{bin_dir()}{os.pathsep}{env.get('PATH', '')}"
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.update(extra or {})
    return env


def _tree(pids: Sequence[int]) -> list[psutil.Process]:
    seen: dict[int, psutil.Process] = {}
    roots: list[psutil.Process] = []
    for pid in pids:
        try:
            roots.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            continue
    for root in roots:
        seen.setdefault(root.pid, root)
        try:
            for child in root.children(recursive=True):
                seen.setdefault(child.pid, child)
        except psutil.NoSuchProcess:
            continue
    return list(seen.values())


def _signal_and_wait(
    procs: Sequence[psutil.Process], signum: int, timeout: float
) -> tuple[list[psutil.Process], list[psutil.Process]]:
    """Send ``signum`` to each process (gone ones skipped); wait; return (gone, alive)."""
    for p in procs:
        try:
            p.send_signal(signum)
        except psutil.NoSuchProcess:
            pass
    return psutil.wait_procs(procs, timeout=timeout)


def terminate_tree(pids: Sequence[int], timeout: float = 5.0) -> list[int]:
    """SIGTERM the processes and all their descendants, then SIGKILL stragglers.

    The whole tree is collected *before* anything is signalled, since a child
    whose parent dies is re-parented and could no longer be found from it.
    Returns the PIDs that still existed after SIGKILL (normally none).
    """
    procs = _tree(pids)
    if not procs:
        return []
    _, alive = _signal_and_wait(procs, signal.SIGTERM, timeout)
    # Descendants that appeared while terminating (a SuperNode restarting a
    # ClientApp) are caught by a second sweep below.
    _, alive = _signal_and_wait(alive, signal.SIGKILL, timeout)
    _, still = _signal_and_wait(_tree(pids), signal.SIGKILL, timeout)
    left = [p.pid for p in [*alive, *still] if p.is_running()]
    if left:
        logger.error("processes still running after SIGKILL: %s", left)
    return left
