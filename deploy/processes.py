"""Start and stop the OS processes of a local federation, leaving nothing behind.

Flower's SuperLink and SuperNodes start ``flower-superexec`` children in new
sessions (detached), and those start ``flwr-serverapp`` / ``flwr-clientapp``
processes: stopping a parent's process group does not reach them, and once a
parent is gone its children are re-parented away from us. So the launcher
marks itself a *child subreaper* (Linux): orphans of anything it started are
re-parented to it, and every process it is responsible for stays among its
descendants until it is reaped. Processes are only ever ended by PID (never by
name patterns), and only descendants of this process. A launcher killed outright
(SIGKILL) runs none of this: the watchdog (:mod:`deploy.watchdog`) stops its
descendants then.
"""

from __future__ import annotations

import ctypes
import importlib
import logging
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import psutil

from client.process_tree import child_env, terminate_tree
from deploy.watchdog import Watchdog

logger = logging.getLogger(__name__)

_PR_SET_CHILD_SUBREAPER = 36
#: Seconds a ServerApp may be gone while its run's stream goes on before the launcher ends it.
SERVERAPP_GRACE_S = 8.0


def become_subreaper() -> bool:
    """Make orphaned descendants re-parent to this process (Linux only)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):  # pragma: no cover - non-glibc systems
        return False


class ProcessSet:
    """The processes one launch started; :meth:`stop_all` ends them and theirs."""

    def __init__(self) -> None:
        self.procs: dict[str, subprocess.Popen[Any]] = {}
        self._logs: dict[str, IO[bytes]] = {}
        # Each process's log and where its own lines start in it: a log is appended to (a
        # resumed run, a restarted SuperLink), and an earlier process's lines are not its own.
        self._log_starts: dict[str, tuple[Path, int]] = {}
        self.subreaper = become_subreaper()
        # Started before the children are listed: the watchdog is not one to stop here.
        self.watchdog = Watchdog()
        # Children this process already had are not ours to stop.
        self._preexisting = {c.pid for c in psutil.Process().children()}

    def start(
        self, name: str, argv: Sequence[str], log_path: Path,
        env: dict[str, str] | None = None, cwd: Path | None = None,
    ) -> subprocess.Popen[bytes]:
        """Start ``argv`` in its own session, output to ``log_path``."""
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(log_path, "ab")  # closed in stop / stop_all
        self._logs[name] = log
        self._log_starts[name] = (log_path, log.tell())
        proc = subprocess.Popen(
            list(argv), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=env or child_env(), cwd=cwd, start_new_session=True,
        )
        self.procs[name] = proc
        self.watchdog.tell()
        logger.debug("started %s (pid %d): %s", name, proc.pid, " ".join(argv))
        return proc

    def own_log(self, name: str) -> str:
        """Return what the process last started as ``name`` wrote to its log ("" if none)."""
        path, start = self._log_starts.get(name, (None, 0))
        if path is None:
            return ""
        try:
            with open(path, "rb") as log:
                log.seek(start)
                return log.read().decode(errors="replace")
        except OSError:
            return ""

    def stop(self, name: str, timeout: float = 5.0) -> None:
        """Stop one started process and every descendant of it."""
        proc = self.procs.pop(name, None)
        if proc is not None:
            terminate_tree([proc.pid], timeout)
            _reap(proc)
        log = self._logs.pop(name, None)
        if log is not None:
            log.close()

    def stop_all(self, timeout: float = 5.0) -> list[int]:
        """Stop everything started here (and anything it started); return leftover PIDs."""
        started = list(self.procs.values())
        self.procs.clear()
        terminate_tree([p.pid for p in started], timeout)
        for proc in started:
            _reap(proc)
        # Orphans re-parented to us while the tree was going down.
        orphans = [
            c.pid for c in psutil.Process().children() if c.pid not in self._preexisting
        ] if self.subreaper else []
        leftovers = terminate_tree(orphans, timeout)
        for log in self._logs.values():
            log.close()
        self._logs.clear()
        self.watchdog.close()
        return leftovers


def descendant_running(command: str) -> bool:
    """Whether a descendant of this process (orphans re-parented to it included) runs ``command``.

    The launcher asks it of ``flwr-serverapp`` when the SuperLink has died: a ServerApp that
    still runs can carry on with a SuperLink started again on its database.
    """
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.status() != psutil.STATUS_ZOMBIE and any(
                    Path(part).name == command for part in proc.cmdline()[:2]):
                return True
        except psutil.Error:
            continue
    return False


#: Name of the launcher's own ServerApp process (:mod:`deploy.serverapp_runner`) in a ProcessSet.
SERVERAPP = "serverapp"
#: Exit status of a ServerApp whose task token the SuperLink refused (deploy.serverapp_runner's).
EXIT_REFUSED = 75
#: How a refused ServerApp's log line starts (deploy.serverapp_runner's ``REFUSED_MARK``).
REFUSED_MARK = "gpfl-serverapp: the SuperLink refused this ServerApp"
#: The line of the ServerApp's log once it holds its run (deploy.serverapp_runner).
CLAIMED_MARK = "claimed the task of run"


#: Flower's line when one of its processes ends with one of its own exit codes (``flwr_exit``,
#: for the codes of an error, 100 and up): the process's exit status is then only 1, and the
#: code that says what failed (700: the Simulation Engine's run raised, e.g. Ray did not start)
#: is in this line of its log.
FLOWER_EXIT_LINE = re.compile(r"Exit Code: (\d+)")
#: Where Flower keeps its exit codes' table, by release (the first one importable is read).
FLOWER_EXIT_MODULES = ("flwr.supercore.exit.exit_code", "flwr.common.exit.exit_code")


@dataclass(frozen=True)
class FlowerExit:
    """One of Flower's own exit codes, with its name and meaning from Flower's table.

    Attributes
    ----------
    code : int
        The code Flower logged (``Exit Code: 700``).
    name : str or None
        Its name in Flower's ``ExitCode`` (``SIMULATION_EXCEPTION``); None for a code the
        installed Flower does not list.
    meaning : str or None
        The first sentence of Flower's help for it.
    """

    code: int
    name: str | None = None
    meaning: str | None = None

    def __str__(self) -> str:
        name = f" {self.name}" if self.name else ""
        meaning = f' "{self.meaning}"' if self.meaning else ""
        return f"Flower's exit code {self.code}{name}{meaning}"


def flower_exit(code: int) -> FlowerExit:
    """Return Flower's exit code ``code`` with its name and meaning, as the installed Flower says.

    The table is read from Flower, not copied: a Flower release that adds or renames a code is
    reported in its own words. Without it (a Flower that moved the table), only the number.
    """
    for module_name in FLOWER_EXIT_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        names = {value: key for key, value in vars(module.ExitCode).items()
                 if key.isupper() and isinstance(value, int)}
        help_text = " ".join(str(getattr(module, "EXIT_CODE_HELP", {}).get(code, "")).split())
        meaning = help_text.split(". ")[0].rstrip(".") + "." if help_text else None
        return FlowerExit(code, names.get(code), meaning)
    return FlowerExit(code)


def flower_exit_in(log_text: str) -> FlowerExit | None:
    """Return the last of Flower's exit codes a process's log gives, or None."""
    codes = FLOWER_EXIT_LINE.findall(log_text)
    return flower_exit(int(codes[-1])) if codes else None


def exit_detail(returncode: int | None, log_text: str) -> str:
    """Say how a process ended, for a parenthesis: its exit status and Flower's code, if any.

    ``code 1; Flower's exit code 700 SIMULATION_EXCEPTION "..."`` where the process's log gives
    Flower's code, ``code -9`` where it does not, ``""`` when neither is known (``returncode``
    None: the process is not reaped yet).
    """
    found = flower_exit_in(log_text)
    parts = ([] if returncode is None else [f"code {returncode}"]) + (
        [] if found is None else [str(found)])
    return "; ".join(parts)


def exit_report(what: str, returncode: int | None, log_text: str, when: str = "") -> str:
    """Say ``<what> exited<when> (<how>)``: the process, and how it ended (:func:`exit_detail`)."""
    detail = exit_detail(returncode, log_text)
    return f"{what} exited{when}" + (f" ({detail})" if detail else "")


#: Seconds from the submission to the ServerApp's first line before a run is given up
#: (``gpfl launch``, ``gpfl submit``): minutes on a loaded host (importing Flower, torch and
#: scikit-learn took ~5 s idle), far below the hour-long default ``--timeout``.
STARTUP_TIMEOUT_S = 600.0


def stall_seconds(round_timeout: float) -> float:
    """Seconds without a round after which a running run is given up.

    A round waits up to one ``round-timeout`` for its quorum and one for its replies, then
    validates on the server: three deadlines and two minutes is more than any round that
    progresses takes.
    """
    return 3 * round_timeout + 120.0


@dataclass
class Liveness:
    """When a run that shows no progress is given up.

    Parameters
    ----------
    startup_s : float
        Seconds from the submission to the ServerApp's first ``[gpfl]`` line.
    stall_s : float
        Seconds from that line, or from the last round's line, to the next round's line.
    log : Path or None
        The ServerApp's log (:mod:`deploy.serverapp_runner`), read to say how far it got.
    """

    startup_s: float
    stall_s: float
    log: Path | None = None


class ProgressClock:
    """Whether a run's log shows progress within its :class:`Liveness` deadlines.

    The run's log is read line by line (:meth:`saw`): the ServerApp's first ``tag`` line says it
    started; each ``tag round`` line is a round finished. :meth:`overdue` says, in one line with
    what to try, when the first came later than ``startup_s`` or the next round later than
    ``stall_s``. ``gpfl launch`` and ``gpfl submit`` (the compose deployment) share it.
    Thread-safe: lines arrive on one thread, the deadline is checked on another.
    """

    def __init__(self, liveness: Liveness, tag: str = "[gpfl]") -> None:
        self.liveness, self.tag = liveness, tag
        #: Whether the ServerApp wrote its first ``tag`` line; how many round lines since.
        self.started = False
        self.rounds_seen = 0
        #: The round number of the last round line ("" before the first).
        self.last_round = ""
        self._last_progress = time.monotonic()
        self._lock = threading.Lock()

    def restart(self) -> None:
        """Start the clock again (the watch begins, or the run's stream starts again)."""
        with self._lock:
            self._last_progress = time.monotonic()

    def saw(self, line: str) -> None:
        """Note a line of the run's log: the ServerApp's first ``tag`` line, or a round's."""
        tag = self.tag
        with self._lock:
            if tag in line and not self.started:
                self.started = True
                self._last_progress = time.monotonic()
            elif f"{tag} round " in line:
                self.rounds_seen += 1
                self.last_round = line.split(f"{tag} round ", 1)[1].split("/", 1)[0]
                self._last_progress = time.monotonic()

    def overdue(self, claimed: bool | None = None, where: str = "the logs") -> str | None:
        """Return why the run is given up (a deadline passed without progress), or None.

        ``claimed``: whether the ServerApp had claimed the run (None: not known here);
        ``where``: where the user looks next.
        """
        with self._lock:
            quiet = time.monotonic() - self._last_progress
            started, last = self.started, self.last_round
        if not started and quiet >= self.liveness.startup_s:
            state = ("" if claimed is None else
                     f"it had {'' if claimed else 'not yet '}claimed the run; ")
            return (f"the ServerApp did not start within {self.liveness.startup_s:.0f} s of the "
                    f"submission ({state}no {self.tag} line): the host is too slow or "
                    "overloaded; try again when it is less busy, with fewer --supernodes, or "
                    "with a longer --startup-timeout")
        if started and quiet >= self.liveness.stall_s:
            after = f"round {last}'s line" if last else "the ServerApp started"
            return (f"no round finished within {self.liveness.stall_s:.0f} s after {after} "
                    "(3 round deadlines and 2 minutes): the ServerApp or its devices stopped "
                    f"making progress; see {where}")
        return None


class ProcessWatch:
    """Watch a launch's processes while its run streams; say when one exits or the run stalls.

    A SuperNode that exits is reported once and the run goes on without it (the ServerApp's
    round deadline and quorum decide whether it can). When the SuperLink exits, the log stream
    (``flwr run``) is ended at once: with ``superlink_restarts`` the launcher starts the SuperLink
    again on its database and follows the run anew, otherwise the run cannot go on and the launch
    reports it incomplete. A ServerApp that has been seen and is gone for
    :data:`SERVERAPP_GRACE_S` while the stream still runs ends the stream too: Flower itself
    marks the run failed only when the ServerApp's heartbeat expires, about a minute later. A
    ServerApp the SuperLink refused (:data:`EXIT_REFUSED`) ends it at once. With ``liveness``,
    a run without its first ``[gpfl]`` line, or without a round, within its deadlines is ended
    too; :attr:`stop_reason` then says why, in one line with what to try.
    """

    def __init__(self, procs: ProcessSet, echo: Callable[[str], None],
                 interval: float = 1.0, superlink_restarts: bool = False,
                 liveness: Liveness | None = None) -> None:
        self.procs, self.echo, self.interval = procs, echo, interval
        self.superlink_restarts = superlink_restarts
        self.liveness = liveness
        self.died: dict[str, int] = {}
        self.serverapp_gone = False
        #: Whether the SuperLink refused the ServerApp's task token (it ended with that).
        self.refused = False
        #: Why the launcher ended the run's stream (refused, not started, stalled), if it did.
        self.stop_reason: str | None = None
        #: The run's progress, read from its log (None: no deadlines).
        self.clock = ProgressClock(liveness) if liveness is not None else None
        self._serverapp_seen = False
        self._serverapp_missing_since: float | None = None
        self._seen: set[int] = set()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ProcessWatch:
        if self.clock is not None:
            self.clock.restart()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._done.wait(self.interval):
            self.check()

    def forget(self, name: str) -> int | None:
        """Drop ``name`` from :attr:`died` (it was started again); return its exit code."""
        return self.died.pop(name, None)

    def saw(self, line: str) -> None:
        """Note a line of the run's log (:meth:`ProgressClock.saw`)."""
        if self.clock is not None:
            self.clock.saw(line)

    def resumed(self) -> None:
        """Restart the clock: the run's stream starts again (a SuperLink restarted)."""
        if self.clock is not None:
            self.clock.restart()

    def check(self) -> None:
        """Report every watched process that has exited since the last check."""
        for name, proc in list(self.procs.procs.items()):
            code = proc.poll()
            if name in ("flwr-run", SERVERAPP) or code is None or proc.pid in self._seen:
                continue
            self._seen.add(proc.pid)
            self.died[name] = code
            how = exit_detail(code, self.procs.own_log(name))
            if name == "superlink":
                self.echo(f"gpfl: the SuperLink exited ({how}); " + (
                    "starting it again on its database" if self.superlink_restarts
                    else "the run cannot go on"))
                self._end_stream()
            else:
                self.echo(f"gpfl: {name} exited ({how}); the run goes on without it")
        self._check_serverapp()
        self._check_progress()

    def _end_stream(self) -> None:
        run = self.procs.procs.get("flwr-run")
        if run is not None and run.poll() is None:
            run.terminate()

    def _stream_running(self) -> bool:
        run = self.procs.procs.get("flwr-run")
        return (run is not None and run.poll() is None and not self.serverapp_gone
                and self.stop_reason is None and "superlink" not in self.died)

    def serverapp_running(self) -> bool:
        """Whether the run's ServerApp process runs (the launcher's own, or Flower's)."""
        own = self.procs.procs.get(SERVERAPP)
        if own is not None:
            return own.poll() is None
        return descendant_running("flwr-serverapp")

    def serverapp_exit(self, when: str = "") -> str:
        """Say ``the ServerApp exited<when> (<how>)`` of the run's process (:func:`exit_report`)."""
        own = self.procs.procs.get(SERVERAPP)
        return exit_report("the ServerApp", None if own is None else own.poll(),
                           self.procs.own_log(SERVERAPP), when)

    def _check_serverapp(self) -> None:
        if not self._stream_running():
            return
        own = self.procs.procs.get(SERVERAPP)
        log = self.liveness.log if self.liveness else None
        if own is not None and own.poll() is not None and (
                own.returncode == EXIT_REFUSED or _log_has(log, "401 Unauthorized")):
            self.stop_reason = refused_reason(self.liveness.log if self.liveness else None)
            self.serverapp_gone = self.refused = True
            self._end_stream()
            return
        if self.serverapp_running():
            self._serverapp_seen, self._serverapp_missing_since = True, None
            return
        if not self._serverapp_seen:
            return
        now = time.monotonic()
        if self._serverapp_missing_since is None:
            self._serverapp_missing_since = now
        elif now - self._serverapp_missing_since >= SERVERAPP_GRACE_S:
            # A ServerApp that finished normally ends the stream within a second or two.
            self.serverapp_gone = True
            self.echo(f"gpfl: {self.serverapp_exit(' before the run ended')}; the run cannot "
                      "go on")
            self._end_stream()

    def after_stream(self, finished: bool) -> None:
        """Say why the run's stream ended, when the ServerApp did not end it (``finished``).

        Flower's SuperLink ends a run whose ServerApp sent no heartbeat within its window (60 s;
        30 s before the first) while that process may still be alive, held up: the stream then
        ends first. The ServerApp is given :data:`SERVERAPP_GRACE_S` to end on its own (a
        refused one ends with :data:`EXIT_REFUSED` at once).
        """
        own = self.procs.procs.get(SERVERAPP)
        if finished or self.stop_reason is not None or own is None or "superlink" in self.died:
            return
        try:
            own.wait(timeout=SERVERAPP_GRACE_S)
        except subprocess.TimeoutExpired:
            self.stop_reason = (
                "the SuperLink ended the run: its ServerApp sent no heartbeat within Flower's "
                "window (30 s after its claim, 60 s between two) and is still held up (an "
                "overloaded host, or a stopped process); try again when the host is less "
                "busy, or with fewer --supernodes")
            return
        log = self.liveness.log if self.liveness else None
        if own.returncode == EXIT_REFUSED or _log_has(log, "401 Unauthorized"):
            self.stop_reason = refused_reason(log)
            self.refused = True

    def _check_progress(self) -> None:
        if self.clock is None or self.liveness is None or not self._stream_running():
            return
        reason = self.clock.overdue(claimed=_log_has(self.liveness.log, CLAIMED_MARK))
        if reason is not None:
            self.stop_reason = reason
            self._end_stream()


def _log_has(log: Path | None, text: str) -> bool:
    try:
        return log is not None and text in log.read_text(errors="replace")
    except OSError:
        return False


def refused_reason(log: Path | None) -> str:
    """Say in one line why a ServerApp the SuperLink refused ended, and what to try."""
    detail = ""
    if log is not None:
        try:
            lines = [ln for ln in log.read_text(errors="replace").splitlines()
                     if REFUSED_MARK in ln]
        except OSError:
            lines = []
        if lines:
            detail = lines[-1].split(REFUSED_MARK, 1)[1].lstrip(": ")
    return ("the SuperLink refused the ServerApp (Runtime task-token authentication failed: "
            + (detail or "its token expired, no heartbeat having reached the SuperLink within "
               "Flower's window") + "); try again when the host is less busy, or with fewer "
            "--supernodes")


def _reap(proc: subprocess.Popen[Any]) -> None:
    """Collect the exit status of a process that was signalled, and close its pipes."""
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL was already sent
        logger.error("pid %d did not exit", proc.pid)
    for stream in (proc.stdout, proc.stderr, proc.stdin):
        if stream is not None:
            stream.close()
