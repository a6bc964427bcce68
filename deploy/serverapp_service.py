"""``gpfl serverapp``: a SuperLink's ServerApp, one process a run, for as long as it is needed.

A SuperLink run with ``--isolation process`` starts no ServerApp of its own (no
``flower-superexec``): this command serves it. For each run it starts one
``python -m deploy.serverapp_runner`` process (:mod:`deploy.serverapp_runner`: Flower imported
before the run is claimed, a heartbeat guard, one process a run, exit 75 with one line when the
SuperLink refuses it), waits for it to end, says how it ended, and starts the next one. It is
what the compose deployment's ``serverapp`` service runs, and what a hand deployment runs next to
its SuperLink (docs/DEPLOY.md).

On SIGTERM, SIGINT or SIGHUP it stops the running process (its process group: SIGTERM, then
SIGKILL) and exits with 128 + the signal; the child is also told by the kernel to stop if this
process dies without cleaning up. ``--once`` serves one run and exits with its process's code.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time
from collections.abc import Callable

from client.supernode import StopSignal, raise_stop_signal, start_child, stop_child
from deploy.processes import EXIT_REFUSED

__all__ = ["add_arguments", "run", "runner_argv"]

#: Seconds between the end of one run's process and the start of the next.
PAUSE_S = 1.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add ``gpfl serverapp``'s options to a (sub)parser."""
    p.add_argument("--superlink", default="127.0.0.1:8000", metavar="HOST:PORT",
                   help="the SuperLink's control and runtime API (its --host/--port)")
    p.add_argument("--root-certificates", metavar="CA.crt",
                   help="the CA of the SuperLink's certificate (TLS); without it, plain HTTP")
    p.add_argument("--simulation", action="store_true",
                   help="serve a SuperLink started with --simulation (Flower's Simulation "
                        "Engine: one process runs the ServerApp and the virtual SuperNodes)")
    p.add_argument("--once", action="store_true",
                   help="serve one run, then exit with its process's code")


def runner_argv(args: argparse.Namespace) -> list[str]:
    """Return the command line of one run's process."""
    argv = [sys.executable, "-m", "deploy.serverapp_runner", "--runtime-api-address",
            args.superlink, "--task", "simulation" if args.simulation else "serverapp"]
    if args.root_certificates:
        argv += ["--root-certificates", args.root_certificates]
    return argv


def ended_line(pid: int, code: int) -> str:
    """Say in one line how one run's process ended."""
    if code == EXIT_REFUSED:
        why = ("the SuperLink refused it (its task token expired while the process was held "
               "up; its log says how long); the run ends there, the next run gets a new process")
    elif code == 0:
        why = "its run ended"
    else:
        why = "see its lines above"
    return f"the ServerApp process (pid {pid}) ended with code {code}: {why}"


def run(args: argparse.Namespace, echo: Callable[[str], None] | None = None) -> int:
    """Serve the SuperLink, one process a run (module notes); return the exit status."""
    def say(text: str) -> None:
        print(f"gpfl serverapp: {text}", file=sys.stderr, flush=True)

    echo = echo or say
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    for s in previous:
        signal.signal(s, raise_stop_signal)
    child: subprocess.Popen[bytes] | None = None
    try:
        while True:
            child = start_child(runner_argv(args))
            echo(f"waiting for a run at {args.superlink} (ServerApp process pid {child.pid})")
            code = child.wait()
            echo(ended_line(child.pid, code))
            child = None
            if args.once:
                return code
            time.sleep(PAUSE_S)
    except StopSignal as stop:
        echo(f"signal {stop.signum}: stopping the ServerApp process")
        return 128 + stop.signum
    finally:
        for s in previous:
            signal.signal(s, signal.SIG_IGN)  # no second signal interrupts the cleanup
        stop_child(child)
        for s, handler in previous.items():
            signal.signal(s, handler)
