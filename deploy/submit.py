"""``gpfl submit``: submit a run to a running SuperLink and follow it, within deadlines.

``flwr run APP SUPERLINK --stream`` prints a run's log until the run ends. A run that never
starts (its ServerApp refused by the SuperLink, or not started at all) or stops making progress
leaves it waiting, silent, for as long as anyone lets it. This is what the compose deployment's
one-shot ``submit`` service runs, and what anyone submitting to a SuperLink by hand can run:

* the run config is checked first (:class:`server.settings.RunSettings`), naming the setting and
  the value, before anything is sent;
* ``flwr run ... --stream`` is started and its lines are printed as they come, and read with the
  launcher's own :class:`deploy.processes.ProgressClock`: the ServerApp's first ``[gpfl]`` line
  within ``--startup-timeout`` of the submission, then a round within 3 round deadlines and 2
  minutes of the last;
* when a deadline passes, the run is stopped (``flwr stop``: the SuperLink ends it, and with it
  its ServerApp and what the devices were asked), the stream ends, and the last line says why;
* the ServerApp's last line (:data:`server.results.END_LINE`) gives the run's status, and the
  exit status is ``gpfl launch``'s for it (0 complete, 3 incomplete, 4 diverged, 5
  budget-exhausted, 6 devices-failed); a run that ends without that line exits 3, one stopped
  before its first round exits 1.
"""

from __future__ import annotations

import argparse
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

from client.process_tree import bin_dir, child_env, terminate_tree
from deploy.processes import STARTUP_TIMEOUT_S, Liveness, ProgressClock, stall_seconds
from settings.pairs import PairsError, read_settings

__all__ = ["DEFAULT_STARTUP_S", "add_arguments", "run", "run_config_of"]

#: Seconds from the submission to the ServerApp's first ``[gpfl]`` line (``gpfl launch``'s).
DEFAULT_STARTUP_S = STARTUP_TIMEOUT_S
#: Seconds ``flwr stop`` gets to reach the SuperLink.
STOP_TIMEOUT_S = 60.0
#: Exit status of a submission that ran no round (``gpfl launch``'s "launch failed").
EXIT_FAILED = 1


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add ``gpfl submit``'s arguments to a (sub)parser."""
    p.add_argument("app", help="the Flower app to run (a folder with its pyproject.toml)")
    p.add_argument("superlink", help="the SuperLink connection, as flwr run names it "
                                     "(a [superlink.NAME] in $FLWR_HOME/config.toml)")
    p.add_argument("flwr_args", nargs=argparse.REMAINDER, metavar="FLWR_RUN_ARGS",
                   help="passed to flwr run (--run-config ...), except --startup-timeout S: "
                        "seconds from the submission to the ServerApp's first line (default: "
                        f"{DEFAULT_STARTUP_S:g})")


def _pop_option(args: list[str], name: str) -> tuple[list[str], str | None]:
    """Remove ``name VALUE`` or ``name=VALUE`` from ``args``; return the rest and the value."""
    rest, value, i = [], None, 0
    while i < len(args):
        if args[i] == name and i + 1 < len(args):
            value, i = args[i + 1], i + 2
            continue
        if args[i].startswith(name + "="):
            value = args[i].split("=", 1)[1]
        else:
            rest.append(args[i])
        i += 1
    return rest, value


def run_config_of(flwr_args: Sequence[str]) -> dict[str, Any]:
    """Return the run-config overrides of ``flwr run``'s ``--run-config``/``-c`` arguments.

    Each is ``k=v ...`` pairs, or the path of a TOML file (:func:`settings.pairs.read_settings`);
    later ones win.
    """
    overrides: dict[str, Any] = {}
    args = list(flwr_args)
    for i, arg in enumerate(args):
        value = None
        if arg in ("--run-config", "-c") and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith("--run-config="):
            value = arg.split("=", 1)[1]
        if value is None:
            continue
        overrides.update(read_settings(value, "--run-config"))
    return overrides


class _Lines:
    """The lines of a process's output, read on a thread, handed over with a timeout."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self._thread.start()

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def next(self, timeout: float) -> str | None:
        """Return the next line, ``""`` if none came within ``timeout``, None at the end."""
        try:
            return self._queue.get(timeout=timeout)
        except queue.Empty:
            return ""


def _stop_run(run_id: int, superlink: str, echo: Callable[[str], None]) -> None:
    """Ask the SuperLink to stop the run (``flwr stop``); say if it could not."""
    try:
        done = subprocess.run([str(bin_dir() / "flwr"), "stop", str(run_id), superlink],
                              capture_output=True, text=True, env=child_env(),
                              timeout=STOP_TIMEOUT_S, check=False, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        echo(f"flwr stop {run_id} did not answer within {STOP_TIMEOUT_S:.0f} s")
        return
    if done.returncode != 0:
        tail = (done.stdout + done.stderr).strip().splitlines()[-1:] or [""]
        echo(f"flwr stop {run_id} failed (exit code {done.returncode}): {tail[0]}")


def run(args: argparse.Namespace, echo: Callable[[str], None] | None = None,
        out: Callable[[str], None] | None = None) -> int:
    """Submit the run and follow it; return the exit status (module notes).

    ``echo`` takes gpfl's own lines (stderr by default), ``out`` the run's log (stdout).
    """
    def say(text: str) -> None:
        print(f"gpfl submit: {text}", file=sys.stderr, flush=True)

    def show(line: str) -> None:
        print(line, flush=True)

    echo, out = echo or say, out or show
    # Here, not at the top: `gpfl --help` and the other commands do not pay for Flower's import.
    from deploy.superlink_state import STARTED
    from server.results import END_LINE, EXIT_INCOMPLETE, ROUND_TAG, STATUSES, exit_status
    from server.settings import RunSettings
    from settings import SettingError

    flwr_args, startup = _pop_option(list(args.flwr_args), "--startup-timeout")
    try:
        startup_s = DEFAULT_STARTUP_S if startup is None else float(startup)
        if not startup_s > 0:
            raise ValueError
    except ValueError:
        echo(f"failed: --startup-timeout must be a number of seconds > 0, got {startup!r}")
        return EXIT_FAILED
    try:
        settings = RunSettings.from_run_config(run_config_of(flwr_args))
    except (SettingError, PairsError) as err:
        echo(f"failed, nothing submitted: {err}")
        return EXIT_FAILED
    clock = ProgressClock(Liveness(startup_s, stall_seconds(settings.round_timeout)), ROUND_TAG)
    argv = [str(bin_dir() / "flwr"), "run", args.app, args.superlink, "--stream", *flwr_args]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, text=True, bufsize=1,
                            env=child_env({"NO_COLOR": "1", "COLUMNS": "200"}),
                            start_new_session=True)
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    stopped: list[int] = []

    def on_signal(signum: int, frame: Any) -> None:
        stopped.append(signum)

    for s in previous:
        signal.signal(s, on_signal)
    run_id: int | None = None
    status: str | None = None
    reason: str | None = None
    try:
        lines = _Lines(proc)
        clock.restart()
        while not stopped:
            line = lines.next(timeout=1.0)
            if line is None:
                break
            if line:
                out(line)
                clock.saw(line)
                found = STARTED.search(line)
                if found and run_id is None:
                    run_id = int(found.group(1))
                if END_LINE in line:
                    status = line.split(END_LINE, 1)[1].strip().split(":", 1)[0]
            reason = clock.overdue(where="the SuperLink's and the SuperNodes' logs")
            if reason is not None:
                break
        if stopped and reason is None:
            reason = f"signal {stopped[0]}: the run was stopped"
        if reason is not None and run_id is not None and status is None:
            _stop_run(run_id, args.superlink, echo)
    finally:
        terminate_tree([proc.pid], timeout=5.0)
        proc.wait()
        for s, handler in previous.items():
            signal.signal(s, handler)
    if reason is not None:
        what = "stopped" if clock.rounds_seen else "failed"
        echo(f"{what}: {reason}" + (f" (run {run_id} stopped with flwr stop)"
                                    if run_id is not None else ""))
        if stopped:
            return 128 + stopped[0]
        return EXIT_INCOMPLETE if clock.rounds_seen else EXIT_FAILED
    if status is None:
        echo(f"the run's log ended before the run did (flwr run exit code {proc.returncode}"
             + (f", run {run_id}" if run_id is not None else ", no run started") + "); see the "
             "SuperLink's log")
        return EXIT_INCOMPLETE if run_id is not None else EXIT_FAILED
    echo(f"run {run_id} ended: {status}")
    if status not in STATUSES or status == "running":
        return EXIT_INCOMPLETE
    return exit_status(status, finished=status in ("complete", "stopped-early"))


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: ``python -m deploy.submit`` (``gpfl submit``)."""
    parser = argparse.ArgumentParser(prog="gpfl submit", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    os.environ.setdefault("NO_COLOR", "1")
    sys.exit(main())
