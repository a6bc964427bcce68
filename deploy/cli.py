"""The ``gpfl`` command: its subcommands, their options, and the entry point."""

from __future__ import annotations

import argparse
import logging
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from deploy.new_task import add_arguments as new_task_arguments
from deploy.predict import add_arguments as predict_arguments

#: What ``gpfl --help`` says gpfl is, in one line.
DESCRIPTION = ("gpfl: group-private, personalized federated learning on Flower (clustered FL "
               "with local differential privacy on every device).")


def versions() -> str:
    """Return ``gpfl X (Flower Y)``: the installed distributions' versions, as pip sees them.

    Read from the distribution metadata rather than a constant in the code, so that what
    ``--version`` prints is what is installed (and a device owner can quote it to the server's
    operator, whose run a device refuses when the versions differ).
    """
    def installed(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:  # a checkout run without installing it
            return "(not installed)"

    return f"gpfl {installed('gpfl')} (Flower {installed('flwr')})"


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """argparse's help formatter that adds ``(default: ...)``, only where a default says something.

    An option without a value (a flag, default False), one whose default is None (the option's
    own help says what happens without it), an empty list (a repeatable option) or an empty
    string gets nothing added; nor does an option whose help already states its default in its
    own words.
    """

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        # Identity for False: a default of 0 (a count) is a default worth stating.
        silent = (default is None or default is False or default is argparse.SUPPRESS
                  or default in ([], ""))
        if silent or "default" in text:
            return text
        return super()._get_help_string(action)


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose help states defaults; the subcommands' parsers are made alike."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", DefaultsHelpFormatter)
        super().__init__(*args, **kwargs)


def parse_pairs(text: str, what: str) -> dict[str, Any]:
    """Read ``"k1=v1 k2=v2"`` or a ``FILE.toml``, in gpfl's one grammar (:mod:`settings.pairs`).

    Raises
    ------
    SystemExit
        Naming ``what`` and the item when an item is not ``key=value``.
    """
    from settings.pairs import PairsError, read_settings

    try:
        return read_settings(text, what)
    except PairsError as err:
        raise SystemExit(f"gpfl: {err}") from None


def parse_node_configs(items: list[str]) -> dict[int, dict[str, Any]]:
    """``--node-config '3:cap-d-privacy=0.8 mechanisms="gaussian"'`` → {3: {...}}.

    The part after ``INDEX:`` is read as ``gpfl supernode --node-config`` reads its argument
    (:func:`parse_pairs`: items or a ``FILE.toml``).
    """
    out: dict[int, dict[str, Any]] = {}
    for item in items:
        index, sep, rest = item.partition(":")
        if not sep or not index.strip().isdigit():
            raise SystemExit(
                f"gpfl: --node-config expects INDEX:key=value ..., got {item!r}"
            )
        out.setdefault(int(index), {}).update(parse_pairs(rest, "--node-config"))
    return out


#: ``--engine``'s choices: the names of :data:`deploy.engines.ENGINES`, spelled here so that the
#: parser does not import the engines (and Flower) to print its help; a test keeps them alike.
ENGINE_NAMES = ("deployment", "simulation", "direct")

#: Options that describe the federation; ``--resume`` takes them from the run directory.
_FEDERATION_OPTIONS = ("supernodes", "node_config", "policy", "out", "app", "tls", "auth",
                       "engine", "app_defaults", "ray_address", "superlink_database")


def log_to_setting(items: list[str]) -> str:
    """Return ``log-to`` for --log-to items, a TensorBoard folder made absolute.

    The ServerApp runs in a process of its own (the SuperLink's executor under the Deployment
    Engine), whose working folder is not this one.

    A library that is not installed is the launch's check to report (`server.settings.check_launch`,
    through `settings.extras.check_run_extras`), as for the run-config setting.

    Raises
    ------
    SystemExit
        For an item that is not tensorboard:DIR or mlflow:URI.
    """
    from settings.checks import parse_log_to

    try:
        pairs = parse_log_to(",".join(items))
    except ValueError as err:
        raise SystemExit(f"gpfl: --log-to: {err}") from None
    return ",".join(f"{kind}:{Path(target).resolve()}" if kind == "tensorboard"
                    else f"{kind}:{target}" for kind, target in pairs)


def _launch_arguments(args: argparse.Namespace) -> dict[str, Any]:
    from deploy.rundir import resume_arguments

    run_config: dict[str, Any] = {}
    for text in args.run_config:
        run_config.update(parse_pairs(text, "--run-config"))
    if args.log_to:
        run_config["log-to"] = log_to_setting(args.log_to)
    if args.resume:
        given = [f"--{name.replace('_', '-')}" for name in _FEDERATION_OPTIONS
                 if getattr(args, name) not in (None, False, [])]
        if given:
            raise SystemExit(f"gpfl: --resume starts the federation saved in the run directory; "
                             f"{', '.join(given)} cannot be given with it")
        kwargs = resume_arguments(Path(args.resume))
        kwargs["run_config"].update(run_config)
        return kwargs
    policy: dict[str, Any] = {}
    for text in args.policy:
        policy.update(parse_pairs(text, "--policy"))
    from deploy.quickstart import QUICKSTART_SUPERNODES, quickstart_run_config

    supernodes = QUICKSTART_SUPERNODES if args.supernodes is None else args.supernodes
    if not args.app_defaults:
        run_config = quickstart_run_config(supernodes, run_config)
    return {
        "supernodes": supernodes,
        "run_config": run_config,
        "out_dir": Path(args.out) if args.out else None,
        "node_configs": parse_node_configs(args.node_config),
        "policy": policy,
        "app_dir": Path(args.app) if args.app else None,
        "tls": args.tls,
        "auth": args.auth,
        "engine": args.engine or "deployment",
        "ray_address": args.ray_address,
        "superlink_database": args.superlink_database,
    }


def _launch(args: argparse.Namespace) -> int:
    from deploy.launcher import LaunchError, describe, launch
    from deploy.rundir import ResumeError
    from server.results import exit_status

    try:
        result = launch(**_launch_arguments(args), timeout=args.timeout,
                        startup_timeout=args.startup_timeout)
    except (LaunchError, ResumeError) as err:
        print(f"gpfl: launch failed: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("gpfl: interrupted; every process was stopped", file=sys.stderr)
        return 130
    print(describe(result))
    return exit_status(result.status, result.finished)


def _device_policy_arguments(parser: argparse.ArgumentParser, shown: str) -> None:
    """Declare --policy, --node-config (read by `_device_policy`) and --json (``shown``)."""
    parser.add_argument("--policy", metavar="FILE.toml",
                        help="the device's policy file (its policy-file)")
    parser.add_argument("--node-config", default="", metavar='"k=v ..." | FILE.toml',
                        help="the device's node config, as given to gpfl supernode (its keys "
                             "override the policy file's)")
    parser.add_argument("--json", action="store_true",
                        help=f"print the same as JSON ({shown})")


def _device_policy(args: argparse.Namespace) -> Any:
    """Return the device policy named by --policy / --node-config, or None without either.

    The device's own reading of its settings; the environment's $GPFL_POLICY is not read, so
    that what is shown follows the settings named on this command line.

    Raises
    ------
    client.policy.PolicyError
        For an unreadable policy file or a bad setting.
    """
    from client.policy import DevicePolicy

    node_config = parse_pairs(args.node_config, "--node-config") if args.node_config else {}
    if args.policy:
        if node_config.get("policy-file"):
            raise SystemExit("gpfl: give the policy file once: --policy or --node-config's "
                             "policy-file, not both")
        node_config["policy-file"] = args.policy
    if not (args.policy or args.node_config):
        return None
    return DevicePolicy.load(node_config, environ={})


def _tasks(args: argparse.Namespace) -> int:
    import json

    from client.policy import PolicyError
    from client.task_list import format_task_rows, task_rows

    try:
        rows = task_rows(_device_policy(args))
    except PolicyError as err:
        print(f"gpfl: {err}", file=sys.stderr)
        return 1
    print(json.dumps(rows, indent=2) if args.json else format_task_rows(rows))
    return 0


def _ledger(args: argparse.Namespace) -> int:
    import json

    from client.ledger_view import format_ledger_report, ledger_report
    from client.policy import PolicyError
    from mechanisms import LedgerCorruptError

    try:
        policy = _device_policy(args)
        if args.json:
            print(json.dumps(ledger_report(Path(args.path), policy=policy), indent=2))
        else:
            print(format_ledger_report(Path(args.path), policy=policy))
    except (LedgerCorruptError, FileNotFoundError, PolicyError) as err:
        print(f"gpfl: {err}", file=sys.stderr)
        return 1
    return 0


def _plot(args: argparse.Namespace) -> int:
    import json

    from server.results import plot_summary

    run = Path(args.run_dir)
    summary = json.loads((run / "summary.json").read_text())
    path = plot_summary(summary, run / "figure.png")
    print(f"gpfl: wrote {path}")
    return 0


def _predict(args: argparse.Namespace) -> int:
    from deploy.predict import run

    return run(args)


def _new_task(args: argparse.Namespace) -> int:
    from deploy.new_task import run

    return run(args)


def _certs(args: argparse.Namespace) -> int:
    from deploy.certs import describe_deployment, make_deployment

    out = Path(args.out)
    if (out / "ca.crt").exists() and not args.force:
        print(f"gpfl: {out / 'ca.crt'} exists; pass --force to make a new CA (every device then "
              "needs the new ca.crt)", file=sys.stderr)
        return 1
    names = [n for item in args.san for n in item.split(",")]
    try:
        dep = make_deployment(out, names, args.supernodes, days=args.days,
                              local=not args.no_local)
    except ValueError as err:
        print(f"gpfl: {err}", file=sys.stderr)
        return 1
    print(describe_deployment(dep))
    return 0


def _supernode(args: argparse.Namespace) -> int:
    from client.supernode import run

    return run(args)


def _serverapp(args: argparse.Namespace) -> int:
    from deploy.serverapp_service import run

    return run(args)


def _submit(args: argparse.Namespace) -> int:
    from deploy.submit import run

    return run(args)


def build_parser() -> argparse.ArgumentParser:
    """Build the argument parser of ``gpfl``."""
    parser = _Parser(prog="gpfl", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=versions(),
                        help="print gpfl's version and Flower's, then exit")
    # Subparsers are made by the parent's class (argparse's default): each states its defaults.
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("launch", help="run a local federation of real Flower processes (gRPC)")
    p.add_argument("--supernodes", type=int,
                   help="number of SuperNodes (clients; default: 20, the quickstart's)")
    p.add_argument("--run-config", action="append", default=[], metavar='"k=v ..."',
                   help="override app settings (keys of [tool.flwr.app.config])")
    p.add_argument("--node-config", action="append", default=[], metavar='"INDEX:k=v ..."',
                   help="node config of SuperNode INDEX (its own device settings: "
                        "cap-d-privacy, mechanisms, ...)")
    p.add_argument("--policy", action="append", default=[], metavar='"k=v ..." | FILE.toml',
                   help="device settings every SuperNode applies (its privacy policy: "
                        "mechanisms, caps, bounds; see docs/SETTINGS.md)")
    p.add_argument("--app-defaults", action="store_true",
                   help="start from the app's run-config defaults (the paper's setting: 7 "
                        "clients a round, one local epoch) instead of the quickstart's (every "
                        "SuperNode each round, 5 local epochs, the plateau server update, "
                        "clipped-mean clusters with the persistence test, 60 rounds (100 below "
                        "16 SuperNodes); deploy/quickstart.py)")
    p.add_argument("--out", help="run directory (default: runs/<timestamp>)")
    p.add_argument("--log-to", action="append", default=[], metavar="tensorboard:DIR|mlflow:URI",
                   help="also write each round's metrics to TensorBoard (event files under DIR) "
                        "or MLflow (the tracking URI, e.g. sqlite:////srv/mlflow.db); repeatable; "
                        "needs gpfl[tracking] (the run-config setting log-to)")
    p.add_argument("--app", help="the Flower app folder (default: this checkout, or the installed "
                                 "packages written to OUT/app/gpfl where there is none)")
    p.add_argument("--tls", action="store_true",
                   help="encrypt every connection with a throw-away CA made for this launch")
    p.add_argument("--auth", action="store_true",
                   help="SuperNode authentication (implies --tls): a key pair per SuperNode, "
                        "registered with the SuperLink")
    p.add_argument("--engine", choices=ENGINE_NAMES,
                   help="real SuperNode processes (deployment), Flower's Simulation Engine "
                        "(Ray), or the ServerApp and ClientApp in this process (direct) "
                        "(default: deployment)")
    p.add_argument("--ray-address", metavar="HOST:PORT",
                   help="with --engine simulation: run the virtual nodes on the running Ray "
                        "cluster whose head is HOST:PORT instead of a local Ray "
                        "(docs/DEPLOY.md, 'A Ray cluster')")
    p.add_argument("--superlink-database", action="store_true",
                   help="keep the SuperLink's state in Flower's database (RUN_DIR/superlink.db): "
                        "a SuperLink that dies mid-run is started again and the run goes on; "
                        "rounds take about twice as long (docs/SCALE.md)")
    p.add_argument("--resume", metavar="RUN_DIR",
                   help="continue an incomplete run from its checkpoint, with the federation "
                        "saved in RUN_DIR (same devices, same ledgers); --run-config may add "
                        "overrides")
    p.add_argument("--timeout", type=float, default=3600.0,
                   help="seconds from the start before giving up on the run")
    p.add_argument("--startup-timeout", type=float, default=600.0,
                   help="seconds from the submission to the ServerApp's first line before "
                        "giving up (a run without a round for 3 round deadlines and 2 minutes "
                        "is given up too)")
    p.set_defaults(func=_launch)

    p = sub.add_parser(
        "serverapp", help="serve a SuperLink (--isolation process) with its ServerApp, one "
                          "process a run (the compose deployment's serverapp service)",
        description="Serve a SuperLink run with --isolation process: for each run, one "
                    "ServerApp process that imports Flower before it claims the run (a slow "
                    "host costs time, not a refused ServerApp) and says so in one line when "
                    "the SuperLink refuses it; then the next run's.")
    from deploy.serverapp_service import add_arguments as serverapp_arguments

    serverapp_arguments(p)
    p.set_defaults(func=_serverapp)

    p = sub.add_parser(
        "submit", help="submit a run to a running SuperLink and follow it, within deadlines "
                       "(flwr run --stream that stops a run which does not start or progress)",
        description="Submit a run with flwr run --stream and follow its log: a run whose "
                    "ServerApp does not start within --startup-timeout, or that finishes no "
                    "round within 3 round deadlines and 2 minutes, is stopped (flwr stop) and "
                    "the last line says why; the exit status is gpfl launch's for the run's "
                    "status.")
    from deploy.submit import add_arguments as submit_arguments

    submit_arguments(p)
    p.set_defaults(func=_submit)

    p = sub.add_parser("certs", help="make a CA, a SuperLink certificate and SuperNode key pairs "
                                      "for a real deployment")
    p.add_argument("--out", default="certs", help="output folder")
    p.add_argument("--san", action="append", default=[], metavar="NAME[,NAME...]",
                   help="DNS name or IP address the SuperLink is reached by (repeatable)")
    p.add_argument("--supernodes", type=int, default=0,
                   help="number of SuperNode authentication key pairs to make")
    p.add_argument("--days", type=int, default=365,
                   help="validity of the certificates, in days")
    p.add_argument("--no-local", action="store_true",
                   help="leave localhost, 127.0.0.1 and ::1 out of the certificate")
    p.add_argument("--force", action="store_true", help="overwrite an existing CA")
    p.set_defaults(func=_certs)

    p = sub.add_parser(
        "supernode", help="run this device's SuperNode with the gpfl client installed here",
        description="Flower's SuperNode (process isolation) served by gpfl's warm executor: "
                    "every task runs the gpfl client installed on this device, runs of other "
                    "apps are refused, and the app code the server sends is never imported.")
    from client.supernode import add_arguments

    add_arguments(p)
    p.set_defaults(func=_supernode)

    p = sub.add_parser(
        "ledger", help="print a client's privacy ledger, its caps and what is left",
        description="Print a device's privacy ledger: every release, the totals, each cap "
                    "with the spend in its unit and what is left, and the federations (runs) "
                    "the releases were made for. The ledger file holds no caps: they are the "
                    "device's settings, read from --policy / --node-config as gpfl supernode "
                    "reads them; without either, the defaults of a device without a policy.")
    p.add_argument("path", help="the ledger file (e.g. runs/<run>/ledgers/client-0.json)")
    _device_policy_arguments(p, "releases, spend, caps, remaining, federations")
    p.set_defaults(func=_ledger)

    p = sub.add_parser(
        "predict", help="score a run's delivered models on your data and predict with the best",
        description="Load a run's delivered models (RUN/models, in the task's own format), "
                    "score each on the records of --data, and predict with the one that fits "
                    "them best (lowest loss, as validation assigns a user) or with --hypothesis. "
                    "In Python: tasks.delivered.load_delivered(RUN).")
    predict_arguments(p)
    p.set_defaults(func=_predict)

    p = sub.add_parser(
        "tasks", help="list the installed tasks, their settings and which this device allows",
        description="List the tasks installed in this environment (the gpfl.tasks entry "
                    "points: gpfl's own and every plugin's), with the package that registers "
                    "each, its metric, its models' format, the run-config settings it reads, "
                    "and whether the device's policy (--policy / --node-config; without them, "
                    "a device without settings) allows it.")
    _device_policy_arguments(p, "name, package, class, metric, settings, allowed")
    p.set_defaults(func=_tasks)

    p = sub.add_parser(
        "new-task", help="write the skeleton of a task plugin package, to install, test and run",
        description="Write gpfl-task-NAME/: a pyproject.toml registering NAME in the gpfl.tasks "
                    "entry points, a package with a working task to replace with yours, a test "
                    "and a README (docs/TASKS.md, the tutorial).")
    new_task_arguments(p)
    p.set_defaults(func=_new_task)

    p = sub.add_parser("plot", help="draw figure.png of a run directory")
    p.add_argument("run_dir", help="the run directory (it holds summary.json)")
    p.set_defaults(func=_plot)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``gpfl`` console script."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
