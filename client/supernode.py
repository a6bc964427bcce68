"""``gpfl supernode``: what a device owner runs — Flower's SuperNode with gpfl's own executor.

It checks the device's node config (and the policy file it names) before anything connects,
then starts two processes and watches them:

* ``flower-supernode --isolation process --port P ...``: Flower's SuperNode, talking gRPC to the
  SuperLink, with the flags a Flower user knows passed through. In process isolation it runs no
  app code and starts no ``flower-superexec``: its tasks wait on its local Runtime API (HTTP on
  ``127.0.0.1:P``).
* ``python -m client.executor``: gpfl's warm executor (:mod:`client.executor`), one per SuperNode,
  serving every task with the gpfl client installed here and refusing runs of other apps. The FAB
  the server sends is never imported.

The runner joins the two with a pipe: the SuperNode writes a byte to it for every message it
stores (:mod:`client.fleet_poll`), and the executor, waiting on it between its idle polls, asks
for the task at once. Without the byte (another Flower version) the idle poll still finds it.

A crashed executor is restarted (with a growing pause). When the SuperNode exits, the runner stops
the executor and exits with the SuperNode's code; except that, with SuperNode authentication, a
SuperNode that fails within the SuperLink's heartbeat window of the runner's start is started
again (every few seconds, for that window): a device restarted after a crash keeps its key, and
Flower 1.39 refuses that key's activation while its dead registration is still online, then
accepts it under the same node id (:mod:`strategies.identity`). A key the SuperLink does not
know is therefore refused for about a minute before the runner gives up. On SIGTERM, SIGINT or
SIGHUP (and on any exit) it stops both, each by its process group, and says so in one line
(the executor ends quietly: :func:`client.executor._exit_on_signal`); each child is also told by
the kernel to stop if the runner dies without cleaning up (``PR_SET_PDEATHSIG``). Nothing is
stopped by name.

The executor lives in ``client/`` (it is the client, and the client imports nothing of
``server``); this module is only the process wrapper, next to the launcher that uses it.
"""

from __future__ import annotations

import argparse
import ctypes
import math
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from client import fleet_poll
from client.process_tree import child_env, terminate_tree

__all__ = ["StopSignal", "add_arguments", "executor_argv", "parse_node_config",
           "raise_stop_signal", "run", "start_child", "stop_child", "stopped_line",
           "supernode_argv"]

#: The port of the SuperNode's Runtime API when none is given (Flower's default).
DEFAULT_PORT = 9094
_PR_SET_PDEATHSIG = 1
#: How long a SuperLink keeps a dead SuperNode online: Flower 1.39's heartbeat patience times its
#: interval (``flwr.common.constant``: 2 x 30 s; a test checks them). Not imported: the runner
#: starts before, and without, Flower's import.
HEARTBEAT_WINDOW_S = 60.0
#: Seconds a SuperNode keeps retrying a SuperLink that does not answer (Flower's
#: ``--max-wait-time``, unbounded by default): a device left retrying forever looks alive and
#: serves nothing. Ten minutes outlast a SuperLink restart (seconds) with room to spare.
DEFAULT_MAX_WAIT_S = 600.0
#: Seconds the runner waits for the SuperLink's Fleet port when it checks why its SuperNode ended.
PROBE_TIMEOUT_S = 3.0
#: Seconds between two activations of an authenticated SuperNode (see the module notes).
REACTIVATE_PAUSE_S = 5.0
class NodeConfigError(ValueError):
    """The device's node config or policy is invalid; nothing was started."""


def parse_node_config(text: str) -> dict[str, Any]:
    """Parse ``--node-config`` in gpfl's one grammar (:mod:`settings.pairs`).

    It reads every node config ``flower-supernode`` reads to the same values, and also takes
    bare words as strings (``mechanisms=gaussian``), as ``gpfl launch --node-config`` does;
    :func:`supernode_argv` hands Flower the parsed values back in Flower's own grammar.

    Raises
    ------
    NodeConfigError
        An item that is not ``key=value``, or a ``FILE.toml`` that cannot be read.
    """
    from settings.pairs import PairsError, read_settings  # stdlib only: no flwr

    try:
        return read_settings(text, "--node-config")
    except PairsError as err:
        raise NodeConfigError(str(err)) from None


def check_device(node_config: dict[str, Any]) -> str:
    """Check the node config and the policy file it names; return where the policy came from.

    A ``data-path`` that names nothing on this machine is refused too: every round would
    otherwise be declined for it (the task's preflight) while the device looks healthy.

    Raises
    ------
    NodeConfigError
        The first problem, naming the key and the value.
    """
    from client.policy import DevicePolicy  # settings + policy only: fast, no flwr
    from settings import SettingError

    try:
        policy = DevicePolicy.load(node_config)
    except SettingError as err:
        raise NodeConfigError(str(err)) from None
    data_path = str(policy["data-path"])
    if data_path and not Path(data_path).expanduser().exists():
        raise NodeConfigError(f"data-path={data_path!r} (from {policy.source}) does not exist "
                              "on this device")
    return policy.source


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add ``gpfl supernode``'s options to a (sub)parser."""
    p.add_argument("--superlink", default="127.0.0.1:9092",
                   help="the SuperLink's Fleet API (gRPC), HOST:PORT")
    sec = p.add_mutually_exclusive_group()
    sec.add_argument("--insecure", action="store_true",
                     help="connect to the SuperLink without TLS (tests, a local federation)")
    sec.add_argument("--root-certificates", metavar="CA.crt",
                     help="the CA that signed the SuperLink's certificate (TLS)")
    p.add_argument("--auth-supernode-private-key", metavar="KEY",
                   help="this SuperNode's private key (SuperNode authentication)")
    p.add_argument("--auth-supernode-public-key", metavar="KEY.pub",
                   help="this SuperNode's public key (optional with the private key)")
    p.add_argument("--node-config", default="", metavar='"k=v ..." | FILE.toml',
                   help="the device's settings (partition-id, policy-file, caps, ...; see "
                        "docs/SETTINGS.md); checked before anything starts")
    p.add_argument("--port", type=int, default=DEFAULT_PORT,
                   help="the SuperNode's local Runtime API port, one per SuperNode on a host")
    p.add_argument("--poll-interval", type=float, default=None,
                   help="seconds between the executor's polls for a task when idle; the "
                        "SuperNode wakes it when a task arrives, so this is a fallback "
                        "(default: the executor's, 5 s; Flower's SuperExec: 1 s)")
    p.add_argument("--fleet-poll-interval", type=float, default=fleet_poll.DEFAULT_INTERVAL,
                   metavar="S", help="seconds between the SuperNode's polls of the SuperLink when "
                   f"idle, in [{fleet_poll.MIN_INTERVAL}, {fleet_poll.MAX_INTERVAL:g}] (default: "
                   f"{fleet_poll.DEFAULT_INTERVAL}; Flower's own: 3)")
    p.add_argument("--max-wait-time", type=float, default=DEFAULT_MAX_WAIT_S, metavar="S",
                   help="seconds the SuperNode keeps trying to reach a SuperLink that does not "
                        "answer (at start, or lost mid-run) before it stops with a one-line "
                        f"reason (default: {DEFAULT_MAX_WAIT_S:g}; Flower's own: no limit)")
    p.add_argument("flower_args", nargs=argparse.REMAINDER, metavar="-- FLOWER_ARGS",
                   help="anything after `--` is passed to flower-supernode as given")


def supernode_argv(args: argparse.Namespace, notify_fd: int | None = None) -> list[str]:
    """Return the ``flower-supernode`` command line of these options.

    ``notify_fd``: the write end of the pipe that wakes the executor (:mod:`client.fleet_poll`).
    """
    # Flower's SuperNode, through the module that shortens its idle poll (client.fleet_poll).
    notify = [] if notify_fd is None else [fleet_poll.NOTIFY_FLAG, str(notify_fd)]
    argv = [sys.executable, "-P", "-m", "client.fleet_poll", fleet_poll.FLAG,
            str(args.fleet_poll_interval), *notify, "--isolation", "process",
            "--superlink", args.superlink, "--port", str(args.port),
            "--max-wait-time", f"{args.max_wait_time:g}"]
    if args.insecure:
        argv.append("--insecure")
    if args.root_certificates:
        argv += ["--root-certificates", args.root_certificates]
    if args.auth_supernode_private_key:
        argv += ["--auth-supernode-private-key", args.auth_supernode_private_key]
    if args.auth_supernode_public_key:
        argv += ["--auth-supernode-public-key", args.auth_supernode_public_key]
    if args.node_config:
        # A file is Flower's to read; items are handed over in Flower's strict grammar, so
        # that flower-supernode reads the very values checked here (bare words quoted).
        text = args.node_config.strip()
        if not (text.endswith(".toml") and "=" not in text):
            from settings.pairs import format_pairs

            text = format_pairs(parse_node_config(text))
        argv += ["--node-config", text]
    extra = list(args.flower_args or [])
    if extra[:1] == ["--"]:
        extra = extra[1:]
    return argv + extra


def executor_argv(port: int, poll_interval: float | None, parent_pid: int,
                  wake_fd: int | None = None) -> list[str]:
    """Return the warm executor's command line (this interpreter, this installation).

    ``poll_interval`` None leaves the executor's own default (`client.executor`); ``wake_fd``:
    the read end of the pipe its SuperNode writes to when a task is ready.
    """
    # The Runtime API is served on 127.0.0.1 (Flower's default host): only this machine reaches it.
    # -P: the working directory is not put on sys.path, so a `client/` folder wherever the
    # runner was started cannot stand in for the installed one.
    poll = [] if poll_interval is None else ["--poll-interval", str(poll_interval)]
    wake = [] if wake_fd is None else ["--wake-fd", str(wake_fd)]
    return [sys.executable, "-P", "-m", "client.executor", "--runtime-api-address",
            f"127.0.0.1:{port}", *poll, *wake, "--parent-pid", str(parent_pid)]


def superlink_answers(address: str, timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """Try a TCP connection to the SuperLink's Fleet API; return why it failed, or None."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)),
                                      timeout=timeout):
            return None
    except ValueError:
        return f"{address!r} is not HOST:PORT"
    except OSError as err:
        return err.strerror or type(err).__name__


def ended_line(code: int, superlink: str, max_wait: float) -> str:
    """Say in one line why the SuperNode ended, when it ended on its own (not signalled here).

    A SuperNode that gives up on its SuperLink (Flower's exit code 1 after ``--max-wait-time``,
    or a refused TLS handshake) prints Flower's own reason among its log lines; the runner
    checks the Fleet port itself so that its last line says whether the SuperLink answers.
    """
    if code == 0:
        return "the SuperNode ended (code 0); stopping the executor"
    why = superlink_answers(superlink)
    if why is not None:
        return (f"stopped: the SuperNode exited with code {code}: the SuperLink at {superlink} "
                f"does not answer ({why}; the SuperNode gives up after --max-wait-time="
                f"{max_wait:g} s); check --superlink and that the SuperLink runs, then start "
                "this device again (its ledger is unchanged)")
    return (f"stopped: the SuperNode exited with code {code}; the SuperLink at {superlink} "
            "answers, so see the SuperNode's lines above for why (a TLS certificate, a refused "
            "key, the SuperLink ending this node)")


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    # Linux: the kernel sends SIGTERM to the child when the runner dies, even by SIGKILL.
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        except (OSError, AttributeError):
            pass


def start_child(argv: Sequence[str], pass_fd: int | None = None) -> subprocess.Popen[bytes]:
    """Start a child in a session of its own, told by the kernel to stop when this process dies.

    Own session = own process group: stopping the group reaches anything the child starts.
    ``pass_fd``: a file descriptor the child inherits.
    """
    return subprocess.Popen(list(argv), env=child_env(), stdin=subprocess.DEVNULL,
                            start_new_session=True, preexec_fn=_die_with_parent,
                            pass_fds=() if pass_fd is None else (pass_fd,))


def stop_child(proc: subprocess.Popen[bytes] | None, timeout: float = 5.0) -> None:
    """Stop a child's process group (SIGTERM, then SIGKILL), and any descendant left."""
    if proc is None:
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(timeout=timeout)
            break
        except subprocess.TimeoutExpired:
            continue
    terminate_tree([proc.pid], timeout=1.0)


class StopSignal(Exception):
    """A stop signal (SIGTERM, SIGINT, SIGHUP) received by a process that watches children."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def stopped_line(signum: int) -> str:
    """Say in one line that the runner stopped on a signal, naming it (``SIGTERM``)."""
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    return f"stopped on {name} (signal {signum}): the SuperNode and the executor were stopped"


def raise_stop_signal(signum: int, frame: FrameType | None) -> None:
    """Signal handler: raise :class:`StopSignal`, so the watcher's cleanup runs."""
    raise StopSignal(signum)


def run(args: argparse.Namespace, echo: Any = None) -> int:
    """Check the device's settings, start the SuperNode and the executor, and watch them.

    Returns the SuperNode's exit code, 2 for invalid settings, or 128 + the signal that
    stopped the runner.
    """
    def say(text: str) -> None:
        print(f"gpfl supernode: {text}", file=sys.stderr, flush=True)

    echo = echo or say
    try:
        source = check_device(parse_node_config(args.node_config))
    except NodeConfigError as err:
        echo(f"invalid device settings, nothing started: {err}")
        return 2
    if not 0 < args.port < 65536:
        echo(f"--port must be 1..65535, got --port={args.port}")
        return 2
    if not (args.max_wait_time > 0 and math.isfinite(args.max_wait_time)):
        echo(f"--max-wait-time must be a number of seconds > 0, got "
             f"--max-wait-time={args.max_wait_time}")
        return 2
    if args.poll_interval is not None and not args.poll_interval > 0:
        echo(f"--poll-interval must be > 0, got --poll-interval={args.poll_interval}")
        return 2
    try:
        fleet_poll.IdleClock(args.fleet_poll_interval)
    except ValueError as err:
        echo(str(err))
        return 2
    supernode: subprocess.Popen[bytes] | None = None
    executor: subprocess.Popen[bytes] | None = None
    # The wake-up pipe (module notes); kept open here so a restarted child gets its end again.
    wake_fd, notify_fd = os.pipe()

    def start_supernode() -> subprocess.Popen[bytes]:
        return start_child(supernode_argv(args, notify_fd), notify_fd)

    def start_executor() -> subprocess.Popen[bytes]:
        argv = executor_argv(args.port, args.poll_interval, os.getpid(), wake_fd)
        return start_child(argv, wake_fd)

    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    for s in previous:
        signal.signal(s, raise_stop_signal)
    stopped_by: int | None = None
    try:
        supernode = start_supernode()
        echo(f"SuperNode pid {supernode.pid} (process isolation, Runtime API "
             f"127.0.0.1:{args.port}); device settings from {source}")
        pause, started = 1.0, time.monotonic()
        # Only a keyed SuperNode has an old registration that can refuse it (module notes). The
        # old one went offline at most the window after the runner started: an attempt begun
        # after that (plus a margin for the SuperLink's clock) is the last one made.
        attempt, window_ends = started, started + HEARTBEAT_WINDOW_S + REACTIVATE_PAUSE_S
        executor = start_executor()
        while True:
            code = supernode.poll()
            if code not in (None, 0) and args.auth_supernode_private_key \
                    and attempt < window_ends:
                echo(f"the SuperNode exited with code {code}; with a SuperNode key this is "
                     f"how the SuperLink refuses a key whose earlier registration is still "
                     f"online: starting it again in {REACTIVATE_PAUSE_S:.0f} s")
                time.sleep(REACTIVATE_PAUSE_S)
                attempt, supernode = time.monotonic(), start_supernode()
                continue
            if code is not None:
                echo(ended_line(code, args.superlink, args.max_wait_time))
                return code
            if executor.poll() is not None:
                ran = time.monotonic() - started
                echo(f"the executor (pid {executor.pid}) exited with code {executor.returncode} "
                     f"after {ran:.0f} s; restarting it in {pause:.0f} s")
                time.sleep(pause)
                # A crash loop backs off (up to 30 s); one that ran a while starts afresh.
                pause = 1.0 if ran > 60 else min(pause * 2, 30.0)
                started = time.monotonic()
                executor = start_executor()
            time.sleep(0.2)
    except StopSignal as stop:
        stopped_by = stop.signum
        return 128 + stop.signum
    finally:
        for s in previous:
            signal.signal(s, signal.SIG_IGN)  # no second signal interrupts the cleanup
        stop_child(executor)
        stop_child(supernode)
        os.close(wake_fd)
        os.close(notify_fd)
        for s, handler in previous.items():
            signal.signal(s, handler)
        if stopped_by is not None:
            # The device's one line about a normal stop, once both children are gone (the
            # executor ends quietly on its signal, client.executor).
            echo(stopped_line(stopped_by))
