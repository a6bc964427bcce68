"""The device's warm executor: one process serves every task of a SuperNode with gpfl's client.

Flower's SuperNode in ``--isolation process`` runs no app code itself: it queues a task per
message and an outside executor serves it over the SuperNode's local Runtime API. Flower's own
executor (``flower-superexec``) starts one ``flwr-clientapp`` process per task, which installs
the FAB the server sent and imports *its* ClientApp. This executor, started by ``gpfl supernode``
(:mod:`client.supernode`), differs in two ways:

* **The device's code.** Every task is handled by :data:`client.app.app`, imported from the gpfl
  installed on this device. The FAB is pulled (Flower's Runtime API hands it out with the task)
  but never written to disk, installed or imported. Runs of another app are refused
  (:mod:`client.pinning`) with an error reply, before the device's data or ledger are touched.
* **Woken.** With ``--wake-fd`` (a pipe ``gpfl supernode`` makes) it waits for a byte its
  SuperNode writes when a message is stored, and asks for the task at once; the idle poll
  (:data:`DEFAULT_POLL_INTERVAL`) remains for a SuperNode that does not write.
* **Warm.** The process starts once per SuperNode: flwr, NumPy, gpfl and (on the first task
  that needs them) torch, the task's data and its caches are loaded once, not per message. The
  device policy is re-read for every task (a small file): an owner's edit applies to the next
  message without a restart, and the ledger is opened per release as before.

The protocol is Flower's: :func:`flwr.supernode.runtime.run_clientapp.pull_task_input`,
:func:`~flwr.supernode.runtime.run_clientapp.push_message` and
:func:`~flwr.supernode.runtime.run_clientapp.push_task_output` per task, exactly as
``flwr-clientapp`` calls them, and ``AcquireTask`` polling as ``flower-superexec`` does.

Run as ``python -m client.executor --runtime-api-address 127.0.0.1:PORT``.
"""

from __future__ import annotations

import argparse
import logging
import os
import select
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import Any

import httpx
from flwr.app import Context, Message
from flwr.app.error import Error
from flwr.common.constant import ErrorCode, SubStatus
from flwr.proto.runtime_pb2 import AcquireTaskRequest  # pylint: disable=E0611
from flwr.supercore.app_utils import start_parent_process_monitor
from flwr.supercore.constant import TaskType
from flwr.supercore.heartbeat import HeartbeatSender, make_task_heartbeat_fn_http
from flwr.supercore.interceptors import (
    RuntimeTokenHttpInterceptor,
    RuntimeVersionHttpInterceptor,
)
from flwr.supercore.retry import make_simple_http_retry_invoker
from flwr.supercore.runtime import RuntimeHttpClient
from flwr.supercore.tls import validate_and_resolve_root_certificates
from flwr.supernode.runtime.run_clientapp import (
    pull_task_input,
    push_message,
    push_task_output,
)

from client.pinning import AppPin, Verdict, check_run, installed_app, parse_fab_hashes
from client.policy import DevicePolicy, PolicyError

__all__ = ["RuntimeConnection", "TaskOutcome", "idle_wait", "main", "serve", "serve_task"]

logger = logging.getLogger("gpfl.executor")

#: Seconds between ``AcquireTask`` polls when idle (Flower's own SuperExec: 1 s). Woken by its
#: SuperNode (``--wake-fd``), the executor needs the poll only as a fallback, and every poll is
#: an HTTP request both processes pay for in CPU: at 1 s, 20 devices on 2 cores took 4.9 s a
#: round, at 5 s 4.0-4.2 s (docs/BENCHMARKS.md).
DEFAULT_POLL_INTERVAL = 5.0


@dataclass(frozen=True)
class RuntimeConnection:
    """How to reach the SuperNode's Runtime API."""

    address: str
    insecure: bool = True
    root_certificates: bytes | None = None

    def client(self, component: str, token: str | None = None) -> RuntimeHttpClient:
        """Return a Runtime API client (with the task's token, if given)."""
        interceptors: list[Any] = [RuntimeVersionHttpInterceptor(component_name=component)]
        if token is not None:
            interceptors.append(RuntimeTokenHttpInterceptor(token))
        return RuntimeHttpClient.from_server_address(
            server_address=self.address,
            insecure=self.insecure,
            root_certificates=self.root_certificates,
            interceptors=interceptors,
            retry_invoker=make_simple_http_retry_invoker(),
        )


@dataclass(frozen=True)
class TaskOutcome:
    """What happened to one task (for logs and tests)."""

    run_id: int
    fab_id: str
    fab_version: str
    verdict: Verdict
    status: str


ClientAppFn = Callable[..., Message]


def _installed_client_app() -> ClientAppFn:
    # The device's own ClientApp: imported once, from this installation, never from a FAB.
    from client.app import app

    return app


def decide(run_fab_id: str, run_fab_version: str, fab_hash: str,
           node_config: dict[str, Any], pin: AppPin) -> Verdict:
    """Apply the pin, narrowed by the device policy's ``trusted-fab-hashes``.

    A policy that cannot be read refuses the run (the device owner must fix it): the device's
    log names the key and value, the server learns only that the policy is unusable.
    """
    try:
        policy = DevicePolicy.load(node_config)
    except PolicyError as err:
        logger.error("the device policy is invalid: %s", err)
        return Verdict(False, f"app {run_fab_id} {run_fab_version}: this device's policy is "
                              "invalid (details in the device's log)")
    hashes = parse_fab_hashes(policy["trusted-fab-hashes"])
    return check_run(run_fab_id, run_fab_version, fab_hash, pin.with_hashes(hashes))


def serve_task(conn: RuntimeConnection, token: str, pin: AppPin,
               client_app: ClientAppFn) -> TaskOutcome | None:
    """Serve one acquired task, as ``flwr-clientapp`` would but with the installed client.

    The reply is always pushed: the app's reply, or an error reply for a refused run or a
    failure (so the server sees a failure, never a hang), then the task's final status.
    """
    client = conn.client("flwr-clientapp", token)
    heartbeat = HeartbeatSender(make_task_heartbeat_fn_http(client))
    heartbeat.start()
    message: Message | None = None
    context: Context | None = None
    reply: Message | None = None
    status, details = SubStatus.FAILED, "gpfl executor: task failed"
    outcome = None
    try:
        message, context, run, fab = pull_task_input(client)
        # The FAB's bytes are in `fab.content`: they are dropped unread. Only the claims about
        # them (app id, version, hash) are looked at.
        verdict = decide(run.fab_id, run.fab_version, fab.hash_str,
                         dict(context.node_config), pin)
        if verdict.serve:
            logger.info("run %d: %s", run.run_id, verdict.reason)
            reply = client_app(message=message, context=context)
            status, details = SubStatus.COMPLETED, ""
        else:
            logger.warning("gpfl executor refuses run %d: %s", run.run_id, verdict.reason)
            details = f"gpfl device runner refused the run: {verdict.reason}"
            reply = Message(Error(code=ErrorCode.LOAD_CLIENT_APP_EXCEPTION, reason=details),
                            reply_to=message)
        outcome = TaskOutcome(run.run_id, run.fab_id, run.fab_version, verdict, status)
    except Exception as ex:  # pylint: disable=broad-exception-caught
        # As flwr-clientapp: the app's exception becomes an error reply. gpfl's client already
        # replaces any failure that touched private data by a fixed text (RELEASE_FAILED).
        logger.error("task failed", exc_info=ex)
        details = f"{type(ex)}:<'{ex}'>"
        if message is not None:
            reply = Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=details),
                            reply_to=message)
    finally:
        try:
            if reply is not None and context is not None:
                push_message(client, reply, context)
        except Exception as ex:  # pylint: disable=broad-exception-caught
            logger.error("failed to push the reply", exc_info=ex)
        push_task_output(client, context, status, details)
        if heartbeat.is_running:
            heartbeat.stop()
        client.close()
    return outcome


def serve(conn: RuntimeConnection, pin: AppPin, *, poll_interval: float = DEFAULT_POLL_INTERVAL,
          stop: threading.Event | None = None, client_app: ClientAppFn | None = None,
          wake_fd: int | None = None) -> None:
    """Acquire and serve ClientApp tasks one at a time until ``stop`` is set (or forever).

    Between polls it waits ``poll_interval`` seconds, or until a byte arrives on ``wake_fd``
    (:func:`idle_wait`).
    """
    stop = stop or threading.Event()
    app = client_app or _installed_client_app()
    poller = conn.client("SuperExec")
    unreachable_since: float | None = None
    # How the next task will be found, for the log: at start, right after a task, woken by the
    # SuperNode's byte, or by the idle poll (a SuperNode that does not write, or a lost byte).
    how = "at start"
    try:
        while not stop.is_set():
            try:
                res = poller.AcquireTask(AcquireTaskRequest(
                    supported_task_types=[TaskType.CLIENT_APP.value], agentapp_fab_hashes=[]))
            except httpx.HTTPError as err:
                # The SuperNode starts beside us and may not listen yet; the runner ends this
                # process when its SuperNode exits, so waiting is all there is to do.
                if unreachable_since is None:
                    unreachable_since = time.monotonic()
                    logger.info("Runtime API at %s not reachable yet (%s)", conn.address, err)
                stop.wait(poll_interval)
                continue
            if unreachable_since is not None:
                logger.info("Runtime API at %s reachable", conn.address)
                unreachable_since = None
            if res.HasField("task") and res.token:
                logger.info("task found %s", how)
                serve_task(conn, res.token, pin, app)
                how = "right after the previous one"
                continue  # another message may be queued: ask again at once
            how = ("woken by the SuperNode" if idle_wait(stop, poll_interval, wake_fd)
                   else "by the idle poll")
    finally:
        poller.close()


def idle_wait(stop: threading.Event, seconds: float, wake_fd: int | None) -> bool:
    """Wait up to ``seconds`` for ``stop``, or for a byte on ``wake_fd``; True if woken by one.

    Every byte waiting is read: one look at the Runtime API serves all the messages they
    announce (the executor asks again at once after each task).
    """
    if wake_fd is None:
        stop.wait(seconds)
        return False
    readable, _, _ = select.select([wake_fd], [], [], seconds)
    if not readable:
        return False
    try:
        os.read(wake_fd, 4096)
    except BlockingIOError:  # another reader took them: nothing lost, the poll follows
        pass
    return True


#: Seconds the executor waits for its SuperNode's Runtime API before Flower's retry takes over.
RUNTIME_WAIT_S = 120.0


def wait_until_listening(address: str, timeout: float = RUNTIME_WAIT_S,
                         interval: float = 0.2) -> float:
    """Wait until ``HOST:PORT`` accepts TCP connections; return the seconds waited.

    The SuperNode and its executor start together, and importing Flower takes the SuperNode
    seconds (tens of seconds while a whole federation starts on a small machine). A request
    sent before it listens makes Flower's HTTP retry back off exponentially, up to 20 s a
    try, so a device could join a round long after its SuperNode was ready; a plain TCP
    probe every ``interval`` seconds joins within ``interval``. After ``timeout`` the
    executor goes on and Flower's retry takes over.
    """
    host, _, port = address.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        try:
            with socket.create_connection((host, int(port)), timeout=interval):
                break
        except OSError:
            time.sleep(interval)
    return time.monotonic() - started


#: The signals that stop the executor: its runner's SIGTERM, SIGINT (Flower's parent monitor
#: raises it when the runner is gone), SIGHUP.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _exit_on_signal(signum: int, frame: FrameType | None) -> None:
    """Stop the executor on the first stop signal, and ignore any that follows.

    A stopping device is often signalled twice: the launcher signals every process of the
    device's tree and the runner then signals the executor's group. A second ``SystemExit``
    raised while the first unwinds lands in the interpreter's shutdown (torch's exit handlers,
    the threading module's) and is printed there as a traceback ending ``SystemExit: 143``.
    So the first signal disarms the handler before it ends the process; the runner, which
    started the executor, says in its log that the device stopped on the signal, and the exit
    status (128 + the signal) says it to anyone else. ``SystemExit`` rather than an
    ``Exception``: no ``except Exception`` in a task's code may turn a stop into a reply.
    """
    for s in STOP_SIGNALS:
        signal.signal(s, signal.SIG_IGN)
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``python -m client.executor``."""
    parser = argparse.ArgumentParser(prog="python -m client.executor",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--runtime-api-address", required=True,
                        help="the SuperNode's Runtime API (HOST:PORT)")
    parser.add_argument("--root-certificates", default=None,
                        help="CA of the Runtime API's TLS certificate (default: plain HTTP)")
    parser.add_argument("--poll-interval", type=float, default=DEFAULT_POLL_INTERVAL,
                        help="seconds between polls for a task when idle")
    parser.add_argument("--wake-fd", type=int, default=None,
                        help="a pipe's read end: a byte on it means a task is ready")
    parser.add_argument("--parent-pid", type=int, default=None,
                        help="exit when this process (the runner) is gone")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # One line per Runtime API request (5 polls a second) would drown the device's log.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    for s in STOP_SIGNALS:
        signal.signal(s, _exit_on_signal)
    if args.parent_pid is not None:
        start_parent_process_monitor(args.parent_pid)
    insecure = args.root_certificates is None
    conn = RuntimeConnection(
        args.runtime_api_address, insecure,
        validate_and_resolve_root_certificates(args.root_certificates, insecure))
    pin = installed_app()
    started = time.monotonic()
    app = _installed_client_app()
    logger.info("warm executor %d ready in %.1f s: serves %s %s from %s", os.getpid(),
                time.monotonic() - started, pin.fab_id, pin.version,
                os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    waited = wait_until_listening(args.runtime_api_address)
    logger.info("the SuperNode's Runtime API %s %s after %.1f s", args.runtime_api_address,
                "did not answer (Flower's retry goes on)" if waited >= RUNTIME_WAIT_S
                else "answered", waited)
    if args.wake_fd is not None:
        os.set_blocking(args.wake_fd, False)
    serve(conn, pin, poll_interval=args.poll_interval, client_app=app, wake_fd=args.wake_fd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
