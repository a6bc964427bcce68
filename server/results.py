"""Results of a run: the per-round line, ``summary.json`` and the figure.

The summary is rewritten (atomically) after every round, so a run that is
interrupted still leaves what it had learnt, and the final file is complete
once the last round is recorded.
"""

from __future__ import annotations

import json
import logging
import math
import os
import statistics
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

ROUND_TAG = "[gpfl]"


def spend_of(mechanism: str, metrics: Mapping[str, Any]) -> float | None:
    """Return a client's total spend in its mechanism's own terms.

    ε·r (d-privacy) for Laplace, the RDP-composed ε for Gaussian and sign,
    ``None`` (unbounded) without a mechanism.
    """
    if mechanism == "laplace":
        return float(metrics.get("spend-d", 0.0))
    if mechanism in ("gaussian", "sign"):
        return float(metrics.get("spend-epsilon", 0.0))
    return None


def privacy_report(mechanism: str, clients: Mapping[str, Any]) -> dict[str, Any]:
    """Build the ``privacy`` section: per-client spend, median and maximum (001's Table 1)."""
    per_client: dict[str, Any] = {}
    # A client restarted under a new node id reports under the same name: its
    # records are merged, its spend is the one its ledger reported last.
    for cid, record in clients.items():
        metrics = dict(record.metrics)
        name = str(metrics.get("client-name", cid))
        entry = {
            "node_ids": [cid],
            "participations": record.participations,
            "declines": record.declines,
            "dropped": record.dropped,
            "spend": spend_of(mechanism, metrics),
            "releases": int(metrics.get("releases", 0)),
            "spend_d": float(metrics.get("spend-d", 0.0)),
            "epsilon": float(metrics.get("spend-epsilon", 0.0)),
            "delta": float(metrics.get("spend-delta", 0.0)),
            "budget_epsilon": float(metrics.get("budget-epsilon", 0.0)),
            "budget_delta": float(metrics.get("budget-delta", 0.0)),
            "sigma": float(metrics.get("sigma", 0.0)),
        }
        if name in per_client:
            old = per_client[name]
            merged = dict(entry if entry["releases"] >= old["releases"] else old)
            for key in ("participations", "declines", "dropped"):
                merged[key] = old[key] + entry[key]
            merged["node_ids"] = [*old["node_ids"], cid]
            entry = merged
        per_client[name] = entry
    spends = [c["spend"] for c in per_client.values() if c["spend"] is not None]
    unit = {
        "laplace": "epsilon*r (d-privacy, Theorem 3.1 composition)",
        "gaussian": "epsilon at the client's delta (RDP, dp-accounting)",
        "sign": "epsilon at the client's delta (RDP, dp-accounting)",
    }.get(mechanism, "none: releases are not sanitized")
    return {
        "mechanism": mechanism,
        "unit": unit,
        "per_client": dict(sorted(per_client.items())),
        "median": statistics.median(spends) if spends else None,
        "max": max(spends) if spends else None,
    }


def round_line(record: Any, num_rounds: int, privacy: Mapping[str, Any]) -> str:
    """One human-readable line per round (the launcher prints these)."""
    loss = "-" if record.val_loss is None else f"{record.val_loss:.4f}"
    median = privacy.get("median")
    maximum = privacy.get("max")
    spend = (
        "-" if median is None else f"{median:.3g}/{maximum:.3g}"
    )
    return (
        f"{ROUND_TAG} round {record.round}/{num_rounds} val_loss {loss} "
        f"clusters {list(record.cluster_sizes)} replies {record.replies} "
        f"declined {record.declined} dropped {len(record.dropped)} failed {record.failures} "
        f"spend(median/max) {spend}"
    )


def _jsonable(value: Any) -> Any:
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


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON so that a reader never sees a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(_jsonable(data), fh, indent=2)
            fh.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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
        "failures": record.failures,
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
    hypotheses = np.asarray(summary.get("hypotheses", []), dtype=float)
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
    ax_loss.plot(xs, ys, marker="o", ms=3)
    ax_loss.set_xlabel("round")
    ax_loss.set_ylabel("validation loss")
    ax_loss.set_title("Validation loss (best hypothesis per user)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


class RunRecorder:
    """Turns each round of the strategy into a log line and an updated summary.

    Parameters
    ----------
    out_dir : Path
        Where ``summary.json`` is written.
    config : Mapping[str, Any]
        The run config, stored in the summary as given.
    num_rounds : int
        The planned number of rounds (for the progress line).
    mechanism : str
        The privacy mechanism, which decides how spend is reported.
    task_info : Mapping[str, Any]
        Task facts worth keeping with the results (e.g. the synthetic optima).
    """

    def __init__(self, out_dir: Path, config: Mapping[str, Any], num_rounds: int,
                 mechanism: str, task_info: Mapping[str, Any] | None = None) -> None:
        self.out_dir = out_dir
        self.config = dict(config)
        self.num_rounds = num_rounds
        self.mechanism = mechanism
        self.task_info = dict(task_info or {})
        self.strategy: Any = None
        self.initial_hypotheses: list[list[float]] = []
        self.history: list[dict[str, Any]] = []

    def attach(self, strategy: Any) -> None:
        """Give the recorder the strategy whose state it reports."""
        self.strategy = strategy
        self.initial_hypotheses = flat_hypotheses(strategy.hypotheses)

    def summary(self) -> dict[str, Any]:
        """Return the current ``summary.json`` content."""
        s = self.strategy
        return {
            "config": self.config,
            "task_info": self.task_info,
            "rounds_completed": s.rounds_completed,
            "stopped_early": s.stopped_early,
            "best_val_loss": s.best_loss,
            "best_round": s.best_round,
            # What the run delivers: the hypotheses of the best validation round
            # (early stopping keeps the best model), and the last ones for reference.
            "hypotheses": flat_hypotheses(
                s.best_hypotheses if s.best_hypotheses is not None else s.hypotheses
            ),
            "last_hypotheses": flat_hypotheses(s.hypotheses),
            "initial_hypotheses": self.initial_hypotheses,
            "history": self.history,
            "privacy": privacy_report(self.mechanism, s.clients),
        }

    def on_round(self, record: Any) -> None:
        """Record one round: log its line and rewrite the summary."""
        self.history.append(history_entry(record))
        summary = self.summary()
        logger.info(round_line(record, self.num_rounds, summary["privacy"]))
        if self.strategy.stopped_early and record.val_loss is not None:
            logger.info("%s stopped early after round %d: no improvement", ROUND_TAG,
                        record.round)
        write_json_atomic(self.out_dir / "summary.json", summary)
