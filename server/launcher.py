"""`gpfl launch`: a federation of real Flower processes on this machine.

One SuperLink and N SuperNodes run as separate OS processes talking gRPC (the
Fleet API), the run is submitted with ``flwr run`` and its log streamed; every
process is stopped at the end, on failure and on Ctrl-C. Ports are picked free,
so two launches can run side by side.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from server.certs import TlsFiles
from server.processes import ProcessSet, ProcessWatch, bin_dir, child_env
from server.results import ROUND_TAG, mark_incomplete, plot_summary
from server.rundir import FINISHED, add_ledgers, save_launch
from settings import SettingError, check_node_config, check_run_config
from settings.render import toml_value

logger = logging.getLogger(__name__)

#: The connection name written into the launch's private FLWR_HOME.
CONNECTION = "gpfl-local"


class LaunchError(RuntimeError):
    """The federation could not be started, or the run failed."""


def project_root() -> Path:
    """Return the folder holding gpfl's ``pyproject.toml`` (the Flower app)."""
    root = Path(__file__).resolve().parent.parent
    if not (root / "pyproject.toml").is_file():
        raise LaunchError(
            f"no pyproject.toml next to the installed packages ({root}); `gpfl launch` runs "
            "the Flower app from a source checkout: pass --app PATH"
        )
    return root


def free_port() -> int:
    """Return a TCP port that is free on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
    return " ".join(f"{k}={toml_value(v)}" for k, v in config.items())


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
    flwr_home: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="gpfl-flwr-")))
    #: Environment added to every process (e.g. ``GPFL_POLICY`` for virtual nodes).
    extra_env: dict[str, str] = field(default_factory=dict)
    #: SuperNodes run as devices do: ``gpfl supernode`` (the device's own gpfl client in one
    #: warm executor; runs of other apps refused). ``False``: Flower's plain ``flower-supernode``,
    #: which installs and runs the FAB of any run in a new process per message (the bench's
    #: FedAvg baseline needs it).
    device_runner: bool = True

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
        (Ray) with that many virtual SuperNodes instead of a Fleet API.
        """
        self.control_port = free_port()
        log = self.logs / "superlink.log"
        argv = [
            str(bin_dir() / "flower-superlink"), *self._security_args(),
            "--disable-runtime-dependency-installation",
            "--host", "127.0.0.1", "--port", str(self.control_port),
        ]
        if simulation_supernodes:
            argv.append("--simulation")
        else:
            self.fleet_port = free_port()
            argv += ["--fleet-api-address", f"127.0.0.1:{self.fleet_port}"]
        proc = self.procs.start("superlink", [*argv, *(extra_args or [])], log,
                                env=child_env(self._env()))
        if self.fleet_port:
            wait_for_port(self.fleet_port, timeout, proc, log)
        wait_for_port(self.control_port, timeout, proc, log)
        self._write_connection(simulation_supernodes)

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

    # --- SuperNode authentication (server/certs.py; deploy owner) ---------------
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

    def restart_supernode(self, index: int) -> None:
        """Stop SuperNode ``index`` and start it again with the same node config."""
        self.stop_supernode(index)
        self.start_supernode(index, self.node_configs[index])

    def submit(self, app_dir: Path, run_config: Mapping[str, Any]) -> subprocess.Popen[str]:
        """``flwr run <app> <connection> --stream``; returns the streaming process."""
        argv = [str(bin_dir() / "flwr"), "run", str(app_dir), CONNECTION, "--stream"]
        if run_config:
            argv += ["--run-config", " ".join(f"{k}={toml_value(v)}"
                                              for k, v in run_config.items())]
        self.logs.mkdir(parents=True, exist_ok=True)
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=child_env({**self._env(), "NO_COLOR": "1", "COLUMNS": "200"}),
            text=True, bufsize=1, start_new_session=True,
        )
        self.procs.procs["flwr-run"] = proc
        return proc

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


@dataclass
class LaunchResult:
    """What a launch produced.

    ``died`` names the processes that exited while the run went on (``supernode-1``: exit
    code), ``status`` is the summary's (``complete``, ``stopped-early`` or ``incomplete``).
    """

    out_dir: Path
    summary: dict[str, Any]
    figure: Path | None
    returncode: int
    died: dict[str, int] = field(default_factory=dict)

    @property
    def status(self) -> str:
        """The run's status as its summary says it."""
        return str(self.summary.get("status", "running"))

    @property
    def finished(self) -> bool:
        """Whether the run did all it was asked to (every round, or stopped early)."""
        return self.status in FINISHED


def _raise_on_signal(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def launch(
    *,
    supernodes: int = 10,
    run_config: Mapping[str, Any] | None = None,
    out_dir: Path | None = None,
    node_configs: Mapping[int, Mapping[str, Any]] | None = None,
    policy: Mapping[str, Any] | None = None,
    app_dir: Path | None = None,
    tls: bool = False,
    auth: bool = False,
    simulation: bool = False,
    timeout: float = 3600.0,
    echo: Callable[[str], None] = print,
    on_line: Callable[[str, Federation], None] | None = None,
    node_env: Mapping[int, Mapping[str, str]] | None = None,
) -> LaunchResult:
    """Run a whole federation of real processes and collect its results.

    Parameters
    ----------
    supernodes : int
        Number of SuperNodes (clients); node ``i`` gets ``partition-id=i``.
    run_config : Mapping[str, Any], optional
        Overrides of ``[tool.flwr.app.config]``.
    out_dir : Path, optional
        The run directory (default ``runs/<timestamp>``).
    node_configs : Mapping[int, Mapping[str, Any]], optional
        Extra node config per SuperNode index (its own budget, cap, ledger...).
    policy : Mapping[str, Any], optional
        Device settings every SuperNode (or, on the Simulation Engine, every virtual node)
        applies: written to ``<out>/policy.toml`` and named as their policy file. The launcher
        plays the device owners of its local federation, so each device's ledger defaults to
        ``<out>/ledgers`` unless ``ledger-dir`` is given.
    app_dir : Path, optional
        The Flower app (default: this checkout).
    tls : bool
        Encrypt every connection with a throw-away CA made for this launch.
    auth : bool
        SuperNode authentication (implies ``tls``): a key pair per SuperNode is
        made for this launch and registered with the SuperLink before the
        SuperNodes start.
    simulation : bool
        Run the same apps on Flower's Simulation Engine (Ray) with ``supernodes``
        virtual SuperNodes instead of real SuperNode processes.
    timeout : float
        Seconds before the run is abandoned (everything is still stopped).
    echo : Callable[[str], None]
        Where the per-round lines go.
    on_line : Callable[[str, Federation], None], optional
        Called with every streamed line (tests use it to stop a SuperNode mid-run).
    node_env : Mapping[int, Mapping[str, str]], optional
        Extra environment of SuperNode ``i`` (e.g. ``CUDA_VISIBLE_DEVICES`` to give each its
        own GPU).

    Returns
    -------
    LaunchResult
        ``status`` is ``incomplete`` when the run did not do all its rounds (server killed,
        ServerApp crashed, too few devices); the summary then says why, and
        ``gpfl launch --resume <out>`` continues it.

    Raises
    ------
    LaunchError
        If a setting is invalid (before any process starts), a process cannot start, the run
        ends without a summary, or no round completed.
    """
    if supernodes < 1:
        raise LaunchError(f"--supernodes must be >= 1, got {supernodes}")
    if auth and simulation:
        raise LaunchError("--auth needs real SuperNodes (the deployment engine)")
    app_dir = (app_dir or project_root()).resolve()
    out = (out_dir or Path("runs") / time.strftime("%Y%m%d-%H%M%S")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    config = dict(run_config or {})
    config["out-dir"] = str(out)
    device_policy = {"ledger-dir": str(out / "ledgers"), **(policy or {})}
    nodes = {i: {"partition-id": i, "num-partitions": supernodes,
                 **(node_configs or {}).get(i, {})} for i in range(supernodes)}
    try:
        # Everything is checked before any process starts: a bad key or value fails here,
        # within a second, naming the key, the value and what is allowed.
        check_run_config(config)
        check_node_config(device_policy, source="launch policy")
        for i, node in nodes.items():
            check_node_config(node, source=f"node config of SuperNode {i}")
    except SettingError as err:
        raise LaunchError(str(err)) from None
    if simulation and node_configs:
        raise LaunchError("--node-config needs real SuperNodes; on the Simulation Engine every "
                          "virtual node applies the launch policy (--policy)")
    unused = sorted((set(node_configs or {}) | set(node_env or {})) - set(nodes))
    if unused:
        raise LaunchError(f"--node-config names SuperNodes {unused}, but there are only "
                          f"{supernodes} (0..{supernodes - 1})")
    save_launch(out, {"supernodes": supernodes, "run_config": config,
                      "node_configs": node_configs, "policy": policy, "app_dir": app_dir,
                      "tls": tls, "auth": auth, "simulation": simulation,
                      "node_env": node_env})
    policy_file = out / "policy.toml"
    policy_file.write_text("".join(f"{k} = {toml_value(v)}\n" for k, v in device_policy.items()))
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    in_main = threading.current_thread() is threading.main_thread()
    if in_main:
        for s in previous:
            signal.signal(s, _raise_on_signal)
    tls_files = None
    keys: list[Any] = []
    if tls or auth:
        from server.certs import make_local_tls, make_supernode_keys

        tls_files = make_local_tls(out / "certs")
        if auth:
            keys = make_supernode_keys(out / "certs" / "supernodes", supernodes)
    fed = Federation(workdir=out, tls=tls_files)
    try:
        if simulation:
            echo(f"gpfl: Simulation Engine with {supernodes} virtual SuperNodes, "
                 f"logs in {fed.logs}")
            # Virtual nodes get no node config of their own: their device settings come
            # from the policy file named by the environment of the process that runs them.
            fed.extra_env["GPFL_POLICY"] = str(policy_file)
            fed.start_superlink(simulation_supernodes=supernodes)
        else:
            echo(f"gpfl: SuperLink + {supernodes} SuperNodes (gRPC Fleet API), logs in {fed.logs}")
            fed.start_superlink(extra_args=["--enable-supernode-auth"] if auth else None)
            for key in keys:
                fed.register_supernode(key.public_key)
            for i, node in nodes.items():
                node = {"policy-file": str(policy_file), **node}
                fed.start_supernode(i, node, env=(node_env or {}).get(i), extra_args=(
                    ["--auth-supernode-private-key", str(keys[i].private_key)] if auth else None))
        proc = fed.submit(app_dir, config)
        with ProcessWatch(fed.procs, echo) as watch:
            for line in stream_lines(proc, fed.logs / "flwr-run.log", timeout):
                if ROUND_TAG in line:
                    echo(line[line.index(ROUND_TAG):])
                elif "ERROR" in line or "Traceback" in line:
                    echo(line)
                if on_line is not None:
                    on_line(line, fed)
        watch.check()
        summary_path = out / "summary.json"
        if not summary_path.exists():
            raise LaunchError(
                f"the run ended (flwr run exit code {proc.returncode}) without writing "
                f"{summary_path}; see {fed.logs}"
            )
        if "superlink" in watch.died:
            reason = f"the SuperLink exited (code {watch.died['superlink']}) during the run"
        else:
            reason = (f"the ServerApp ended before the run did (flwr run exit code "
                      f"{proc.returncode}; see {fed.logs / 'flwr-run.log'})")
        # A ServerApp that dies says nothing: its summary still reads "running".
        summary = mark_incomplete(out, reason) or json.loads(summary_path.read_text())
        summary = add_ledgers(out, summary, Path(str(device_policy["ledger-dir"])).expanduser())
        figure = plot_summary(summary, out / "figure.png")
        if summary.get("rounds_completed", 0) == 0 and summary.get("status") != "incomplete":
            raise LaunchError(
                f"no round completed (every client failed or declined); see the SuperNode "
                f"logs in {fed.logs}"
            )
        return LaunchResult(out, summary, figure, proc.returncode or 0, dict(watch.died))
    finally:
        left = fed.close()
        if left:
            echo(f"gpfl: could not stop PIDs {left}")
        if in_main:
            for s, handler in previous.items():
                signal.signal(s, handler)


def describe(result: LaunchResult) -> str:
    """Return the closing lines printed after a launch."""
    s = result.summary
    priv = s.get("privacy", {})
    # The devices' ledgers, where the launch could read them: they hold every charged release,
    # also one whose round was lost, which no report reached the server with.
    spend = s.get("ledgers") or priv
    source = "devices' ledgers" if s.get("ledgers") else "as reported"
    lines = [
        f"gpfl: {s.get('rounds_completed')} rounds"
        + (" (stopped early: no improvement)" if s.get("stopped_early") else ""),
        f"gpfl: best validation loss {s.get('best_val_loss')}",
        "gpfl: hypotheses " + "; ".join(
            "[" + ", ".join(f"{v:.3f}" for v in h[:6]) + (", ..." if len(h) > 6 else "") + "]"
            for h in s.get("hypotheses", [])),
        f"gpfl: privacy spend ({priv.get('unit')}; {source}): median {spend.get('median')}, "
        f"max {spend.get('max')}",
        f"gpfl: results in {result.out_dir}/summary.json"
        + (f", figure {result.figure}" if result.figure else ""),
    ]
    if result.died:
        lines.append("gpfl: exited during the run: " + ", ".join(
            f"{name} (code {code})" for name, code in sorted(result.died.items())))
    if not result.finished:
        lines.append(f"gpfl: run incomplete: {s.get('incomplete_reason')}; continue it with "
                     f"`gpfl launch --resume {result.out_dir}`")
    return "\n".join(lines)

