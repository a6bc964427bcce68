"""What a run directory holds for whoever launched the run: its launch, its devices' ledgers.

``gpfl launch`` writes ``launch.json`` (the federation it started: SuperNodes, run config, node
configs, policy, engine, security) so that ``gpfl launch --resume RUN_DIR`` can start the same
federation again and continue from the ServerApp's checkpoint. After a run it reads the ledgers
of the devices it played and adds them to ``summary.json`` (``ledgers``): the server's figures
are what the devices *reported*, and a release charged in a round that was lost (a killed
SuperLink, a reply refused as late) is in a ledger before any report carries it. So the launch's
closing line quotes the ledgers, and what it reports never falls below what they hold.
"""

from __future__ import annotations

import json
import logging
import statistics
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from client.policy import DevicePolicy
from mechanisms import LedgerCorruptError, PrivacyLedger
from server.checkpoint import CHECKPOINT_NAME, CheckpointError, read_checkpoint
from server.results import write_json_atomic
from settings import setting
from settings.render import toml_value

logger = logging.getLogger(__name__)

LAUNCH_FILE = "launch.json"
#: The launch policy: the device settings every device of a local federation applies.
POLICY_FILE = "policy.toml"
#: Run-config keys that belong to one launch, not to the run: never saved, never replayed.
_PER_LAUNCH = ("out-dir", "resume-from")
#: Statuses after which there is nothing left to resume.
FINISHED = ("complete", "stopped-early")


class ResumeError(ValueError):
    """A run directory cannot be resumed (nothing saved, already finished, unreadable)."""


def save_launch(out_dir: Path, arguments: Mapping[str, Any]) -> None:
    """Write ``launch.json``: the keyword arguments of :func:`deploy.launcher.launch`.

    ``run_config`` is saved without its per-launch keys; ``node_configs`` and ``node_env`` are
    keyed by SuperNode index (strings in JSON).
    """
    saved = dict(arguments)
    saved["run_config"] = {k: v for k, v in dict(arguments.get("run_config") or {}).items()
                           if k not in _PER_LAUNCH}
    for key in ("node_configs", "node_env"):
        saved[key] = {str(i): dict(v) for i, v in dict(arguments.get(key) or {}).items()}
    if saved.get("app_dir") is not None:
        saved["app_dir"] = str(saved["app_dir"])
    write_json_atomic(out_dir / LAUNCH_FILE, saved)


def resume_arguments(run_dir: Path) -> dict[str, Any]:
    """Return the keyword arguments that continue the run in ``run_dir``.

    They are the saved launch's, with ``out_dir = run_dir`` and ``resume-from = run_dir``: the
    same devices (node configs, policy, hence the same ledgers) and the same run config, so the
    ServerApp's identity check passes.

    Raises
    ------
    ResumeError
        If ``run_dir`` holds no ``launch.json`` or no checkpoint, or its run already finished.
    """
    run_dir = run_dir.expanduser().resolve()
    launch_file = run_dir / LAUNCH_FILE
    if not launch_file.is_file():
        raise ResumeError(f"--resume {run_dir}: no {LAUNCH_FILE} there (not a run directory "
                          "of gpfl launch)")
    if not (run_dir / CHECKPOINT_NAME).is_file():
        raise ResumeError(f"--resume {run_dir}: no {CHECKPOINT_NAME} there (the run ended "
                          "before its first round was saved): start it anew")
    try:  # a truncated or damaged checkpoint is refused here, not after the federation started
        read_checkpoint(run_dir / CHECKPOINT_NAME)
    except CheckpointError as err:
        raise ResumeError(f"--resume {run_dir}: {err}; start the run anew") from None
    summary_path = run_dir / "summary.json"
    if summary_path.is_file():
        status = json.loads(summary_path.read_text()).get("status")
        if status in (*FINISHED, "budget-exhausted", "devices-failed"):
            raise ResumeError(f"--resume {run_dir}: the run is {status}; nothing to resume "
                              "(it did all its rounds)")
        if status == "diverged":
            raise ResumeError(f"--resume {run_dir}: the run diverged (its hypotheses left what "
                              "the devices or the validation data support); resuming would "
                              "continue from them: start it anew")
    try:
        saved = json.loads(launch_file.read_text())
    except json.JSONDecodeError as err:
        raise ResumeError(f"--resume {run_dir}: {launch_file} is not JSON ({err})") from None
    for key in ("node_configs", "node_env"):
        saved[key] = {int(i): v for i, v in saved.get(key, {}).items()}
    if "simulation" in saved:  # run directories of gpfl before --engine direct
        saved["engine"] = "simulation" if saved.pop("simulation") else "deployment"
    if saved.get("app_dir") is not None:
        saved["app_dir"] = Path(saved["app_dir"])
    saved["run_config"] = {**saved.get("run_config", {}), "resume-from": str(run_dir)}
    saved["out_dir"] = run_dir
    return dict(saved)


#: The family of ledger entries whose spend a mechanism's summary reports.
_FAMILY = {"laplace": "d-privacy", "gaussian": "rdp", "sign": "rdp", "dpsgd": "record"}


def ledger_report(ledgers: Iterable[Path], mechanism: str) -> dict[str, Any] | None:
    """Read the devices' ledger files; return the ``ledgers`` section of the summary.

    ``spend`` is in the unit of the run's privacy report (Σ ε·r for Laplace, the composed ε for
    Gaussian and sign, the record-level ε for dpsgd); ``relation`` names the neighbouring
    relation(s) of the releases it composes (``device-replace``, ``add-remove``,
    ``replace-one``). A ledger that does not exist (a device that never released) is left out;
    returns ``None`` when none exists. An unreadable ledger is listed with its error, never
    skipped silently.
    """
    paths = sorted({Path(p) for p in ledgers if Path(p).is_file()})
    if not paths:
        return None
    delta = float(setting("delta").default)
    per_client: dict[str, Any] = {}
    for path in paths:
        try:
            ledger = PrivacyLedger(path, delta=delta)
            spent, entries = ledger.spent(), ledger.entries()
        except (LedgerCorruptError, OSError, ValueError) as err:
            logger.error("ledger %s is unreadable: %s", path, err)
            per_client[path.stem] = {"error": str(err)}
            continue
        spend = (spent.d_privacy if mechanism == "laplace" else
                 spent.record_epsilon if mechanism == "dpsgd" else spent.epsilon)
        family = _FAMILY.get(mechanism, "rdp")
        # The relations the spend's releases were charged under, in the order first used.
        relations = dict.fromkeys(e.event.relation for e in entries if e.event.family == family)
        per_client[path.stem] = {"spend": spend, "relation": ", ".join(relations) or None,
                                 "path": str(path), **spent.to_dict()}
    spends = [c["spend"] for c in per_client.values() if "spend" in c]
    return {
        "source": "the devices' ledgers, read after the run",
        "per_client": per_client,
        "median": statistics.median(spends) if spends else None,
        "max": max(spends) if spends else None,
    }


def write_policy(out_dir: Path, policy: Mapping[str, Any],
                 nodes: Iterable[Mapping[str, Any]]) -> tuple[Path, list[Path]]:
    """Write the launch ``policy`` to ``<out_dir>/policy.toml``; return it and the ledgers' paths.

    The launcher plays the device owners of its local federation, so it names their policy
    file. Each ledger path is where a device keeps its ledger, as the device itself resolves it
    (its node config in ``nodes`` over the policy): the launch reads them back after the run.
    """
    path = out_dir / POLICY_FILE
    path.write_text("".join(f"{k} = {toml_value(v)}\n" for k, v in policy.items()),
                    encoding="utf-8")
    ledgers = [DevicePolicy.load({"policy-file": str(path), **node}).ledger_path
               for node in nodes]
    return path, ledgers


def add_ledgers(
    out_dir: Path, summary: dict[str, Any], ledgers: Iterable[Path]
) -> dict[str, Any]:
    """Add :func:`ledger_report` to ``summary`` (and to ``summary.json``); return it."""
    mechanism = str(summary.get("privacy", {}).get("mechanism", "laplace"))
    report = ledger_report(ledgers, mechanism)
    if report is not None:
        summary = {**summary, "ledgers": report}
        write_json_atomic(out_dir / "summary.json", summary)
    return summary
