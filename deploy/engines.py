"""The three engines ``gpfl launch`` runs a prepared federation on.

:func:`deploy.launcher.launch` prepares every run the same way (the run directory, the run
config checked against every device's settings, the launch policy file and the devices'
ledger folders, ``launch.json``) into a :class:`Prepared`, then hands it to one engine:

``deployment`` (:class:`DeploymentEngine`)
    A SuperLink and one real SuperNode process per device on this machine, talking gRPC, the
    run submitted with ``flwr run`` and its log streamed (Flower's Deployment Engine).
``simulation`` (:class:`SimulationEngine`)
    A SuperLink that runs virtual SuperNodes on Flower's Simulation Engine (Ray): one machine
    plays thousands of devices, or a Ray cluster plays them.
``direct`` (:class:`DirectEngine`)
    The ServerApp and the ClientApp called in this process (:mod:`deploy.direct_grid`): no
    processes, no gRPC, no Ray; the Simulation Engine's results bit for bit, in a fraction of
    its start-up. The experiments' sweeps run on it.

Each engine says which of the launch's options it takes (:attr:`Engine.options`); an option
given to an engine that does not take it is refused before anything starts, naming the option
and the engine that does.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, cast

from client.policy import POLICY_ENV
from deploy.budget import DeviceBudget, budget_lines, plan_budgets, shapes_of
from deploy.federation import Federation, LaunchError, stream_lines
from deploy.processes import (
    SERVERAPP,
    Liveness,
    ProcessWatch,
    exit_report,
    flower_exit_in,
    stall_seconds,
)
from deploy.raycluster import ray_cluster_env
from deploy.rundir import FINISHED, POLICY_FILE, add_ledgers
from deploy.superlink_state import (
    RESTART_WINDOW_S,
    STARTED,
    fresh_database,
    late_restart_reason,
    superlink_restartable,
)
from mechanisms import make_rng
from server.results import END_LINE, ROUND_TAG, mark_incomplete, plot_summary, write_json_atomic
from server.settings import RunSettings
from settings.extras import MissingExtraError, require_extra
from tasks import load_task

__all__ = ["ENGINES", "DeploymentEngine", "DirectEngine", "Engine", "LaunchResult", "Prepared",
           "SimulationEngine", "make_engine"]


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


@dataclass
class Prepared:
    """A federation prepared by :func:`deploy.launcher.launch`, the same for every engine.

    Attributes
    ----------
    out : Path
        The run directory.
    app_dir : Path
        The Flower app.
    supernodes : int
        Devices (real or virtual).
    config : dict
        The run config, ``out-dir`` included.
    nodes : dict of int to dict
        Each device's node config (``partition-id``, ``num-partitions`` and the launch's own).
    settings : RunSettings
        The run config, checked against every device's settings.
    policy_file : Path
        The launch policy every device applies (``<out>/policy.toml``).
    ledger_paths : list of Path
        The devices' ledgers, read into the summary after the run.
    echo : callable
        Where the per-round lines go.
    timeout : float
        Seconds before the run is abandoned.
    startup_timeout : float
        Seconds from the submission to the ServerApp's first line.
    figure : bool
        Draw ``figure.png`` after the run.
    plans : list of DeviceBudget
        What the devices' budgets pay (:meth:`Engine.plan`), added to the summary.
    """

    out: Path
    app_dir: Path
    supernodes: int
    config: dict[str, Any]
    nodes: dict[int, dict[str, Any]]
    settings: RunSettings
    policy_file: Path
    ledger_paths: list[Path]
    echo: Callable[[str], None]
    timeout: float
    startup_timeout: float
    figure: bool = True
    plans: list[DeviceBudget] = field(default_factory=list)


class Engine:
    """One way of running a prepared federation.

    Subclasses set :attr:`name` and :attr:`options` and implement :meth:`run`.
    """

    #: The ``--engine`` value.
    name: ClassVar[str]
    #: The launch options (keyword arguments of ``launch``) this engine takes, each with what
    #: it needs (said when another engine is given it).
    options: ClassVar[Mapping[str, str]] = {}

    def check(self, settings: RunSettings, supernodes: int, out: Path) -> None:
        """Refuse, before anything starts, a run this engine can never complete."""

    def plan(self, prepared: Prepared) -> list[DeviceBudget]:
        """Say what the devices' budgets pay, before anything starts (default: nothing)."""
        return []

    def run(self, prepared: Prepared) -> LaunchResult:
        """Run the federation to its end; return what it produced."""
        raise NotImplementedError

    def close(self) -> list[int]:
        """Stop whatever the engine started; return the PIDs still running (normally none)."""
        return []


def _finish(prepared: Prepared, summary: dict[str, Any], returncode: int,
            died: Mapping[str, int]) -> LaunchResult:
    """Add the devices' ledgers and the budget plan to the summary; draw the figure."""
    out = prepared.out
    summary = add_ledgers(out, summary, prepared.ledger_paths)
    if prepared.plans:
        summary = {**summary, "budget_plan": {p.name: p.to_dict() for p in prepared.plans}}
        write_json_atomic(out / "summary.json", summary)
    figure = plot_summary(summary, out / "figure.png") if prepared.figure else None
    if summary.get("rounds_completed", 0) == 0 and summary.get("status") not in (
            "incomplete", "budget-exhausted", "devices-failed"):
        raise LaunchError(
            f"no round completed (every client failed or declined); see the logs in "
            f"{out / 'logs'}")
    return LaunchResult(out, summary, figure, returncode, dict(died))


class _FlowerEngine(Engine):
    """An engine of Flower processes: a SuperLink, the run submitted and its log streamed.

    :meth:`start` (the subclass's) starts the SuperLink and whatever plays the devices;
    :meth:`run` submits the app, follows its log with the launch's deadlines
    (:class:`deploy.processes.ProcessWatch`), starts a SuperLink that died again on its
    database where there is one, and reads the results.
    """

    def __init__(self) -> None:
        self.fed: Federation | None = None
        self.on_line: Callable[[str, Federation], None] | None = None

    def federation(self, prepared: Prepared) -> Federation:
        """Make the :class:`Federation` the run's processes belong to."""
        return Federation(workdir=prepared.out)

    def start(self, fed: Federation, prepared: Prepared) -> None:
        """Start the SuperLink and what plays the devices."""
        raise NotImplementedError

    def close(self) -> list[int]:
        """Stop every process of the federation (by PID; closing twice is harmless)."""
        return self.fed.close() if self.fed is not None else []

    def run(self, prepared: Prepared) -> LaunchResult:
        """Start the federation, run the app, and read its results."""
        self.fed = fed = self.federation(prepared)
        self.start(fed, prepared)
        out, echo = prepared.out, prepared.echo
        liveness = Liveness(prepared.startup_timeout,
                            stall_seconds(prepared.settings.round_timeout), fed.serverapp_log)
        proc = fed.submit(prepared.app_dir, prepared.config)
        deadline = time.monotonic() + prepared.timeout
        with ProcessWatch(fed.procs, echo, superlink_restarts=fed.database is not None,
                          liveness=liveness) as watch:
            run_id: int | None = None
            seen: set[str] = set()
            restarts = 0
            late: str | None = None  # why a SuperLink started again could not carry the run on
            while True:
                # After a restart `flwr log` replays the run's log from its start: lines
                # already seen are skipped until the first new one.
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
                    if self.on_line is not None:
                        self.on_line(line, fed)
                watch.check()
                if not superlink_restartable(fed, run_id, restarts):
                    break
                # The ServerApp and the SuperNodes outlive their SuperLink and reconnect to
                # it: started again on its ports and database, it carries the run on.
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
                self._what_ended(proc.returncode, f"the run ended without writing "
                                                  f"{summary_path}")))
        if late is None and restarts and watch.refused:
            late = late_restart_reason(watch.died.get("superlink", 0),
                                       "refused the ServerApp's token")
        # A ServerApp that dies says nothing: its summary still reads "running".
        summary = mark_incomplete(out, self._incomplete_reason(
            watch, late, restarts, proc.returncode)) or json.loads(summary_path.read_text())
        # The devices first: a release in flight when the run ended (a SuperLink killed
        # mid-round) is charged on the device a moment later, and must be in the report.
        fed.stop_supernodes()
        if watch.stop_reason is not None and not summary.get("last_round"):
            # Nothing ran, so nothing can be resumed: the launch failed, and says why.
            raise LaunchError(watch.stop_reason)
        return _finish(prepared, summary, proc.returncode or 0, watch.died)

    def _incomplete_reason(self, watch: ProcessWatch, late: str | None, restarts: int,
                           returncode: int | None) -> str:
        """Say why a run whose summary still reads "running" ended (the most telling cause)."""
        assert self.fed is not None
        if late is not None:
            return late
        if "superlink" in watch.died:
            ended = exit_report("the SuperLink", watch.died["superlink"],
                                self.fed.procs.own_log("superlink"), " during the run")
            return ended + (
                f" (started again {restarts} time(s) on its database)" if restarts else "")
        if watch.stop_reason is not None:
            return watch.stop_reason
        if watch.serverapp_gone:
            return f"{watch.serverapp_exit(' during the run')}; see {self.fed.serverapp_log}"
        return self._what_ended(returncode, "the ServerApp ended before the run did")

    def _what_ended(self, returncode: int | None, otherwise: str) -> str:
        """Name the process that ended a run early, with its code, and where to read why.

        ``returncode`` is ``flwr run``'s; ``otherwise`` starts the line when no process's log
        gives a Flower exit code.

        A Flower process that fails logs its own exit code (``Exit Code: 700``) and exits with
        status 1, while ``flwr run``, which only streams the run's log, ends with 0: the code
        worth reporting is the failed process's, read from its log (the ServerApp's, whose
        process also runs the Simulation Engine, then the SuperLink's). ``flwr run``'s own code
        is reported only when it failed itself.
        """
        assert self.fed is not None
        procs, logs = self.fed.procs, self.fed.logs
        for name, what, log in ((SERVERAPP, self.fed.serverapp_process, self.fed.serverapp_log),
                                ("superlink", "the SuperLink", logs / "superlink.log")):
            text = procs.own_log(name)
            if flower_exit_in(text) is not None:
                proc = procs.procs.get(name)
                code = None if proc is None else proc.poll()
                return f"{exit_report(what, code, text)}; see {log}"
        if returncode:
            return f"{otherwise} (flwr run exited with code {returncode}; see {logs})"
        return f"{otherwise}; see the logs in {logs}"


class DeploymentEngine(_FlowerEngine):
    """A SuperLink and one real SuperNode process per device, on this machine.

    Parameters
    ----------
    tls, auth : bool
        Encrypt every connection with a throw-away CA; authenticate the SuperNodes with a key
        pair each, registered with the SuperLink before they start (implies ``tls``).
    superlink_database : bool
        Keep the SuperLink's state in ``<out>/superlink.db`` and start a SuperLink that dies
        mid-run again on it.
    node_configs, node_env : mapping, optional
        Each SuperNode's extra node config and environment, by index.
    on_line : callable, optional
        Called with every streamed line and the federation (tests stop a process mid-run).
    """

    name = "deployment"
    options: ClassVar[Mapping[str, str]] = {
        "tls": "real SuperNodes (--engine deployment): only processes talk over connections",
        "auth": "real SuperNodes (--engine deployment): each SuperNode process holds its key",
        "superlink_database": "real SuperNodes (--engine deployment; the Simulation Engine's "
                              "SuperLink runs its clients itself and is not restarted)",
        "node_configs": "real SuperNodes (--engine deployment); on the other engines every "
                        "virtual node applies the launch policy (--policy)",
        "node_env": "real SuperNodes (--engine deployment): a virtual node has no process",
        "on_line": "an engine of Flower processes (deployment or simulation)",
    }

    def __init__(self, *, tls: bool = False, auth: bool = False,
                 superlink_database: bool = False,
                 node_configs: Mapping[int, Mapping[str, Any]] | None = None,
                 node_env: Mapping[int, Mapping[str, str]] | None = None,
                 on_line: Callable[[str, Federation], None] | None = None) -> None:
        super().__init__()
        self.tls, self.auth, self.superlink_database = tls or auth, auth, superlink_database
        self.node_env = dict(node_env or {})
        self.on_line = on_line
        self.keys: list[Any] = []

    def check(self, settings: RunSettings, supernodes: int, out: Path) -> None:
        """Refuse a quorum more than the devices can ever reply."""
        if settings.min_replies > supernodes:
            raise LaunchError(f"min-replies={settings.min_replies} can never be reached with "
                              f"--supernodes {supernodes}: a round gets at most one reply a "
                              "device")

    def plan(self, prepared: Prepared) -> list[DeviceBudget]:
        """Print what a release costs each device and how many its cap pays; refuse if none can.

        Each device's settings are resolved as the device resolves them, against the launch
        policy file it will read (:mod:`deploy.budget`).
        """
        settings = prepared.settings
        task = load_task(settings.task_config())
        shapes = shapes_of(task.initial_hypotheses(1, make_rng(settings.seed))[0])
        done = 0
        if settings.resume_from is not None:  # a resumed run asks only for the rounds left
            try:
                done = int(json.loads((settings.resume_from / "summary.json").read_text())
                           .get("last_round", 0))
            except (OSError, ValueError):
                done = 0
        plans = plan_budgets(prepared.config,
                             {i: {"policy-file": str(prepared.policy_file), **node}
                              for i, node in prepared.nodes.items()},
                             shapes, done, settings.num_hypotheses)
        for line in budget_lines(plans):
            prepared.echo(line)
        if plans and all(p.releases == 0 for p in plans) and plans[0].rounds > 0:
            p = plans[0]
            raise LaunchError(
                f"{p.cap_setting}={p.cap:.6g} cannot pay one round: one release costs "
                f"{p.cost:.6g} {p.unit} and the devices have spent {p.spent:.6g}; raise "
                f"{p.cap_setting} (--policy or --node-config) or noise-multiplier")
        return plans

    def federation(self, prepared: Prepared) -> Federation:
        """Make the federation: the launch's certificates, the SuperLink database if asked."""
        tls_files = None
        if self.tls:
            from deploy.certs import make_local_tls, make_supernode_keys

            tls_files = make_local_tls(prepared.out / "certs")
            if self.auth:
                self.keys = make_supernode_keys(prepared.out / "certs" / "supernodes",
                                                prepared.supernodes)
        # A resumed launch starts a fresh database and keeps the earlier one aside.
        return Federation(workdir=prepared.out, tls=tls_files, database=fresh_database(
            prepared.out) if self.superlink_database else None)

    def start(self, fed: Federation, prepared: Prepared) -> None:
        """Start the SuperLink, register the SuperNodes' keys, start the SuperNodes."""
        prepared.echo(f"gpfl: SuperLink + {prepared.supernodes} SuperNodes (gRPC Fleet API), "
                      f"logs in {fed.logs}")
        fed.start_superlink(extra_args=["--enable-supernode-auth"] if self.auth else None)
        for key in self.keys:
            fed.register_supernode(key.public_key)
        for i, node in prepared.nodes.items():
            node = {"policy-file": str(prepared.policy_file), **node}
            fed.start_supernode(i, node, env=self.node_env.get(i), extra_args=(
                ["--auth-supernode-private-key", str(self.keys[i].private_key)]
                if self.auth else None))


class SimulationEngine(_FlowerEngine):
    """A SuperLink running ``supernodes`` virtual SuperNodes on Flower's Simulation Engine.

    Parameters
    ----------
    ray_address : str, optional
        Join the running Ray cluster at this address (its head's ``HOST:PORT``) instead of
        starting a local Ray; default ``$RAY_ADDRESS``, Ray's own variable, where set.
    on_line : callable, optional
        Called with every streamed line and the federation.
    """

    name = "simulation"
    options: ClassVar[Mapping[str, str]] = {
        "ray_address": "--engine simulation (Ray runs the Simulation Engine's virtual nodes; "
                       "real SuperNodes need none)",
        "on_line": DeploymentEngine.options["on_line"],
    }

    def __init__(self, *, ray_address: str | None = None,
                 on_line: Callable[[str, Federation], None] | None = None) -> None:
        super().__init__()
        # Ray's own variable, as `ray.init()` reads it: the experiments join a cluster this way.
        self.ray_address = ray_address or os.environ.get("RAY_ADDRESS") or None
        self.on_line = on_line
        self.cluster_env: dict[str, str] = {}

    def check(self, settings: RunSettings, supernodes: int, out: Path) -> None:
        """Check that Ray is installed and the Ray address, now, before anything starts."""
        try:
            require_extra("simulation", "--engine simulation")
        except MissingExtraError as err:
            raise LaunchError(str(err)) from None
        if self.ray_address is None:
            return
        try:
            self.cluster_env = ray_cluster_env(self.ray_address, out / POLICY_FILE)
        except ValueError as err:
            raise LaunchError(str(err)) from None

    def federation(self, prepared: Prepared) -> Federation:
        """Make the federation; its processes join the Ray cluster, if one is given."""
        fed = Federation(workdir=prepared.out)
        fed.extra_env.update(self.cluster_env)
        return fed

    def start(self, fed: Federation, prepared: Prepared) -> None:
        """Start the SuperLink with its virtual SuperNodes."""
        prepared.echo(f"gpfl: Simulation Engine with {prepared.supernodes} virtual SuperNodes, "
                      f"logs in {fed.logs}")
        # Virtual nodes get no node config of their own: their device settings come from the
        # policy file named by the environment of the process that runs them.
        fed.extra_env[POLICY_ENV] = str(prepared.policy_file)
        fed.start_superlink(simulation_supernodes=prepared.supernodes)


class DirectEngine(Engine):
    """The ServerApp and the ClientApp called in this process (:mod:`deploy.direct_grid`).

    The run's deadlines (``timeout``, ``startup_timeout``) do not apply: in one process nothing
    is late, and nothing can hang but the apps' own code.
    """

    name = "direct"

    def run(self, prepared: Prepared) -> LaunchResult:
        """Call the ServerApp with a grid whose instructions the ClientApp answers here."""
        # Flower's database layer (alembic) logs each plugin it sets up, at INFO, when first
        # imported below; the other engines' processes keep such lines in their own logs.
        logging.getLogger("alembic").setLevel(logging.WARNING)
        # Imported here, as the other engines' processes import them: Flower and the apps
        # load only when a run does.
        from flwr.app import Context, Message, RecordDict
        from flwr.supercore.run import Run

        from client.app import app as client_app
        from deploy.direct_grid import DirectGrid, policy_env, run_logging
        from server.app import app as server_app
        from settings import federation_defaults

        out = prepared.out
        (out / "logs").mkdir(exist_ok=True)
        # What `flwr run` does with the app's [tool.flwr.app.config]: the run config over the
        # declared defaults (a test keeps the two alike).
        config = {**federation_defaults(), **prepared.config}
        run = Run.create_empty(run_id=secrets.randbits(63) or 1)
        grid = DirectGrid(cast(Callable[[Message, Context], Message], client_app), run,
                          prepared.nodes.values(), config)
        context = Context(run_id=run.run_id, node_id=0, node_config={}, state=RecordDict(),
                          run_config=config)
        with run_logging(out / "logs" / "flwr-run.log", prepared.echo), \
                policy_env(prepared.policy_file):
            try:
                server_app(grid, context)
            except Exception as err:  # the summary says how far it got
                prepared.echo(f"ERROR the ServerApp raised {type(err).__name__}: {err}")
        summary = mark_incomplete(out, "the ServerApp ended before the run did (see logs)")
        if summary is None:
            raise LaunchError(f"the run ended without writing {out / 'summary.json'}; see "
                              f"{out / 'logs'}")
        return _finish(prepared, summary, 0, {})


#: How an option is given where it is not its keyword: ``gpfl launch``'s flag.
_FLAGS = {"node_configs": "--node-config", "node_env": "node_env", "on_line": "on_line"}

#: The engines by ``--engine`` name.
ENGINES: dict[str, type[Engine]] = {
    engine.name: engine for engine in (DeploymentEngine, SimulationEngine, DirectEngine)}


def make_engine(name: str, options: Mapping[str, Any]) -> Engine:
    """Return the engine ``name`` with ``options`` (those given: not None, False or empty).

    Raises
    ------
    LaunchError
        If ``name`` is no engine, or an option is given that the engine does not take (the
        message names the option and what takes it).
    """
    if name not in ENGINES:
        raise LaunchError(f"--engine {name!r} is not an engine; choose one of "
                          f"{', '.join(ENGINES)}")
    engine = ENGINES[name]
    for option, value in options.items():
        if value not in (None, False, {}, []) and option not in engine.options:
            needs = next((e.options[option] for e in ENGINES.values() if option in e.options),
                         "another engine")
            flag = _FLAGS.get(option, "--" + option.replace("_", "-"))
            raise LaunchError(f"{flag} needs {needs}; not --engine {name}")
    return engine(**{k: v for k, v in options.items() if k in engine.options})
