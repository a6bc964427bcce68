"""`gpfl launch`: a federation on this machine, on one of three engines.

:func:`launch` prepares every run the same way (the run directory, the run config checked
against every device's settings before anything starts, the launch policy file and the
devices' ledger folders, ``launch.json`` for ``--resume``) and hands it to an engine
(:mod:`deploy.engines`): real Flower processes talking gRPC (``deployment``, the default),
Flower's Simulation Engine (``simulation``), or the ServerApp and ClientApp in this process
(``direct``). Every process is stopped at the end, on failure and on Ctrl-C. Ports are picked
free, so two launches can run side by side.
"""

from __future__ import annotations

import signal
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import FrameType
from typing import Any

from client.policy import PolicyError
from deploy.engines import ENGINES, LaunchResult, Prepared, make_engine
from deploy.fab import installed_app
from deploy.federation import (
    CONNECTION,
    Federation,
    LaunchError,
    checkout_root,
    free_port,
    node_config_arg,
    project_root,
    stream_lines,
    wait_for_port,
)
from deploy.processes import STARTUP_TIMEOUT_S
from deploy.rundir import save_launch, write_policy
from deploy.superlink_state import SUPERLINK_DATABASE
from server.checkpoint import CHECKPOINT_NAME
from server.results import mark_incomplete
from server.settings import check_launch
from settings import SettingError

#: Federation and its helpers are re-exported: tests and experiments drive both from here.
__all__ = [
    "CONNECTION",
    "ENGINES",
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
    engine: str = "deployment",
    supernodes: int = 10,
    run_config: Mapping[str, Any] | None = None,
    out_dir: Path | None = None,
    policy: Mapping[str, Any] | None = None,
    app_dir: Path | None = None,
    timeout: float = 3600.0,
    startup_timeout: float = STARTUP_TIMEOUT_S,
    echo: Callable[[str], None] = print,
    figure: bool = True,
    node_configs: Mapping[int, Mapping[str, Any]] | None = None,
    node_env: Mapping[int, Mapping[str, str]] | None = None,
    tls: bool = False,
    auth: bool = False,
    superlink_database: bool = False,
    ray_address: str | None = None,
    on_line: Callable[[str, Federation], None] | None = None,
) -> LaunchResult:
    """Run a whole federation on this machine and collect its results.

    Parameters
    ----------
    engine : str
        ``"deployment"`` (a SuperLink and one real SuperNode process per device, gRPC),
        ``"simulation"`` (Flower's Simulation Engine, Ray) or ``"direct"`` (the ServerApp and
        ClientApp in this process; the Simulation Engine's results): :mod:`deploy.engines`.
    supernodes : int
        Number of SuperNodes (devices, real or virtual); node ``i`` gets ``partition-id=i``.
    run_config : Mapping[str, Any], optional
        Overrides of ``[tool.flwr.app.config]``.
    out_dir : Path, optional
        The run directory (default ``runs/<timestamp>``).
    policy : Mapping[str, Any], optional
        Device settings every device applies: written to ``<out>/policy.toml`` and named as
        their policy file. The launcher plays the device owners of its local federation, so
        each device's ledger defaults to ``<out>/ledgers`` unless ``ledger-dir`` is given.
    app_dir : Path, optional
        The Flower app (default: this checkout; where gpfl is installed without one, the
        installed packages written out to ``<out>/app/gpfl`` by :func:`deploy.fab.installed_app`).
        The direct engine calls the installed apps.
    timeout : float
        Seconds before the run is abandoned (everything is still stopped).
    startup_timeout : float
        Seconds from the submission to the ServerApp's first line before the launch is given
        up (:data:`STARTUP_TIMEOUT_S`). Once it runs, a run with no round for
        :func:`deploy.processes.stall_seconds` (three round deadlines and two minutes) is given
        up too. In one process (``direct``) nothing is late, and neither applies.
    echo : Callable[[str], None]
        Where the per-round lines go.
    figure : bool
        Draw ``figure.png`` after the run (about half a second; sweeps of many runs skip it).
    node_configs : Mapping[int, Mapping[str, Any]], optional
        ``deployment`` only: extra node config per SuperNode index (its own budget, cap,
        ledger...).
    node_env : Mapping[int, Mapping[str, str]], optional
        ``deployment`` only: extra environment of SuperNode ``i`` (e.g.
        ``CUDA_VISIBLE_DEVICES`` to give each its own GPU).
    tls : bool
        ``deployment`` only: encrypt every connection with a throw-away CA made for this
        launch.
    auth : bool
        ``deployment`` only: SuperNode authentication (implies ``tls``): a key pair per
        SuperNode is made for this launch and registered with the SuperLink before the
        SuperNodes start; the run config's ``node-identity`` defaults to ``"key"``.
    superlink_database : bool
        ``deployment`` only: keep the SuperLink's state in Flower's persistent database
        (``<out>/superlink.db``): a SuperLink that dies mid-run is started again on it and the
        same run goes on. Off by default: Flower's SQLite state makes every request a database
        transaction, and a round of 20 SuperNodes on 2 cores takes about twice as long
        (docs/SCALE.md); without it a dead SuperLink ends the run incomplete, and ``--resume``
        continues it from the server's checkpoint.
    ray_address : str, optional
        ``simulation`` only: join the running Ray cluster at this address (its head's
        ``HOST:PORT``, as ``ray start --address`` takes it) instead of starting a local Ray
        (default: ``$RAY_ADDRESS``, Ray's own variable, where set). The virtual nodes then run
        on the cluster's nodes, which must have this environment installed (same paths) and
        see the run directory (ledgers, policy) at the same path.
    on_line : Callable[[str, Federation], None], optional
        ``deployment`` and ``simulation``: called with every streamed line (tests use it to
        stop a SuperNode mid-run).

    Returns
    -------
    LaunchResult
        ``status`` is ``incomplete`` when the run did not do all its rounds (server killed,
        ServerApp crashed, too few devices); the summary then says why, and
        ``gpfl launch --resume <out>`` continues it.

    Raises
    ------
    LaunchError
        If a setting is invalid or an option does not fit the engine (before any process
        starts), a process cannot start, the run ends without a summary, or no round completed.
    """
    if supernodes < 1:
        raise LaunchError(f"--supernodes must be >= 1, got {supernodes}")
    if not startup_timeout > 0:
        raise LaunchError(f"--startup-timeout must be a positive number of seconds, got "
                          f"{startup_timeout}")
    options = {"tls": tls, "auth": auth, "superlink_database": superlink_database,
               "node_configs": node_configs, "node_env": node_env, "ray_address": ray_address,
               "on_line": on_line}
    runner = make_engine(engine, options)
    out = (out_dir or Path("runs") / time.strftime("%Y%m%d-%H%M%S")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    # The app: the one named, else this checkout, else the installed packages written out as one.
    app_dir = (app_dir or checkout_root() or installed_app(out / "app")).resolve()
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
    runner.check(run_settings, supernodes, out)
    unused = sorted((set(node_configs or {}) | set(node_env or {})) - set(nodes))
    if unused:
        raise LaunchError(f"--node-config names SuperNodes {unused}, but there are only "
                          f"{supernodes} (0..{supernodes - 1})")
    # The Ray address the engine resolved (``$RAY_ADDRESS`` included): a resumed run joins the
    # same cluster whatever its environment.
    save_launch(out, {"engine": engine, "supernodes": supernodes, "run_config": config,
                      "node_configs": node_configs, "policy": policy, "app_dir": app_dir,
                      "tls": tls, "auth": auth,
                      "ray_address": getattr(runner, "ray_address", ray_address),
                      "superlink_database": superlink_database, "node_env": node_env})
    try:
        policy_file, ledger_paths = write_policy(out, device_policy, nodes.values())
        for path in ledger_paths:
            _check_writable(path.parent)
        prepared = Prepared(out=out, app_dir=app_dir, supernodes=supernodes, config=config,
                            nodes=nodes, settings=run_settings, policy_file=policy_file,
                            ledger_paths=ledger_paths, echo=echo, timeout=timeout,
                            startup_timeout=startup_timeout, figure=figure)
        prepared.plans = runner.plan(prepared)
    except PolicyError as err:  # a policy file a node config names: unreadable, bad values
        raise LaunchError(str(err)) from None
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    in_main = threading.current_thread() is threading.main_thread()
    if in_main:
        for s in previous:
            signal.signal(s, _raise_on_signal)
    left: list[int] = []
    try:
        return runner.run(prepared)
    except KeyboardInterrupt:
        # Ctrl-C or SIGTERM: the summary must not stay "running", and the run can go on. Stop
        # first (closing twice is harmless): the ServerApp rewrites the summary every round.
        left = runner.close()
        mark_incomplete(out, "interrupted (Ctrl-C or SIGTERM)")
        if (out / CHECKPOINT_NAME).is_file():
            echo(f"gpfl: interrupted; continue it with `gpfl launch --resume {out}`")
        raise
    finally:
        left = runner.close() or left
        if left:
            echo(f"gpfl: could not stop PIDs {left}")
        if in_main:
            for s, handler in previous.items():
                signal.signal(s, handler)


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


def _models_lines(summary: dict[str, Any], out: Path) -> list[str]:
    """Say the delivered models: each one's validation metric and users, and how to load them."""
    models = summary.get("models")
    if not models:
        return []
    metric = models.get("metric", "loss")
    parts = []
    for entry in models.get("models", []):
        validation = entry.get("validation") or {}
        users = int(validation.get("users", 0))
        value = validation.get(metric)
        parts.append(f"hypothesis {entry['hypothesis']}: "
                     + (f"{metric} {value:.3f} on {users} validation users" if value is not None
                        else "no validation user fits it best"))
    return [f"gpfl: delivered models (round {models.get('best_round')}, "
            f"{out / models['folder']}): " + "; ".join(parts),
            f"gpfl: use them: gpfl predict {out} --data FILE, or in Python "
            f"tasks.delivered.load_delivered({str(out)!r})"]


def _best_line(summary: dict[str, Any]) -> str:
    """Say the best validation round's loss, and the task's metric in it where it has one."""
    line = f"gpfl: best validation loss {summary.get('best_val_loss')}"
    metric = (summary.get("models") or {}).get("metric")
    best = next((e for e in summary.get("history", [])
                 if e.get("round") == summary.get("best_round")), None)
    value = (best or {}).get("val_metrics", {}).get(metric) if metric else None
    if metric and metric != "loss" and value is not None:
        line += f", {metric} {value:.4f} (round {summary.get('best_round')})"
    return line


def _central_line(privacy: dict[str, Any]) -> list[str]:
    """Secure clusters: the central ε the devices reported, beside the charged local floor."""
    central = sorted(float(c.get("central_epsilon", 0.0))
                     for c in privacy.get("per_client", {}).values())
    if not central or central[-1] <= 0:
        return []
    return [f"gpfl: secure clusters: central epsilon (what the sums give away while min-cohort "
            f"honest devices are in each; as reported): median "
            f"{_number(statistics.median(central))}, max {_number(central[-1])}"]


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
        _best_line(s),
        _hypotheses_line(s.get("hypotheses") or [], result.out_dir),
        *_models_lines(s, result.out_dir),
        *([] if not s.get("optima_distances") else [
            "gpfl: distance from each optimum to its nearest hypothesis: "
            + ", ".join(f"{d:.3f}" for d in s["optima_distances"])]),
        f"gpfl: privacy spend ({priv.get('unit')}; {source}): "
        f"median {_number(spend.get('median'))}, max {_number(spend.get('max'))}",
        *_central_line(priv),
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

