"""`gpfl launch`: a federation of real Flower processes on this machine.

One SuperLink and N SuperNodes run as separate OS processes talking gRPC (the
Fleet API), the run is submitted with ``flwr run`` and its log streamed; every
process is stopped at the end, on failure and on Ctrl-C. Ports are picked free,
so two launches can run side by side.
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from client.policy import POLICY_ENV, PolicyError
from deploy.budget import DeviceBudget, budget_lines, plan_budgets, shapes_of
from deploy.federation import (
    CONNECTION,
    Federation,
    LaunchError,
    free_port,
    node_config_arg,
    project_root,
    stream_lines,
    wait_for_port,
)
from deploy.processes import STARTUP_TIMEOUT_S, Liveness, ProcessWatch, stall_seconds
from deploy.raycluster import ray_cluster_env
from deploy.rundir import FINISHED, POLICY_FILE, add_ledgers, save_launch, write_policy
from deploy.superlink_state import (
    RESTART_WINDOW_S,
    STARTED,
    SUPERLINK_DATABASE,
    fresh_database,
    late_restart_reason,
    superlink_restartable,
)
from mechanisms import make_rng
from server.checkpoint import CHECKPOINT_NAME
from server.results import END_LINE, ROUND_TAG, mark_incomplete, plot_summary, write_json_atomic
from server.settings import RunSettings, check_launch
from settings import SettingError
from tasks import load_task

#: Federation and its helpers are re-exported: tests and experiments drive both from here.
__all__ = [
    "CONNECTION",
    "SUPERLINK_DATABASE",
    "Federation",
    "LaunchError",
    "LaunchResult",
    "describe",
    "free_port",
    "launch",
    "node_config_arg",
    "project_root",
    "stream_lines",
    "wait_for_port",
]


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




def _plan_budgets(settings: RunSettings, config: Mapping[str, Any],
                  nodes: Mapping[int, Mapping[str, Any]], policy_file: Path,
                  echo: Callable[[str], None]) -> list[DeviceBudget]:
    """Print what a release costs each device and how many its cap pays; refuse if none can.

    Each device's settings are resolved as the device resolves them, against the launch
    policy file it will read (:mod:`deploy.budget`).
    """
    task = load_task(settings.task_config())
    shapes = shapes_of(task.initial_hypotheses(1, make_rng(settings.seed))[0])
    done = 0
    if settings.resume_from is not None:  # a resumed run asks only for the rounds left
        try:
            done = int(json.loads((settings.resume_from / "summary.json").read_text())
                       .get("last_round", 0))
        except (OSError, ValueError):
            done = 0
    plans = plan_budgets(config, {i: {"policy-file": str(policy_file), **node}
                                  for i, node in nodes.items()}, shapes, done,
                          settings.num_hypotheses)
    for line in budget_lines(plans):
        echo(line)
    if plans and all(p.releases == 0 for p in plans) and plans[0].rounds > 0:
        p = plans[0]
        raise LaunchError(
            f"{p.cap_setting}={p.cap:.6g} cannot pay one round: one release costs "
            f"{p.cost:.6g} {p.unit} and the devices have spent {p.spent:.6g}; raise "
            f"{p.cap_setting} (--policy or --node-config) or noise-multiplier")
    return plans


def _check_writable(folder: Path) -> None:
    """Refuse, at start, a ledger folder the devices could not write.

    Each device would otherwise fail every round, after training, with a generic reason.
    """
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".gpfl-check-"):
            pass
    except OSError as err:
        raise LaunchError(f"ledger-dir={str(folder)!r} is not writable: {err.strerror or err}; "
                          "give a folder the devices can write") from None


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
    ray_address: str | None = None,
    superlink_database: bool = False,
    timeout: float = 3600.0,
    startup_timeout: float = STARTUP_TIMEOUT_S,
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
        SuperNodes start; the run config's ``node-identity`` defaults to ``"key"``.
    simulation : bool
        Run the same apps on Flower's Simulation Engine (Ray) with ``supernodes``
        virtual SuperNodes instead of real SuperNode processes.
    ray_address : str, optional
        With ``simulation``: join the running Ray cluster at this address (its head's
        ``HOST:PORT``, as ``ray start --address`` takes it) instead of starting a local Ray
        (default: ``$RAY_ADDRESS``, Ray's own variable, where set).
        The virtual nodes then run on the cluster's nodes, which must have this environment
        installed (same paths) and see the run directory (ledgers, policy) at the same path.
    superlink_database : bool
        Keep the SuperLink's state in Flower's persistent database (``<out>/superlink.db``):
        a SuperLink that dies mid-run is started again on it and the same run goes on. Off by
        default: Flower's SQLite state makes every request a database transaction, and a round
        of 20 SuperNodes on 2 cores takes about twice as long (docs/SCALE.md); without it a
        dead SuperLink ends the run incomplete, and ``--resume`` continues it from the
        server's checkpoint.
    timeout : float
        Seconds before the run is abandoned (everything is still stopped).
    startup_timeout : float
        Seconds from the submission to the ServerApp's first line before the launch is given
        up (:data:`STARTUP_TIMEOUT_S`). Once it runs, a run with no round for
        :func:`stall_seconds` (three round deadlines and two minutes) is given up too.
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
    if not startup_timeout > 0:
        raise LaunchError(f"--startup-timeout must be a positive number of seconds, got "
                          f"{startup_timeout}")
    if auth and simulation:
        raise LaunchError("--auth needs real SuperNodes (the deployment engine)")
    if simulation and ray_address is None:
        # Ray's own variable, as `ray.init()` reads it: the experiments join a cluster this way.
        ray_address = os.environ.get("RAY_ADDRESS") or None
    if superlink_database and simulation:
        raise LaunchError("--superlink-database needs real SuperNodes (the Simulation Engine's "
                          "SuperLink runs its clients itself and is not restarted)")
    if ray_address is not None and not simulation:
        raise LaunchError(f"--ray-address {ray_address!r} needs --engine simulation (Ray runs "
                          "the Simulation Engine's virtual nodes; real SuperNodes need none)")
    app_dir = (app_dir or project_root()).resolve()
    out = (out_dir or Path("runs") / time.strftime("%Y%m%d-%H%M%S")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    config = dict(run_config or {})
    config["out-dir"] = str(out)
    if auth:  # the SuperLink binds each key to one node id, the device (strategies.identity)
        config.setdefault("node-identity", "key")
    if policy and "policy-file" in policy:
        raise LaunchError(f"policy-file={policy['policy-file']!r} cannot be part of --policy: "
                          "the launch policy is itself the devices' policy file; give the file "
                          "as --policy FILE.toml")
    device_policy = {"ledger-dir": str(out / "ledgers"), **(policy or {})}
    nodes = {i: {"partition-id": i, "num-partitions": supernodes,
                 **(node_configs or {}).get(i, {})} for i in range(supernodes)}
    try:
        run_settings = check_launch(config, device_policy, nodes.values())
    except SettingError as err:
        raise LaunchError(str(err)) from None
    try:
        cluster_env = ray_cluster_env(ray_address, out / POLICY_FILE) if ray_address else {}
    except ValueError as err:
        raise LaunchError(str(err)) from None
    if simulation and node_configs:
        raise LaunchError("--node-config needs real SuperNodes; on the Simulation Engine every "
                          "virtual node applies the launch policy (--policy)")
    if not simulation and run_settings.min_replies > supernodes:
        raise LaunchError(f"min-replies={run_settings.min_replies} can never be reached with "
                          f"--supernodes {supernodes}: a round gets at most one reply a device")
    unused = sorted((set(node_configs or {}) | set(node_env or {})) - set(nodes))
    if unused:
        raise LaunchError(f"--node-config names SuperNodes {unused}, but there are only "
                          f"{supernodes} (0..{supernodes - 1})")
    save_launch(out, {"supernodes": supernodes, "run_config": config,
                      "node_configs": node_configs, "policy": policy, "app_dir": app_dir,
                      "tls": tls, "auth": auth, "simulation": simulation,
                      "ray_address": ray_address, "superlink_database": superlink_database,
                      "node_env": node_env})
    try:
        policy_file, ledger_paths = write_policy(out, device_policy, nodes.values())
        for path in ledger_paths:
            _check_writable(path.parent)
        plans = [] if simulation else _plan_budgets(run_settings, config, nodes, policy_file,
                                                    echo)
    except PolicyError as err:  # a policy file a node config names: unreadable, bad values
        raise LaunchError(str(err)) from None
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    in_main = threading.current_thread() is threading.main_thread()
    if in_main:
        for s in previous:
            signal.signal(s, _raise_on_signal)
    tls_files = None
    keys: list[Any] = []
    if tls or auth:
        from deploy.certs import make_local_tls, make_supernode_keys

        tls_files = make_local_tls(out / "certs")
        if auth:
            keys = make_supernode_keys(out / "certs" / "supernodes", supernodes)
    # A resumed launch starts a fresh database and keeps the earlier one aside (fresh_database).
    fed = Federation(workdir=out, tls=tls_files,
                     database=fresh_database(out) if superlink_database else None)
    fed.extra_env.update(cluster_env)
    left: list[int] = []
    try:
        return _run(fed, out, simulation=simulation, supernodes=supernodes, nodes=nodes,
                    policy_file=policy_file, node_env=node_env, keys=keys, auth=auth,
                    app_dir=app_dir, config=config, echo=echo, timeout=timeout,
                    on_line=on_line, ledger_paths=ledger_paths,
                    liveness=Liveness(startup_timeout, stall_seconds(run_settings.round_timeout),
                                      fed.serverapp_log), plans=plans)
    except KeyboardInterrupt:
        # Ctrl-C or SIGTERM: the summary must not stay "running", and the run can go on. Stop
        # first (closing twice is harmless): the ServerApp rewrites the summary every round.
        left = fed.close()
        mark_incomplete(out, "interrupted (Ctrl-C or SIGTERM)")
        if (out / CHECKPOINT_NAME).is_file():
            echo(f"gpfl: interrupted; continue it with `gpfl launch --resume {out}`")
        raise
    finally:
        left = fed.close() or left
        if left:
            echo(f"gpfl: could not stop PIDs {left}")
        if in_main:
            for s, handler in previous.items():
                signal.signal(s, handler)


def _run(fed: Federation, out: Path, *, simulation: bool, supernodes: int,
         nodes: dict[int, dict[str, Any]], policy_file: Path, node_env: Any, keys: list[Any],
         auth: bool, app_dir: Path, config: dict[str, Any], echo: Callable[[str], None],
         timeout: float, on_line: Any, ledger_paths: list[Path],
         liveness: Liveness, plans: list[DeviceBudget]) -> LaunchResult:
    """Start the federation, run the app, and read its results (:func:`launch`'s body)."""
    if simulation:
        echo(f"gpfl: Simulation Engine with {supernodes} virtual SuperNodes, "
             f"logs in {fed.logs}")
        # Virtual nodes get no node config of their own: their device settings come
        # from the policy file named by the environment of the process that runs them.
        fed.extra_env[POLICY_ENV] = str(policy_file)
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
    deadline = time.monotonic() + timeout
    with ProcessWatch(fed.procs, echo, superlink_restarts=fed.database is not None,
                      liveness=liveness) as watch:
        run_id: int | None = None
        seen: set[str] = set()
        restarts = 0
        late: str | None = None  # why a SuperLink started again could not carry the run on
        while True:
            # After a restart `flwr log` replays the run's log from its start: lines already
            # seen are skipped until the first new one.
            replay = restarts > 0
            for line in stream_lines(proc, fed.logs / "flwr-run.log",
                                     max(1.0, deadline - time.monotonic())):
                started = STARTED.search(line)
                if started and run_id is None:
                    run_id = int(started.group(1))
                if replay and line in seen:
                    continue
                replay = False
                seen.add(line)
                watch.saw(line)
                if END_LINE in line:
                    pass  # the launcher's own closing lines say it (describe)
                elif ROUND_TAG in line:
                    echo(line[line.index(ROUND_TAG):])
                elif "ERROR" in line or "Traceback" in line:
                    echo(line)
                if on_line is not None:
                    on_line(line, fed)
            watch.check()
            if not superlink_restartable(fed, run_id, restarts):
                break
            # The ServerApp and the SuperNodes outlive their SuperLink and reconnect to it:
            # started again on its ports and database, it carries the run on.
            restarts += 1
            try:
                fed.restart_superlink(timeout=RESTART_WINDOW_S)
            except LaunchError as exc:
                late = late_restart_reason(watch.died["superlink"], "did not answer ("
                                           + str(exc).splitlines()[0] + ")")
                break
            assert run_id is not None
            proc = fed.follow(run_id)
            watch.resumed()
    summary_path = out / "summary.json"
    status = (json.loads(summary_path.read_text()).get("status", "running")
              if summary_path.exists() else "running")
    watch.after_stream(finished=status != "running")
    if not summary_path.exists():
        raise LaunchError(watch.stop_reason or (
            f"the run ended (flwr run exit code {proc.returncode}) without writing "
            f"{summary_path}; see {fed.logs}"))
    if late is None and restarts and watch.refused:
        late = late_restart_reason(watch.died.get("superlink", 0),
                                   "refused the ServerApp's token")
    if late is not None:
        reason = late
    elif "superlink" in watch.died:
        reason = f"the SuperLink exited (code {watch.died['superlink']}) during the run" + (
            f" (started again {restarts} time(s) on its database)" if restarts else "")
    elif watch.stop_reason is not None:
        reason = watch.stop_reason
    elif watch.serverapp_gone:
        reason = f"the ServerApp exited during the run (its process ended; see {fed.logs})"
    else:
        reason = (f"the ServerApp ended before the run did (flwr run exit code "
                  f"{proc.returncode}; see {fed.logs / 'flwr-run.log'})")
    # A ServerApp that dies says nothing: its summary still reads "running".
    summary = mark_incomplete(out, reason) or json.loads(summary_path.read_text())
    # The devices first: a release in flight when the run ended (a SuperLink killed
    # mid-round) is charged on the device a moment later, and must be in the report.
    fed.stop_supernodes()
    if watch.stop_reason is not None and not summary.get("last_round"):
        # Nothing ran, so nothing can be resumed: the launch failed, and says why.
        raise LaunchError(watch.stop_reason)
    summary = add_ledgers(out, summary, ledger_paths)
    if plans:
        summary = {**summary, "budget_plan": {p.name: p.to_dict() for p in plans}}
        write_json_atomic(out / "summary.json", summary)
    figure = plot_summary(summary, out / "figure.png")
    if summary.get("rounds_completed", 0) == 0 and summary.get("status") not in (
            "incomplete", "budget-exhausted", "devices-failed"):
        raise LaunchError(
            f"no round completed (every client failed or declined); see the SuperNode "
            f"logs in {fed.logs}"
        )
    return LaunchResult(out, summary, figure, proc.returncode or 0, dict(watch.died))


def _number(value: Any) -> str:
    """Format a spend for people: 6 significant digits (a sum of 0.4s prints 6.8)."""
    return "-" if value is None else f"{float(value):.6g}"


def _hypotheses_line(hypotheses: list[list[float]] | dict[str, Any], out: Path) -> str:
    """Say the delivered hypotheses in a line: their first numbers, or where a large model's are."""
    if isinstance(hypotheses, dict):  # server.results.hypotheses_entry: in the checkpoint
        k, n = hypotheses["shape"]
        return (f"gpfl: hypotheses: {k} of {n} parameters, array {hypotheses['array']!r} of "
                f"{out / hypotheses['checkpoint']}")
    return "gpfl: hypotheses " + "; ".join(
        "[" + ", ".join(f"{v:.3f}" for v in h[:6]) + (", ..." if len(h) > 6 else "") + "]"
        for h in hypotheses)


def describe(result: LaunchResult) -> str:
    """Return the closing lines printed after a launch."""
    s = result.summary
    priv = s.get("privacy", {})
    # The devices' ledgers, where the launch could read them: they hold every charged release,
    # also one whose round was lost, which no report reached the server with.
    spend = s.get("ledgers") or priv
    source = "devices' ledgers" if s.get("ledgers") else "as reported"
    lines = [
        f"gpfl: {s.get('last_round', s.get('rounds_completed'))} rounds"
        # A round with too few usable replies keeps the hypotheses: say so, not "1 rounds".
        + (f" ({s.get('rounds_completed')} changed the hypotheses)"
           if s.get("last_round", s.get("rounds_completed")) != s.get("rounds_completed") else "")
        + (" (stopped early: no improvement)" if s.get("stopped_early") else ""),
        f"gpfl: best validation loss {s.get('best_val_loss')}",
        _hypotheses_line(s.get("hypotheses") or [], result.out_dir),
        *([] if not s.get("optima_distances") else [
            "gpfl: distance from each optimum to its nearest hypothesis: "
            + ", ".join(f"{d:.3f}" for d in s["optima_distances"])]),
        f"gpfl: privacy spend ({priv.get('unit')}; {source}): "
        f"median {_number(spend.get('median'))}, max {_number(spend.get('max'))}",
        f"gpfl: results in {result.out_dir}/summary.json"
        + (f", figure {result.figure}" if result.figure else ""),
    ]
    if result.died:
        lines.append("gpfl: exited during the run: " + ", ".join(
            f"{name} (code {code})" for name, code in sorted(result.died.items())))
    failing = s.get("devices", {}).get("failing") or {}
    if failing and result.status != "devices-failed":
        lines.append("gpfl: devices that failed every round they were asked: " + ", ".join(
            f"{name} ({kind})" for name, kind in failing.items()))
    if result.status == "diverged":
        lines.append(f"gpfl: run diverged: {s.get('incomplete_reason')}")
    elif result.status in ("budget-exhausted", "devices-failed"):
        lines.append(f"gpfl: run {result.status}: {s.get('incomplete_reason')}")
    elif not result.finished:
        lines.append(f"gpfl: run incomplete: {s.get('incomplete_reason')}; continue it with "
                     f"`gpfl launch --resume {result.out_dir}`")
    return "\n".join(lines)

