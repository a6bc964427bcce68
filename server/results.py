"""Results of a run: the per-round line, ``summary.json``, the checkpoint and the figure.

After every round the checkpoint (:mod:`server.checkpoint`) and then the summary are rewritten
(atomically): an interrupted run leaves what it had learnt and can be resumed. ``status``:
``running`` (also what a killed or crashed ServerApp leaves behind), ``complete``,
``stopped-early`` (patience ran out), ``incomplete`` (``incomplete_reason`` says why, e.g. too
few devices connected), ``diverged`` (strategies.divergence: the devices refused the hypotheses,
or validations kept them far beyond the initial loss; the reason names who pushed; not resumable),
``budget-exhausted`` (devices declined for their caps and rounds went without the replies they
needed) or ``devices-failed`` (most devices asked failed every round). A run that did its rounds
is ``complete`` only when its devices worked: ``devices`` in the summary sorts them
(:func:`device_health`), naming each device that failed throughout with its failure's class.
"""

from __future__ import annotations

import json
import logging
import math
import statistics
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mechanisms.atomic_file import write_atomic
from server.checkpoint import CHECKPOINT_NAME, write_checkpoint
from server.tracking import Sink, close_all, metrics_of
from tasks.base import Task
from tasks.delivered import MANIFEST, MODELS_DIR, validation_of, write_delivered

logger = logging.getLogger(__name__)

ROUND_TAG = "[gpfl]"
#: How the ServerApp's last line starts; the run's status and why follow (``RunRecorder.on_end``).
END_LINE = f"{ROUND_TAG} run ended:"
STATUSES = ("running", "complete", "stopped-early", "incomplete", "diverged",
            "budget-exhausted", "devices-failed")
#: Exit status of a run that did not do all its rounds (resumable).
EXIT_INCOMPLETE = 3
#: Exit status of a run whose devices refused its hypotheses (not resumable).
EXIT_DIVERGED = 4
#: Exit status of a run whose devices stopped for their caps (budget-exhausted).
EXIT_BUDGET = 5
#: Exit status of a run where most devices failed every round (devices-failed).
EXIT_DEVICES_FAILED = 6


def exit_status(status: str, finished: bool) -> int:
    """Return the exit status of ``gpfl launch`` and ``gpfl submit`` for a run's status.

    ``finished``: whether the run did all its rounds (or stopped early on patience).
    """
    codes = {"diverged": EXIT_DIVERGED, "budget-exhausted": EXIT_BUDGET,
             "devices-failed": EXIT_DEVICES_FAILED}
    if status in codes:
        return codes[status]
    return 0 if finished else EXIT_INCOMPLETE
#: The setting that caps each family a device declines for (``decline-reason`` names it).
CAP_SETTINGS = {"d-privacy": "cap-d-privacy", "rdp": "cap-epsilon",
                "record": "cap-record-epsilon"}


def spend_of(mechanism: str, metrics: Mapping[str, Any]) -> float | None:
    """Return a client's total spend in its mechanism's own terms.

    ε·r (d-privacy) for Laplace, the ε charged for Gaussian and sign (the smaller of RDP's and
    PLD's), the record-level RDP ε for dpsgd, ``None`` (unbounded) without a mechanism, or for
    a device never heard from.
    """
    key = {"laplace": "spend-d", "gaussian": "spend-epsilon", "sign": "spend-epsilon",
           "dpsgd": "spend-record-epsilon"}.get(mechanism)
    return None if "client-name" not in metrics or key is None else float(metrics.get(key, 0.0))


_COUNTS = ("sampled", "participations", "declines", "dropped", "failures", "missing")
_MAXIMA = ("spend", "releases", "spend_d", "epsilon", "epsilon_rdp", "epsilon_pld", "delta",
           "central_epsilon")


def privacy_report(mechanism: str, clients: Mapping[str, Any]) -> dict[str, Any]:
    """Build the ``privacy`` section: per-client spend, median and maximum (001's Table 1).

    Records are merged by ``client-name``: a device restarted under a new node id (which takes
    its name over: :class:`strategies.replies.NameBook`) keeps one entry, its counts summed and its
    spend the largest it ever reported (a ledger only grows, so a lower report never lowers
    it). A node never heard from is listed as ``node <id>`` with no spend. ``relation``: the
    neighbouring relation the spend is under, as the device's last release said.
    """
    per_client: dict[str, Any] = {}
    for cid, record in clients.items():
        metrics = dict(record.metrics)
        # A device that failed every round never sent its name in a reply: its failures did.
        name = str(metrics.get("client-name") or getattr(record, "failed_as", "")
                   or f"node {cid}")
        entry = {
            "node_ids": [cid],
            **{key: int(getattr(record, key, 0)) for key in _COUNTS},
            "last_round": int(getattr(record, "last_round", 0)),
            "spend": spend_of(mechanism, metrics),
            "releases": int(metrics.get("releases", 0)),
            "spend_d": float(metrics.get("spend-d", 0.0)),
            "epsilon": float(metrics.get("spend-epsilon", 0.0)),
            # The two bounds the charged epsilon is the smaller of (0 from an older device).
            "epsilon_rdp": float(metrics.get("spend-epsilon-rdp", 0.0)),
            "epsilon_pld": float(metrics.get("spend-epsilon-pld", 0.0)),
            # Secure clusters: what the server learns from the sums, given the device's cohort
            # of honest devices (0 without secure releases).
            "central_epsilon": float(metrics.get("spend-central-epsilon", 0.0)),
            "delta": float(metrics.get("spend-delta", 0.0)),
            "budget_epsilon": float(metrics.get("budget-epsilon", 0.0)),
            "budget_delta": float(metrics.get("budget-delta", 0.0)),
            "sigma": float(metrics.get("sigma", 0.0)),
            # The device's last decline, as its reply said it (public values only).
            "declined_by": str(metrics.get("declined-by", "")),
            "decline_reason": str(metrics.get("decline-reason", "")),
            "relation": metrics.get("relation"),
            # Σ over its accepted releases of distance / the round's median (~1 a release for
            # an honest device; strategies.records.ClientRecord.pull).
            "pull": float(getattr(record, "pull", 0.0)),
            # The class of its last failure (ledger, release, refused-hypotheses, error).
            "failure": str(getattr(record, "failure", "")),
            "record_schedule": [list(r) for r in getattr(record, "record_schedule", [])],
        }
        if name in per_client:
            old = per_client[name]
            merged = dict(entry if entry["last_round"] >= old["last_round"] else old)
            for key in _COUNTS:
                merged[key] = old[key] + entry[key]
            for key in _MAXIMA:
                values = [v for v in (old[key], entry[key]) if v is not None]
                merged[key] = max(values) if values else None
            merged["pull"] = old["pull"] + entry["pull"]
            merged["record_schedule"] = old["record_schedule"] + entry["record_schedule"]
            merged["node_ids"] = [*old["node_ids"], cid]
            entry = merged
        per_client[name] = entry
    spends = [c["spend"] for c in per_client.values() if c["spend"] is not None]
    unit = {
        "laplace": "epsilon*r (d-privacy, Theorem 3.1 composition)",
        "gaussian": "epsilon at the client's delta (the smaller of dp-accounting's RDP and "
                    "PLD bounds)",
        "sign": "epsilon at the client's delta (the smaller of dp-accounting's RDP and PLD "
                "bounds)",
        "dpsgd": "record-level epsilon at the client's delta (RDP, dp-accounting), of one "
                 "record under each client's relation (add-remove or replace-one)",
    }.get(mechanism, "none: releases are not sanitized")
    return {
        "mechanism": mechanism,
        "unit": unit,
        "per_client": dict(sorted(per_client.items())),
        "median": statistics.median(spends) if spends else None,
        "max": max(spends) if spends else None,
    }


def device_health(per_client: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Sort the devices a run asked into working, failing throughout and out of budget.

    A device *failed throughout* when it was asked and none of its answers was a usable release
    nor a decline for its cap: its class is its last failure's (``ledger``, ``release``,
    ``refused-hypotheses``, ``error``), else ``bad-replies`` (every reply dropped),
    ``declined (policy)`` / ``declined (task-data)``, or ``no-reply``. A device is *out of
    budget* when its last decline was for its cap (``declined_by = "budget"``); ``releases``
    is what it paid.
    """
    failing: dict[str, str] = {}
    exhausted: dict[str, dict[str, Any]] = {}
    asked = working = 0
    for name, c in per_client.items():
        if not c.get("sampled"):
            continue
        asked += 1
        if c.get("declined_by") == "budget":
            reason = str(c.get("decline_reason", ""))
            family = next((f for f in CAP_SETTINGS if f"{f} cap" in reason), "d-privacy")
            exhausted[name] = {"releases": int(c.get("releases", 0)),
                               "cap_setting": CAP_SETTINGS[family]}
        if c.get("participations"):
            working += 1
        elif name not in exhausted:
            failing[name] = (c.get("failure") or
                             ("bad-replies" if c.get("dropped") else
                              f"declined ({c['declined_by']})" if c.get("declined_by") else
                              "no-reply"))
    return {"asked": asked, "working": working, "failing": dict(sorted(failing.items())),
            "budget_exhausted": dict(sorted(exhausted.items()))}


def _names(names: Any) -> str:
    names = list(names)
    if len(names) <= 4:
        return ", ".join(names)
    return f"{', '.join(names[:3])} and {len(names) - 3} more"


def health_status(health: Mapping[str, Any], last_round: int,
                  rounds_completed: int) -> tuple[str, str] | None:
    """Return ``(status, reason)`` when a run that did its rounds is not honestly complete.

    ``budget-exhausted``: devices declined for their caps and rounds went without the usable
    replies they needed; ``devices-failed``: more than half the devices asked failed
    throughout. ``None``: the run is complete.
    """
    exhausted, failing = health["budget_exhausted"], health["failing"]
    if exhausted and rounds_completed < last_round:
        settings = sorted({e["cap_setting"] for e in exhausted.values()})
        paid = ", ".join(f"{n} {e['releases']}" for n, e in exhausted.items())
        return "budget-exhausted", (
            f"{_names(exhausted)} reached their caps ({', '.join(settings)}); "
            f"{rounds_completed} of {last_round} rounds changed the hypotheses; releases "
            f"paid: {paid}; raise {' or '.join(settings)} or noise-multiplier, or lower "
            "num-rounds")
    if health["asked"] and 2 * len(failing) > health["asked"]:
        named = ", ".join(f"{n} ({c})" for n, c in failing.items())
        return "devices-failed", (
            f"{len(failing)} of {health['asked']} devices failed every round they were "
            f"asked: {named}; see their logs")
    return None


def optima_distances(hypotheses: list[list[float]], optima: Any) -> list[float] | None:
    """For each known optimum, the distance to its nearest hypothesis (None without optima).

    Only generated tasks know their optima (``task_info["optima"]``, e.g. the synthetic task);
    the hypotheses are flat, as in ``summary.json``.
    """
    if not optima or not hypotheses:
        return None
    h = np.asarray(hypotheses, dtype=np.float64)
    opt = np.asarray(optima, dtype=np.float64)
    if h.ndim != 2 or opt.ndim != 2 or h.shape[1] != opt.shape[1]:
        return None
    return [float(np.min(np.linalg.norm(h - o, axis=1))) for o in opt]


def metric_part(metrics: Mapping[str, Any], metric: str, k: int) -> str:
    """Say a validated round's task metric, overall and per hypothesis, for its round line.

    ``val_accuracy 0.937 (h0 0.951 on 12 users, h1 0.912 on 8 users)``: the mean over
    validation users, each scored with the hypothesis that fits it best, then each hypothesis's
    own users (``h2 no users`` where it fits none best).
    Empty for a task whose metric is its loss (the line shows ``val_loss`` already) or for a
    round that was not validated.
    """
    if metric == "loss" or metric not in metrics:
        return ""
    parts = []
    for j in range(k):
        users = metrics.get(f"hypothesis_{j}_users")
        value = metrics.get(f"hypothesis_{j}_{metric}")
        if users is not None:
            parts.append(f"h{j} {value:.3f} on {int(users)} users" if value is not None
                         else f"h{j} no users")
    per = f" ({', '.join(parts)})" if parts else ""
    return f" val_{metric} {float(metrics[metric]):.3f}{per}"


def round_line(record: Any, num_rounds: int, privacy: Mapping[str, Any],
               distances: list[float] | None = None, metric: str = "loss") -> str:
    """One human-readable line per round (the launcher prints these).

    ``distances`` (the current hypotheses' :func:`optima_distances`) adds ``to-optima`` with
    the largest of them: the run has found every group when it is small. ``metric`` (the
    task's, `tasks.Task.metric`) adds it beside the loss (:func:`metric_part`).
    """
    loss = "-" if record.val_loss is None else f"{record.val_loss:.4f}"
    median = privacy.get("median")
    maximum = privacy.get("max")
    spend = (
        "-" if median is None else f"{median:.3g}/{maximum:.3g}"
    )
    kept = getattr(record, "kept", None)
    return (
        f"{ROUND_TAG} round {record.round}/{num_rounds} val_loss {loss}"
        f"{metric_part(record.val_metrics or {}, metric, len(record.cluster_sizes))} "
        f"clusters {list(record.cluster_sizes)} replies {record.replies} "
        f"missing {len(getattr(record, 'missing', []))} "
        f"declined {record.declined} dropped {len(record.dropped)} failed {record.failures} "
        f"spend(median/max) {spend}"
        + ("" if distances is None else f" to-optima {max(distances):.2f}")
        + (f" (hypotheses kept: {kept})" if kept else "")
    )


def _jsonable(value: Any) -> Any:
    if isinstance(value, list) and len(value) > 64 and isinstance(value[0], float):
        # A flat hypothesis (83k floats for the digits CNN): checked in one NumPy pass instead
        # of one Python call per number; summary.json is rewritten after every round.
        try:
            values = np.asarray(value, dtype=np.float64)
        except (TypeError, ValueError):
            values = None
        if values is not None and values.ndim == 1 and np.isfinite(values).all():
            return value
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, np.generic):
        return _jsonable(value.item())
    if isinstance(value, np.ndarray):
        return [_jsonable(v) for v in value.tolist()]
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def write_json_atomic(path: Path, data: Any, indent: int | None = 2) -> None:
    """Write JSON atomically and durably (:func:`mechanisms.atomic_file.write_atomic`).

    ``indent=None`` writes it on one line with the standard library's C encoder, many times
    faster than the pure-Python one that any indent needs (for files of ~10⁵ numbers).
    """
    write_atomic(path, json.dumps(_jsonable(data), indent=indent) + "\n")


def history_entry(record: Any) -> dict[str, Any]:
    """One round of ``summary.json``'s ``history``."""
    entry: dict[str, Any] = {
        "round": record.round,
        "val_loss": record.val_loss,
        "val_metrics": dict(record.val_metrics or {}),
        "cluster_sizes": list(record.cluster_sizes),
        "replies": record.replies,
        "declined": record.declined,
        "dropped": [list(d) for d in record.dropped],
        "failures": record.failures, "sampled": getattr(record, "sampled", 0),
        "missing": list(getattr(record, "missing", [])),
        "failed": [list(f) for f in getattr(record, "failed", [])],
        "kept": getattr(record, "kept", None), "asked": list(getattr(record, "asked", [])),
    }
    if record.released is not None:
        entry["released"] = record.released
    return entry


def flat_hypotheses(hypotheses: list[list[np.ndarray]]) -> list[list[float]]:
    """Each hypothesis as one flat list of floats."""
    return [
        np.concatenate([np.asarray(a, dtype=np.float64).ravel() for a in h]).tolist()
        for h in hypotheses
    ]


#: Hypotheses of more numbers than this (all of them together) are not written into
#: ``summary.json`` as JSON numbers, which the ServerApp rewrites every round: 10⁶ parameters
#: took 34 s of a 40 s two-round run that way, and 6·10⁷ numbers held the ServerApp in one
#: ``json.dumps`` for over a minute, until the SuperLink ended the run. The summary then names
#: the arrays of the checkpoint (``checkpoint.npz``, rewritten every round in binary) instead.
INLINE_NUMBERS = 10_000
#: The checkpoint's array of the initial hypotheses, when they are too large for the summary.
INITIAL_ARRAY = "initial_hypotheses"


def hypotheses_entry(hypotheses: list[list[np.ndarray]], array: str
                     ) -> list[list[float]] | dict[str, Any]:
    """Return what ``summary.json`` holds for a set of hypotheses.

    Small ones as flat lists of floats; larger ones (over :data:`INLINE_NUMBERS`) as a reference
    to the checkpoint's array ``array``, with its shape: ``np.load(run / "checkpoint.npz")[array]``
    is the (k, n) float32 matrix, one flat hypothesis a row.
    """
    n = sum(int(np.size(a)) for a in hypotheses[0]) if hypotheses else 0
    if len(hypotheses) * n <= INLINE_NUMBERS:
        return flat_hypotheses(hypotheses)
    return {"checkpoint": CHECKPOINT_NAME, "array": array, "shape": [len(hypotheses), n],
            "dtype": "float32"}


def plot_summary(summary: Mapping[str, Any], path: Path) -> Path | None:
    """Draw the run's figure (the paper's Figure 1 for 2-parameter tasks).

    Left: the released vectors of every round (colour = round) with the final
    hypotheses and, for the synthetic task, the true optima. Right: validation
    loss per round. For tasks with more than 2 parameters only the loss curve
    is drawn. Returns the path written, or ``None`` when there is nothing to plot.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    history = summary.get("history", [])
    listed = summary.get("hypotheses")  # a reference to the checkpoint for large models
    hypotheses = np.asarray(listed if isinstance(listed, list) else [], dtype=float)
    two_d = hypotheses.ndim == 2 and hypotheses.shape[1] == 2
    fig, axes = plt.subplots(1, 2 if two_d else 1, figsize=(11 if two_d else 6, 4.5))
    ax_loss = axes[1] if two_d else axes
    if two_d:
        ax = axes[0]
        points, rounds = [], []
        for entry in history:
            for vec in entry.get("released") or []:
                points.append(vec)
                rounds.append(entry["round"])
        if points:
            pts = np.asarray(points)
            sc = ax.scatter(pts[:, 0], pts[:, 1], c=rounds, cmap="viridis", s=10, alpha=0.6,
                            label="released (sanitized) vectors")
            fig.colorbar(sc, ax=ax, label="round")
        ax.scatter(hypotheses[:, 0], hypotheses[:, 1], marker="X", s=120, c="red",
                   label="final hypotheses")
        optima = summary.get("task_info", {}).get("optima")
        if optima:
            opt = np.asarray(optima)
            ax.scatter(opt[:, 0], opt[:, 1], marker="*", s=200, facecolors="none",
                       edgecolors="black", label="true optima")
        ax.set_xlabel("θ[0]")
        ax.set_ylabel("θ[1]")
        ax.set_title("Released parameters and hypotheses")
        ax.legend(loc="best", fontsize=8)
    xs = [e["round"] for e in history if e.get("val_loss") is not None]
    ys = [e["val_loss"] for e in history if e.get("val_loss") is not None]
    if not xs and not two_d:
        plt.close(fig)
        return None
    ax_loss.plot(xs, ys, marker="o", ms=3, color="tab:blue", label="validation loss")
    ax_loss.set_xlabel("round")
    ax_loss.set_ylabel("validation loss")
    ax_loss.set_title("Validation (best hypothesis per user)")
    _plot_metric(ax_loss, history)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _plot_metric(ax_loss: Any, history: list[dict[str, Any]]) -> None:
    """Draw a classifier's validation accuracy on a second axis: overall and per hypothesis.

    Each hypothesis's curve is the mean accuracy of the validation users it fits best (a round
    where it fits none leaves a gap).
    """
    validated = [e for e in history if "accuracy" in (e.get("val_metrics") or {})]
    if not validated:
        return
    ax = ax_loss.twinx()
    rounds = [e["round"] for e in validated]
    ax.plot(rounds, [e["val_metrics"]["accuracy"] for e in validated], color="black",
            marker="s", ms=3, label="accuracy")
    k = max(len(e.get("cluster_sizes", [])) for e in validated)
    for j in range(k if k > 1 else 0):
        values = [e["val_metrics"].get(f"hypothesis_{j}_accuracy", math.nan) for e in validated]
        ax.plot(rounds, values, linestyle="--", lw=1, color=f"C{j + 1}",
                label=f"accuracy, hypothesis {j}'s users")
    ax.set_ylabel("validation accuracy")
    ax.set_ylim(0.0, 1.0)
    ax.legend(loc="center right", fontsize=7)


class RunRecorder:
    """Turns each round of the strategy into a log line, a checkpoint and an updated summary.

    Parameters
    ----------
    out_dir : Path
        Where ``summary.json`` and ``checkpoint.npz`` are written.
    config : Mapping[str, Any]
        The run config, stored in the summary as given.
    num_rounds : int
        The planned number of rounds (for the progress line and the status).
    mechanism : str
        The privacy mechanism, which decides how spend is reported.
    task_info : Mapping[str, Any]
        Task facts worth keeping with the results (e.g. the synthetic optima).
    identity : Mapping[str, Any], optional
        What a resumed run must share with this one (:func:`server.checkpoint.run_identity`);
        stored in the checkpoint.
    task : Task, optional
        The run's task: its metric goes in the round lines, and when the run ends it writes
        the delivered models in its own format (`tasks.delivered`).
    task_config : Mapping[str, Any], optional
        The settings that rebuild the task, kept in the models' manifest.
    sinks : sequence of server.tracking.Sink, optional
        Where each round's metrics also go (``log-to``: TensorBoard, MLflow); closed when the
        run ends or stops.
    """

    def __init__(self, out_dir: Path, config: Mapping[str, Any], num_rounds: int,
                 mechanism: str, task_info: Mapping[str, Any] | None = None,
                 identity: Mapping[str, Any] | None = None, task: Task | None = None,
                 task_config: Mapping[str, Any] | None = None,
                 sinks: Sequence[Sink] = ()) -> None:
        self.out_dir = out_dir
        self.sinks = list(sinks)
        self.task = task
        self.task_config = dict(task_config or {})
        #: The manifest of the delivered models, once the run has written them.
        self.models: dict[str, Any] | None = None
        self.config = dict(config)
        self.num_rounds = num_rounds
        self.mechanism = mechanism
        self.task_info = dict(task_info or {})
        self.identity = dict(identity or {})
        self.strategy: Any = None
        #: The initial hypotheses as ``summary.json`` gives them (:func:`hypotheses_entry`).
        self.initial_hypotheses: list[list[float]] | dict[str, Any] = []
        #: ... and as a (k, n) float32 matrix, kept in the checkpoint when they are large.
        self._initial: np.ndarray | None = None
        self.history: list[dict[str, Any]] = []
        #: One entry per resume: the round the run continued after.
        self.resumed: list[dict[str, Any]] = []

    @property
    def checkpoint_path(self) -> Path:
        """Where the checkpoint is written after each round."""
        return self.out_dir / CHECKPOINT_NAME

    def attach(self, strategy: Any) -> None:
        """Give the recorder the strategy whose state it reports."""
        self.strategy = strategy
        self.initial_hypotheses = hypotheses_entry(strategy.hypotheses, INITIAL_ARRAY)
        if isinstance(self.initial_hypotheses, dict):
            self._initial = np.stack([
                np.concatenate([np.asarray(a, dtype=np.float32).ravel() for a in h])
                for h in strategy.hypotheses])

    def status(self, privacy: Mapping[str, Any] | None = None) -> tuple[str, str | None]:
        """Return the run's status (one of :data:`STATUSES`) and why it is not complete.

        A run that did its rounds is ``complete`` (or ``stopped-early``) only if its devices
        worked (:func:`health_status`); ``privacy`` is its privacy report, if already built.
        """
        status, reason = self._status()
        if status in ("complete", "stopped-early"):
            s = self.strategy
            report = privacy or privacy_report(self.mechanism, s.clients)
            verdict = health_status(device_health(report["per_client"]), s.last_round,
                                    s.rounds_completed)
            if verdict is not None:
                return verdict
        return status, reason

    def _status(self) -> tuple[str, str | None]:
        s = self.strategy
        if getattr(s, "diverged", False):
            return "diverged", s.incomplete_reason
        if s.incomplete_reason is not None:
            return "incomplete", s.incomplete_reason
        if s.stopped_early:
            return "stopped-early", None
        if s.last_round >= self.num_rounds:
            return "complete", None
        return "running", None

    def summary(self) -> dict[str, Any]:
        """Return the current ``summary.json`` content."""
        s = self.strategy
        privacy = privacy_report(self.mechanism, s.clients)
        status, reason = self.status(privacy)
        # What the run delivers: the hypotheses of the best validation round (early stopping
        # keeps the best model); the last ones are kept for reference.
        delivered = (hypotheses_entry(s.best_hypotheses, "best_hypotheses")
                     if s.best_hypotheses is not None
                     else hypotheses_entry(s.hypotheses, "hypotheses"))
        last = hypotheses_entry(s.hypotheses, "hypotheses")
        return {
            "status": status,
            "incomplete_reason": reason,
            "num_rounds": self.num_rounds,
            "last_round": s.last_round,
            "config": self.config,
            "task_info": self.task_info,
            "rounds_completed": s.rounds_completed,
            "stopped_early": s.stopped_early,
            "best_val_loss": s.best_loss,
            "best_round": s.best_round,
            "hypotheses": delivered,
            "last_hypotheses": last,
            # Each known optimum's distance to the nearest delivered hypothesis (null if unknown).
            "optima_distances": (optima_distances(delivered, self.task_info.get("optima"))
                                 if isinstance(delivered, list) else None),
            "initial_hypotheses": self.initial_hypotheses,
            "history": self.history,
            "resumed": self.resumed,
            "checkpoint": str(self.checkpoint_path),
            "privacy": privacy,
            "devices": device_health(privacy["per_client"]),
            **({"models": self.models} if self.models is not None else {}),
        }

    def checkpoint(self) -> None:
        """Write the checkpoint of the last recorded round (atomically)."""
        state, arrays = self.strategy.state()
        if self._initial is not None:
            arrays = {**arrays, INITIAL_ARRAY: self._initial}
        write_checkpoint(self.checkpoint_path, {
            "identity": self.identity,
            "strategy": state,
            "recorder": {"history": self.history, "initial_hypotheses": self.initial_hypotheses,
                         "resumed": self.resumed},
        }, arrays)

    def restore(self, state: Mapping[str, Any],
                arrays: Mapping[str, np.ndarray] | None = None) -> None:
        """Continue the history of a checkpoint's recorder (after the strategy's restore).

        ``arrays``: the checkpoint's arrays, which hold the initial hypotheses of a large model.
        """
        recorder = state["recorder"]
        self.history = list(recorder["history"])
        initial = recorder["initial_hypotheses"]
        if isinstance(initial, dict):
            self.initial_hypotheses = dict(initial)
            self._initial = np.asarray((arrays or {})[INITIAL_ARRAY], dtype=np.float32)
        else:
            self.initial_hypotheses, self._initial = list(initial), None
        self.resumed = [*recorder.get("resumed", []),
                        {"after_round": self.strategy.last_round,
                         "at": time.strftime("%Y-%m-%dT%H:%M:%S")}]

    def write(self) -> dict[str, Any]:
        """Rewrite ``summary.json``; return its content."""
        summary = self.summary()
        # Indented for people: a large model's hypotheses are in the checkpoint, not here.
        write_json_atomic(self.out_dir / "summary.json", summary, indent=2)
        return summary

    def on_round(self, record: Any) -> None:
        """Record one round: checkpoint, summary, then its line (so the line means "saved")."""
        self.history.append(history_entry(record))
        self.checkpoint()
        summary = self.write()
        last = summary["last_hypotheses"]
        distances = optima_distances(last if isinstance(last, list) else [],
                                     self.task_info.get("optima"))
        metric = self.task.metric if self.task is not None else "loss"
        logger.info(round_line(record, self.num_rounds, summary["privacy"], distances, metric))
        self._track(self.history[-1], summary["privacy"], metric)
        if self.strategy.stopped_early and record.val_loss is not None:
            logger.info("%s stopped early after round %d: no improvement", ROUND_TAG,
                        record.round)

    def on_end(self) -> None:
        """Write the summary once more and say how the run ended, in its last ``[gpfl]`` line.

        The line (:data:`END_LINE`) is how a watcher without the run's files (``gpfl submit``
        in a container) learns the status: ``complete``, ``budget-exhausted``, ...
        """
        self.deliver()
        self.close_sinks()
        summary = self.write()
        reason = summary.get("incomplete_reason")
        logger.info("%s %s%s", END_LINE, summary["status"], f": {reason}" if reason else "")

    def _track(self, entry: Mapping[str, Any], privacy: Mapping[str, Any], metric: str) -> None:
        """Send the round's numbers to the ``log-to`` sinks; a sink that fails is dropped.

        A tracking server that goes away must not stop the federation: the round line says so
        once, and summary.json keeps every number.
        """
        if not self.sinks:  # no log-to: nothing to build on the round's path
            return
        numbers = metrics_of(entry, privacy, len(entry.get("cluster_sizes", [])), metric)
        for sink in list(self.sinks):
            try:
                sink.log(int(entry["round"]), numbers)
            except Exception as err:  # the backend's own errors: any of its exceptions
                logger.error("%s log-to: %s failed (%s: %s); it gets no more rounds", ROUND_TAG,
                             type(sink).__name__, type(err).__name__, err)
                self.sinks.remove(sink)

    def close_sinks(self) -> None:
        """Close the ``log-to`` sinks (the run ended or stopped)."""
        close_all(self.sinks)
        self.sinks = []

    def deliver(self) -> None:
        """Write the delivered hypotheses in the task's format (`tasks.delivered`), if any.

        Those of the best validation round (the last ones where no round was validated), with
        each one's validation users and metrics in that round. A failure to write them is
        logged and leaves the run's status as it is: the checkpoint holds the same numbers.
        """
        s = self.strategy
        if self.task is None or s is None or s.last_round == 0:
            return
        hypotheses = s.best_hypotheses if s.best_hypotheses is not None else s.hypotheses
        entry = next((e for e in self.history if e["round"] == s.best_round), None)
        validation = validation_of(entry["val_metrics"], len(hypotheses)) if entry else []
        try:
            manifest = write_delivered(self.out_dir, self.task, self.task_config, hypotheses,
                                       best_round=s.best_round, validation=validation)
        except (OSError, ValueError) as err:
            logger.error("%s could not write the delivered models: %s", ROUND_TAG, err)
            return
        written = json.loads(manifest.read_text(encoding="utf-8"))
        self.models = {"folder": MODELS_DIR, "manifest": f"{MODELS_DIR}/{MANIFEST}",
                       "metric": written["metric"], "best_round": written["best_round"],
                       "models": written["models"]}

    def on_stop(self, reason: str) -> None:
        """Record that the run stops before its last round (too few devices)."""
        self.deliver()
        self.close_sinks()
        self.write()
        logger.error("%s run incomplete: %s; the checkpoint of round %d is in %s: continue "
                     "with resume-from=%s", ROUND_TAG, reason, self.strategy.last_round,
                     self.out_dir, self.out_dir)


def mark_incomplete(out_dir: Path, reason: str) -> dict[str, Any] | None:
    """Mark a run's summary ``incomplete`` if it still says ``running``; return it.

    For whoever watched a ServerApp that died without saying so (killed, crashed): the summary
    is left as it was after the last completed round, which the checkpoint holds too.
    Returns ``None`` if there is no summary.
    """
    path = out_dir / "summary.json"
    if not path.is_file():
        return None
    summary = json.loads(path.read_text())
    if summary.get("status", "running") == "running":
        summary["status"] = "incomplete"
        summary["incomplete_reason"] = reason
        write_json_atomic(path, summary)
    return dict(summary)
