"""A SuperLink and SuperNodes as OS processes on this machine, and the run submitted to them.

:class:`Federation` starts Flower's processes on free localhost ports with a private Flower home
(SuperNodes through ``gpfl supernode`` by default), submits a run with ``flwr run --stream`` and
stops everything it started. :func:`stream_lines` reads the run's streamed log.
"""

from __future__ import annotations

import logging
import random
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from client.process_tree import bin_dir, child_env
from deploy.certs import TlsFiles
from deploy.fab import stage_app
from deploy.processes import SERVERAPP, ProcessSet
from settings.pairs import format_pairs

logger = logging.getLogger(__name__)

#: The connection name written into the launch's private FLWR_HOME.
CONNECTION = "gpfl-local"


class LaunchError(RuntimeError):
    """The federation could not be started, or the run failed."""


def checkout_root() -> Path | None:
    """Return the source checkout gpfl runs from (its ``pyproject.toml``), or None if installed."""
    root = Path(__file__).resolve().parent.parent
    return root if (root / "pyproject.toml").is_file() else None


def project_root() -> Path:
    """Return the folder holding gpfl's ``pyproject.toml`` (the Flower app).

    Raises
    ------
    LaunchError
        Where gpfl is installed without its source (the benchmarks that need one say so).
    """
    root = checkout_root()
    if root is None:
        raise LaunchError(
            f"no pyproject.toml next to the installed packages ({Path(__file__).parent.parent}); "
            "this needs gpfl's source checkout"
        )
    return root


#: Ports this process has handed out: never handed out twice.
_HANDED_OUT: set[int] = set()


def _ephemeral_range() -> tuple[int, int]:
    """Return the kernel's range for outgoing connections' local ports (Linux; IANA's elsewhere)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 49152, 65535


def free_port() -> int:
    """Return a TCP port that is free on 127.0.0.1 right now, outside the ephemeral range.

    A port chosen now is bound later by a child process. Ports from the kernel's ephemeral range
    (what binding port 0 gives) are also what outgoing connections take: with a hundred
    SuperNodes retrying their connections during start-up, one took a port chosen for a
    SuperNode's Runtime API in that window, and the SuperNode died ("address already in use").
    So ports are drawn below the ephemeral range, and never twice by one process.
    """
    low = _ephemeral_range()[0]
    if low > 11_000:
        rng = random.Random()
        for _ in range(1000):
            port = rng.randrange(10_000, low)
            if port in _HANDED_OUT:
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
            _HANDED_OUT.add(port)
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    _HANDED_OUT.add(port)
    return port


def wait_for_port(port: int, timeout: float, proc: subprocess.Popen[bytes] | None = None,
                  log: Path | None = None) -> None:
    """Wait until something listens on 127.0.0.1:port, or fail clearly."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:] if log and log.exists() else ""
            raise LaunchError(f"process exited with code {proc.returncode} before listening on "
                              f"port {port}:\n{tail}")
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.settimeout(0.5)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise LaunchError(f"nothing listened on 127.0.0.1:{port} after {timeout:.0f} s")


def node_config_arg(config: Mapping[str, Any]) -> str:
    """Format a SuperNode's ``--node-config`` argument."""
    return format_pairs(config)


@dataclass
class Federation:
    """A SuperLink and SuperNodes on this machine; a context manager.

    Parameters
    ----------
    workdir : Path
        Logs (``logs/``) and the private Flower home go here.
    tls : TlsFiles or None
        Certificates to encrypt every connection; ``None`` runs insecure.
    """

    workdir: Path
    tls: TlsFiles | None = None
    procs: ProcessSet = field(default_factory=ProcessSet)
    fleet_port: int = 0
    control_port: int = 0
    supernode_ports: dict[int, int] = field(default_factory=dict)
    node_configs: dict[int, dict[str, Any]] = field(default_factory=dict)
    #: Extra environment of each SuperNode (e.g. its own ``CUDA_VISIBLE_DEVICES``).
    node_env: dict[int, dict[str, str]] = field(default_factory=dict)
    #: Extra flags of each SuperNode (its ``--auth-supernode-private-key``): a restart keeps them.
    node_args: dict[int, list[str]] = field(default_factory=dict)
    flwr_home: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="gpfl-flwr-")))
    #: Environment added to every process (e.g. ``GPFL_POLICY`` for virtual nodes).
    extra_env: dict[str, str] = field(default_factory=dict)
    _superlink_args: tuple[list[str], int] = field(default=([], 0), repr=False)
    #: SuperNodes run as devices do: ``gpfl supernode`` (the device's own gpfl client in one
    #: warm executor; runs of other apps refused). ``False``: Flower's plain ``flower-supernode``,
    #: which installs and runs the FAB of any run in a new process per message (the bench's
    #: FedAvg baseline needs it).
    device_runner: bool = True
    #: Flower's persistent state (``flower-superlink --database``): a SQLite file holding the
    #: SuperLink's runs, nodes and messages, so that a SuperLink restarted on it (same ports)
    #: carries on where it stopped. ``None``: state in memory, lost with the process.
    database: Path | None = None

    def __enter__(self) -> Federation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def logs(self) -> Path:
        """The folder of every process's log."""
        return self.workdir / "logs"

    def _security_args(self) -> list[str]:
        if self.tls is None:
            return ["--insecure"]
        return ["--ssl-ca-certfile", str(self.tls.ca_cert),
                "--ssl-certfile", str(self.tls.server_cert),
                "--ssl-keyfile", str(self.tls.server_key)]

    def start_superlink(self, extra_args: list[str] | None = None, timeout: float = 60,
                        simulation_supernodes: int = 0) -> None:
        """Start the SuperLink and wait until its APIs listen.

        With ``simulation_supernodes > 0`` it runs Flower's Simulation Engine
        (Ray) with that many virtual SuperNodes instead of a Fleet API. A SuperLink started
        again (:meth:`restart_superlink`) keeps its ports, so SuperNodes and the ServerApp
        reconnect to it.
        """
        self.control_port = self.control_port or free_port()
        log = self.logs / "superlink.log"
        argv = [
            str(bin_dir() / "flower-superlink"), *self._security_args(),
            "--disable-runtime-dependency-installation",
            "--host", "127.0.0.1", "--port", str(self.control_port),
        ]
        if self.database is not None:
            self.database.parent.mkdir(parents=True, exist_ok=True)
            argv += ["--database", str(self.database)]
        if simulation_supernodes:
            # No SuperExec either: the launcher starts the run's simulation process (submit).
            argv += ["--simulation", "--isolation", "process"]
        else:
            self.fleet_port = self.fleet_port or free_port()
            # No SuperExec: the launcher starts the run's ServerApp itself (submit).
            argv += ["--fleet-api-address", f"127.0.0.1:{self.fleet_port}",
                     "--isolation", "process"]
        self._superlink_args = (list(extra_args or []), simulation_supernodes)
        proc = self.procs.start("superlink", [*argv, *(extra_args or [])], log,
                                env=child_env(self._env()))
        if self.fleet_port:
            wait_for_port(self.fleet_port, timeout, proc, log)
        wait_for_port(self.control_port, timeout, proc, log)
        self._write_connection(simulation_supernodes)

    def restart_superlink(self, timeout: float = 60) -> None:
        """Start the SuperLink again, on its ports and database, after it was stopped or died.

        Only the SuperLink process is started: the ServerApp and the SuperNodes it served, if
        they are still running, reconnect to it (they retry a lost connection).
        """
        extra_args, simulation_supernodes = self._superlink_args
        self.procs.stop("superlink")
        self.start_superlink(extra_args, timeout, simulation_supernodes)

    def _env(self) -> dict[str, str]:
        return {**self.extra_env, "FLWR_HOME": str(self.flwr_home)}

    def _write_connection(self, simulation_supernodes: int = 0) -> None:
        self.flwr_home.mkdir(parents=True, exist_ok=True)
        lines = [f"[superlink.{CONNECTION}]", f'address = "127.0.0.1:{self.control_port}"']
        if self.tls is None:
            lines.append("insecure = true")
        else:
            lines.append(f'root-certificates = "{self.tls.ca_cert}"')
        if simulation_supernodes:
            lines.append(f"options.num-supernodes = {simulation_supernodes}")
        (self.flwr_home / "config.toml").write_text("\n".join(lines) + "\n")

    def start_supernode(self, index: int, node_config: Mapping[str, Any],
                        extra_args: list[str] | None = None,
                        root_certificates: Path | None = None,
                        env: Mapping[str, str] | None = None) -> None:
        """Start SuperNode ``index`` with its node config (and extra environment ``env``)."""
        port = self.supernode_ports.get(index) or free_port()
        self.supernode_ports[index] = port
        self.node_configs[index] = dict(node_config)
        self.node_args[index] = list(extra_args or [])
        if env is not None:
            self.node_env[index] = dict(env)
        if self.tls is None and root_certificates is None:
            security = ["--insecure"]
        else:
            ca = root_certificates or (self.tls.ca_cert if self.tls else None)
            security = ["--root-certificates", str(ca)]
        command = ([str(bin_dir() / "gpfl"), "supernode"] if self.device_runner
                   else [str(bin_dir() / "flower-supernode")])
        argv = [
            *command, *security,
            "--superlink", f"127.0.0.1:{self.fleet_port}",
            "--port", str(port),
            "--node-config", node_config_arg(node_config),
            *(extra_args or []),
        ]
        self.procs.start(f"supernode-{index}", argv, self.logs / f"supernode-{index}.log",
                         env=child_env({**self._env(), **self.node_env.get(index, {})}))

    # --- SuperNode authentication (deploy/certs.py; deploy owner) ---------------
    def register_supernode(self, public_key: Path, timeout: float = 60) -> str:
        """Register a SuperNode's public key (``flwr supernode register``).

        Needs a SuperLink started with ``--enable-supernode-auth`` (and TLS).
        Returns the CLI's output (it names the node id).
        """
        argv = [str(bin_dir() / "flwr"), "supernode", "register", str(public_key), CONNECTION]
        done = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                              env=child_env({**self._env(), "NO_COLOR": "1"}), timeout=timeout,
                              check=False)
        if done.returncode != 0:
            raise LaunchError(f"could not register {public_key}: {done.stdout}{done.stderr}")
        return done.stdout.strip()

    def stop_supernode(self, index: int) -> None:
        """Stop SuperNode ``index`` and everything it started (a crash, seen from outside)."""
        self.procs.stop(f"supernode-{index}")

    def stop_supernodes(self) -> None:
        """Stop every SuperNode (and what it started): no release is charged after this."""
        for name in [n for n in self.procs.procs if n.startswith("supernode-")]:
            self.procs.stop(name)

    def restart_supernode(self, index: int) -> None:
        """Stop SuperNode ``index`` and start it again with the same node config and flags.

        With SuperNode authentication it comes back with the same key, hence (Flower 1.39) the
        same node id, once the SuperLink lets it activate (:mod:`strategies.identity`).
        """
        self.stop_supernode(index)
        self.start_supernode(index, self.node_configs[index], self.node_args.get(index))

    def submit(self, app_dir: Path, run_config: Mapping[str, Any]) -> subprocess.Popen[str]:
        """``flwr run <app> <connection> --stream``; returns the streaming process.

        The app is handed over as a copy without what its ``.gitignore`` ignores (a
        ``.venv`` inside it made ``flwr run`` walk ~54,000 files first): the same FAB.
        """
        app = stage_app(app_dir, self.flwr_home / "app")
        argv = [str(bin_dir() / "flwr"), "run", str(app), CONNECTION, "--stream"]
        if run_config:
            argv += ["--run-config", format_pairs(run_config)]
        self.logs.mkdir(parents=True, exist_ok=True)
        self.start_serverapp()  # the SuperLink (process isolation) starts none itself
        return self._stream(argv)

    def start_serverapp(self) -> None:
        """Start the process of the next run: its ServerApp, or its simulation.

        It imports Flower, then claims the run the SuperLink holds and serves it; one process
        a run (a previous run's, if still running, is stopped first). Its log:
        ``logs/serverapp.log``.
        """
        self.procs.stop(SERVERAPP)
        argv = [sys.executable, "-m", "deploy.serverapp_runner",
                "--runtime-api-address", f"127.0.0.1:{self.control_port}",
                "--task", "simulation" if self._superlink_args[1] else "serverapp"]
        if self.tls is not None:
            argv += ["--root-certificates", str(self.tls.ca_cert)]
        self.procs.start(SERVERAPP, argv, self.serverapp_log, env=child_env(self._env()))

    @property
    def serverapp_process(self) -> str:
        """Name the process :meth:`start_serverapp` starts, as the launcher's lines name it."""
        if self._superlink_args[1]:
            return "the simulation process (the ServerApp and the virtual SuperNodes, on Ray)"
        return "the ServerApp's process"

    @property
    def serverapp_log(self) -> Path:
        """The log of the launcher's ServerApp process (:meth:`start_serverapp`)."""
        return self.logs / "serverapp.log"

    def _stream(self, argv: list[str]) -> subprocess.Popen[str]:
        """Start a ``flwr`` command whose output the launcher reads, as the ``flwr-run`` process."""
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=child_env({**self._env(), "NO_COLOR": "1", "COLUMNS": "200"}),
            text=True, bufsize=1, start_new_session=True,
        )
        self.procs.procs["flwr-run"] = proc
        self.procs.watchdog.tell()
        return proc

    def follow(self, run_id: int) -> subprocess.Popen[str]:
        """``flwr log <run> <connection> --stream``: the run's log again, from its start.

        How the launcher picks a run up after its SuperLink restarted: ``flwr run --stream``
        ends when the connection drops, the run itself does not.
        """
        argv = [str(bin_dir() / "flwr"), "log", str(run_id), CONNECTION, "--stream"]
        ended = self.procs.procs.pop("flwr-run", None)
        if ended is not None and ended.stdout is not None:
            ended.stdout.close()  # the stream that ended with the old SuperLink
        return self._stream(argv)

    def close(self) -> list[int]:
        """Stop every process of the federation; return PIDs that survived (none)."""
        left = self.procs.stop_all()
        shutil.rmtree(self.flwr_home, ignore_errors=True)
        return left


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def stream_lines(proc: subprocess.Popen[str], log_path: Path,
                 timeout: float) -> Iterator[str]:
    """Yield the streamed log lines of ``flwr run`` (also saved to ``log_path``)."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    timed_out = threading.Event()

    def _watchdog() -> None:
        while proc.poll() is None:
            if time.monotonic() > deadline:
                timed_out.set()
                proc.kill()
                return
            time.sleep(0.5)

    threading.Thread(target=_watchdog, daemon=True).start()
    with open(log_path, "a") as log:
        for raw in proc.stdout:
            line = _ANSI.sub("", raw.rstrip("\n"))
            log.write(line + "\n")
            log.flush()
            yield line
    proc.wait()
    if timed_out.is_set():
        raise LaunchError(f"the run did not finish within {timeout:.0f} s")
