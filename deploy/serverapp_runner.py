"""The launcher's own ServerApp process: one run, one ServerApp, started before its token exists.

Flower's SuperLink (``--isolation subprocess``, its default) starts ``flower-superexec``, which
claims a submitted run's ServerApp task (the SuperLink issues a task token and gives it
:data:`CLAIM_WINDOW_S` seconds: ``HEARTBEAT_DEFAULT_INTERVAL`` in Flower 1.39's
``claim_task``) and only then starts a ``flwr-serverapp`` process, which must import Flower
before its first heartbeat. On a loaded host (load average 30 or more on 2 cores) that import
took longer than the window: the SuperLink expired the token and put the task back, the SuperExec
claimed it again and started another ServerApp (every 30-40 s), and the refused ones
(``401 Runtime task-token authentication failed``) kept running; no round ever started.

``gpfl launch`` runs the SuperLink with ``--isolation process`` (it starts no SuperExec) and this
process in its place, one per submitted run:

* **Warm before the claim.** Flower's ServerApp runtime is imported first, and only then is the
  task claimed (``AcquireTask``, as ``flower-superexec`` does); the first heartbeat follows the
  claim within milliseconds, however slow the imports were. The ServerApp itself is Flower's
  (:func:`flwr.superlink.runtime.run_serverapp.run_serverapp`, in this process): it installs the
  run's FAB and loads the ServerApp it names, as ``flwr-serverapp`` would.
* **One ServerApp a run.** The process claims one task and ends with it: nothing starts a second
  ServerApp for the run, whatever the SuperLink does with the task.
* **Refusal is loud.** A guard heartbeats every :data:`GUARD_INTERVAL_S` seconds besides Flower's
  own (every ~20 s), so a few stalls of the host do not cost the token. If the SuperLink refuses
  the token anyway (the process was held longer than Flower's window: 30 s before its first
  heartbeat, 60 s after), the guard writes :data:`REFUSED_MARK` and the reason in one line and
  ends the process with :data:`EXIT_REFUSED` at once; the launcher turns that into its last line.

The Simulation Engine's run is the same kind of task (``flwr-simulation``, which starts the
ServerApp and the virtual SuperNodes in one process) and comes up the same way: with
``--task simulation`` this process claims a simulation task instead and runs Flower's simulation
runtime (:func:`flwr.simulation.app.run_simulation_process`), with the same guarantees.

There, the Simulation Engine's dispatcher and node contexts are gpfl's
(:mod:`deploy.simulation_scale`): the same instructions to the same workers, the same contexts,
at a cost that grows with the round rather than with the virtual users.

Run as ``python -m deploy.serverapp_runner --runtime-api-address 127.0.0.1:PORT [--task
simulation]``. It imports no other gpfl module than that dispatcher (which imports only Flower),
and drops it from ``sys.modules`` before the run: the FAB's ``server`` package must load from the
FAB, not from this install.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import threading
import time
from dataclasses import dataclass
from queue import Queue
from typing import Any

import httpx
from flwr.proto.runtime_pb2 import (  # pylint: disable=E0611
    AcquireTaskRequest,
    SendTaskHeartbeatRequest,
)
from flwr.supercore.constant import TaskType
from flwr.supercore.interceptors import (
    RuntimeTokenHttpInterceptor,
    RuntimeVersionHttpInterceptor,
)
from flwr.supercore.logger import mirror_output_to_queue, restore_output
from flwr.supercore.retry import make_simple_http_retry_invoker
from flwr.supercore.runtime import RuntimeHttpClient
from flwr.supercore.tls import validate_and_resolve_root_certificates

__all__ = ["CLAIM_WINDOW_S", "EXIT_REFUSED", "GUARD_INTERVAL_S", "REFUSED_MARK",
           "HeartbeatGuard", "main"]

logger = logging.getLogger("gpfl.serverapp")
#: Flower's ServerApp runtime, the module (its package re-exports a function of the same name).
flower_serverapp = importlib.import_module("flwr.superlink.runtime.run_serverapp")


@dataclass(frozen=True)
class Runtime:
    """One kind of task this process can claim, and Flower's runtime that runs it.

    Attributes
    ----------
    task_type : str
        The task type claimed (Flower's ``TaskType`` value).
    module : str
        The module of Flower's runtime.
    entry : str
        Its function that runs the claimed task (``runtime_api_address``, ``log_queue``,
        ``token``, ``insecure``, ``certificates``, ``runtime_dependency_install``).
    app_call : str
        The module's function that runs the app itself: wrapped, so that the guard stops once
        it returns (Flower then pushes the task's output, and the SuperLink revokes the token).
    """

    task_type: str
    module: str
    entry: str
    app_call: str


#: The runtimes, by ``--task``: the Deployment Engine's ServerApp, and the Simulation Engine's run.
RUNTIMES = {
    "serverapp": Runtime(TaskType.SERVER_APP.value, "flwr.superlink.runtime.run_serverapp",
                         "run_serverapp", "run_"),
    "simulation": Runtime(TaskType.SIMULATION.value, "flwr.simulation.app",
                          "run_simulation_process", "_run_simulation"),
}

#: Seconds Flower 1.39's SuperLink gives a claimed task to send its first heartbeat (its
#: ``HEARTBEAT_DEFAULT_INTERVAL``); afterwards each heartbeat buys ``HEARTBEAT_PATIENCE`` times
#: that (60 s). A test checks both against the installed Flower.
CLAIM_WINDOW_S = 30.0
#: Seconds between the guard's heartbeats: a host may stall the process for most of the window.
GUARD_INTERVAL_S = 2.0
#: Exit status of a ServerApp whose task token the SuperLink refused.
EXIT_REFUSED = 75
#: The start of the line the guard writes when the token is refused (the launcher looks for it).
REFUSED_MARK = "gpfl-serverapp: the SuperLink refused this ServerApp"
#: Seconds between claims when no run is waiting (Flower's SuperExec: 1 s).
POLL_INTERVAL_S = 0.5


class HeartbeatGuard:
    """Heartbeat a claimed task often, and end the process at once if its token is refused.

    Parameters
    ----------
    client : RuntimeHttpClient
        A Runtime API client carrying the task's token and *no* retry: Flower's retry answers a
        401 by interrupting the process, which would hide why it ended.
    interval : float
        Seconds between heartbeats.
    """

    def __init__(self, client: RuntimeHttpClient, interval: float = GUARD_INTERVAL_S) -> None:
        self.client, self.interval = client, interval
        self.claimed_at = time.monotonic()
        self.last_ok: float | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpfl-heartbeat", daemon=True)

    def start(self) -> None:
        """Send the first heartbeat now, then every :attr:`interval` seconds."""
        self._thread.start()

    def stop(self) -> None:
        """Stop heartbeating (the app returned: the task's output is pushed next)."""
        self._done.set()

    def beat(self) -> bool | None:
        """Send one heartbeat; True if accepted, False if refused, None if not delivered."""
        try:
            res = self.client.SendTaskHeartbeat(SendTaskHeartbeatRequest())
        except httpx.HTTPStatusError as err:
            return False if err.response.status_code == httpx.codes.UNAUTHORIZED else None
        except httpx.HTTPError:
            return None  # the SuperLink restarting, or busy: the next beat tries again
        return bool(res.success)

    def _run(self) -> None:
        while not self._done.is_set():
            accepted = self.beat()
            if accepted is False and not self._done.is_set():
                self._refused()
            if accepted:
                self.last_ok = time.monotonic()
            self._done.wait(self.interval)

    def _refused(self) -> None:
        since = self.last_ok if self.last_ok is not None else self.claimed_at
        what = ("its last heartbeat" if self.last_ok is not None else "it claimed the run")
        line = (
            f"{REFUSED_MARK}: its task token was no longer valid {time.monotonic() - since:.0f} s "
            f"after {what} (Flower gives a ServerApp {CLAIM_WINDOW_S:.0f} s to send its first "
            f"heartbeat and {2 * CLAIM_WINDOW_S:.0f} s between two); the process was held up "
            "that long (an overloaded host, or a stopped process)\n")
        os.write(2, line.encode())
        # Not Flower's exit path: it would push the task's output with the refused token,
        # retrying, and the launcher must learn at once why the ServerApp ended.
        os._exit(EXIT_REFUSED)


def _client(address: str, insecure: bool, certificates: bytes | None,
            token: str | None = None, retry: bool = True) -> RuntimeHttpClient:
    interceptors: list[Any] = [RuntimeVersionHttpInterceptor(component_name="flwr-serverapp")]
    if token is not None:
        interceptors.append(RuntimeTokenHttpInterceptor(token))
    return RuntimeHttpClient.from_server_address(
        server_address=address, insecure=insecure, root_certificates=certificates,
        interceptors=interceptors,
        retry_invoker=make_simple_http_retry_invoker() if retry else None)


def acquire(address: str, insecure: bool, certificates: bytes | None,
            task_type: str = TaskType.SERVER_APP.value) -> tuple[str, int]:
    """Wait for a task of ``task_type`` and claim it; return its token and run id."""
    poller = _client(address, insecure, certificates)
    try:
        while True:
            res = poller.AcquireTask(AcquireTaskRequest(
                supported_task_types=[task_type], agentapp_fab_hashes=[]))
            if res.HasField("task") and res.token:
                return res.token, int(res.task.run_id)
            time.sleep(POLL_INTERVAL_S)
    finally:
        poller.close()


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``python -m deploy.serverapp_runner``."""
    parser = argparse.ArgumentParser(prog="python -m deploy.serverapp_runner",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--runtime-api-address", required=True,
                        help="the SuperLink's Runtime API (HOST:PORT)")
    parser.add_argument("--root-certificates", default=None,
                        help="CA of the Runtime API's TLS certificate (default: plain HTTP)")
    parser.add_argument("--task", choices=sorted(RUNTIMES), default="serverapp",
                        help="the task to claim: a Deployment Engine ServerApp (default) or a "
                             "Simulation Engine run")
    args = parser.parse_args(argv)
    runtime = RUNTIMES[args.task]
    # The simulation runtime is imported here, before the claim, like the ServerApp's.
    flower_runtime = importlib.import_module(runtime.module)
    if args.task == "simulation":
        importlib.import_module("deploy.simulation_scale").install()
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    insecure = args.root_certificates is None
    certificates = validate_and_resolve_root_certificates(args.root_certificates, insecure)
    # The FAB's own packages must load from the FAB (Flower imports the ServerApp by module
    # name and reuses what sys.modules holds): drop the `server` package `-m` imported.
    for name in [m for m in sys.modules if m == "server" or m.startswith("server.")]:
        del sys.modules[name]
    token, run_id = acquire(args.runtime_api_address, insecure, certificates, runtime.task_type)
    guard = HeartbeatGuard(_client(args.runtime_api_address, insecure, certificates,
                                   token=token, retry=False))
    guard.start()
    logger.info("claimed the task of run %d (%s)", run_id, args.task)
    run_app = getattr(flower_runtime, runtime.app_call)

    def run_then_stop_guard(**kwargs: Any) -> Any:
        # Once the app returns, Flower pushes the task's output and the SuperLink revokes the
        # token: a heartbeat refused after that is no refusal.
        try:
            return run_app(**kwargs)
        finally:
            guard.stop()

    setattr(flower_runtime, runtime.app_call, run_then_stop_guard)
    log_queue: Queue[str | None] = Queue()
    mirror_output_to_queue(log_queue)  # the run's log, as `flwr run --stream` shows it
    try:
        getattr(flower_runtime, runtime.entry)(
            runtime_api_address=args.runtime_api_address, log_queue=log_queue, token=token,
            insecure=insecure, certificates=certificates, runtime_dependency_install=False)
    finally:
        guard.stop()
        restore_output()
    return 0


if __name__ == "__main__":
    sys.exit(main())
