"""The federation dies with its launcher, however the launcher dies.

``gpfl launch`` stops everything it started when it ends normally, on an error or on Ctrl-C
(:class:`deploy.processes.ProcessSet`). A launcher killed with SIGKILL (``kill -9``, the OOM
killer, a cancelled CI job) runs no code at all: its SuperLink, SuperNodes, ``flwr run`` and the
processes they started (SuperExec, ServerApp, ClientApps, in sessions of their own) would go on,
and an orphaned ServerApp would even finish the run.

So every launch starts this watchdog first, in a session of its own: a small process that reads
the launcher's descendants, one ``<pid> <start time>`` a line, from a pipe the launcher holds
open (:class:`Watchdog` sends each new one as it appears). The pipe closes when the launcher
exits, whatever the cause (the kernel closes a dead process's files); the watchdog then stops
every process it was told of that is still the same process (same start time: a PID reused
since is left alone), and their descendants: SIGTERM, then SIGKILL after a grace period. After a
normal stop there is nothing left for it to do.

Run as ``python -m deploy.watchdog``; it needs no argument.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from typing import IO

import psutil

__all__ = ["Watchdog", "main"]

#: Seconds between two looks at the launcher's descendants.
SCAN_S = 0.5
#: Seconds the watched processes get to stop after SIGTERM, before SIGKILL.
GRACE_S = 5.0


def _same(pid: int, started: float) -> psutil.Process | None:
    """Return the process ``pid`` if it is still the one that started at ``started``."""
    try:
        proc = psutil.Process(pid)
        return proc if abs(proc.create_time() - started) < 0.01 else None
    except psutil.Error:
        return None


def stop_watched(watched: dict[int, float], grace: float = GRACE_S) -> list[int]:
    """Stop the processes of ``watched`` (pid: start time) still alive, and their descendants.

    Returns the PIDs signalled.
    """
    procs: dict[int, psutil.Process] = {}
    for pid, started in watched.items():
        proc = _same(pid, started)
        if proc is None:
            continue
        procs[pid] = proc
        try:
            procs.update({child.pid: child for child in proc.children(recursive=True)})
        except psutil.Error:
            pass
    alive = [p for p in procs.values() if p.pid != os.getpid()]
    for proc in alive:
        try:
            proc.terminate()
        except psutil.Error:
            pass
    _, survivors = psutil.wait_procs(alive, timeout=grace)
    for proc in survivors:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(survivors, timeout=grace)
    return sorted(procs)


def main(stream: IO[str] | None = None) -> int:
    """Read ``<pid> <start time>`` lines until the launcher is gone; then stop those processes."""
    watched: dict[int, float] = {}
    for line in stream or sys.stdin:
        try:
            pid, started = line.split()
            watched[int(pid)] = float(started)
        except ValueError:
            continue
    stop_watched(watched)
    return 0


class Watchdog:
    """The launcher's side: start the watchdog, and tell it of every descendant as it appears.

    Descendants are found by walking this process's children (the launcher is a child subreaper,
    :func:`deploy.processes.become_subreaper`, so orphans stay among them), every
    :data:`SCAN_S` seconds, in a daemon thread.
    """

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "deploy.watchdog"], stdin=subprocess.PIPE, text=True,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            # From the repository or an installed gpfl alike.
            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        )
        self._told: set[int] = {self.proc.pid}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="gpfl-watchdog", daemon=True)
        self._thread.start()

    def tell(self) -> None:
        """Send the descendants not yet sent (call it right after starting a process, too)."""
        with self._lock:
            if self.proc.stdin is None or self.proc.stdin.closed:
                return
            try:
                children = psutil.Process().children(recursive=True)
            except psutil.Error:
                return
            lines = []
            for child in children:
                if child.pid in self._told:
                    continue
                try:
                    lines.append(f"{child.pid} {child.create_time()!r}\n")
                except psutil.Error:
                    continue
                self._told.add(child.pid)
            if lines:
                try:
                    self.proc.stdin.write("".join(lines))
                    self.proc.stdin.flush()
                except (BrokenPipeError, ValueError, OSError):
                    pass

    def _run(self) -> None:
        while not self._stop.wait(SCAN_S):
            self.tell()

    def close(self) -> None:
        """After a normal stop: let the watchdog go (it finds nothing left, and exits)."""
        self._stop.set()
        with self._lock:
            if self.proc.stdin is not None and not self.proc.stdin.closed:
                try:
                    self.proc.stdin.close()
                except OSError:
                    pass
        try:
            self.proc.wait(timeout=GRACE_S * 2 + 5)
        except subprocess.TimeoutExpired:  # pragma: no cover - it exits at once normally
            self.proc.kill()
            self.proc.wait()


if __name__ == "__main__":
    sys.exit(main())
