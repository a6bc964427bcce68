"""Secure clusters against the default mode, at the same local charge and at the same central ε.

Two tasks, 20 devices, every device every round, k = 2, E = 5, the ``plateau`` server update:
the synthetic task (paper 001 §4.1, 60 rounds; measured: the largest distance from an optimum
to its nearest delivered hypothesis) and rotated digits with 002's logistic regression (30
rounds; measured: the delivered hypotheses' accuracy on 20 held-out users). Three arms per task
and seed, each a real federation on the direct engine (this repository's ServerApp and
ClientApp with Flower's server loop in one process, ``deploy/direct_grid.py``; in the secure arms
Flower's own ``SecAggPlusWorkflow`` and ``secaggplus_mod`` run every stage of the protocol):

* ``per-device``: today's mode, the Gaussian mechanism at the local (ε, δ) of the task, each
  device's release seen by the server, k-means on the server;
* ``secure``: ``aggregation-privacy = "secure-clusters"`` at the same local (ε, δ) (the same
  per-device noise multiplier, the same charge), ``min-cohort`` = 4: the server sees only the
  per-cluster sums; each device also records the central ε of the sums;
* ``central``: the central-DP baseline at the secure arm's central ε: the same protocol with
  ``min-cohort`` = 20, every device (a trusted aggregator's noise: the sum carries exactly the
  noise of one central Gaussian release of that ε, split over the 20 devices), so its devices'
  local floor is √(20/4) times weaker in multiplier. It differs from ``secure`` only in how
  many devices' shares the noise is split over: what the secure mode pays for tolerating 16
  dropped or dishonest devices.

Measured per run besides utility: each device's local ε and central ε (from its replies), and the
cost of a round (the run's wall time over its rounds, and for the secure arms the bytes each
device sent and received, measured on the server's side of every SecAgg+ message,
``secure_rounds.jsonl``; for ``per-device`` the bytes of its float32 release and of the k
float32 hypotheses it receives, from the model's size).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from experiments.core.common import Context, FederationSpec
from experiments.core.runner import Cell, Experiment
from experiments.core.tables import mean_pm_ci, paired_difference, verdict
from mechanisms.calibration import (
    calibrate_gaussian_noise_multiplier,
    composed_gaussian_epsilon_rdp,
)

NAME = "secure-clusters"
DEVICES = 20
SECURE_COHORT = 4
DELTA = 1e-5
#: Per task: the run config (on top of the app's defaults) and its local ε target.
TASKS: dict[str, dict[str, Any]] = {
    "synthetic": {
        "epsilon": 50.0,
        "config": {"task": "synthetic", "users": DEVICES, "num-rounds": 60, "clip": 1.0},
    },
    "digits": {
        "epsilon": 50.0,
        "config": {"task": "digits", "model": "logistic", "users": DEVICES,
                   "rotate-probability": 0.5, "learning-rate": 0.2, "batch-size": 10,
                   "num-rounds": 30, "clip": 1.0, "server-device": "cpu"},
    },
}
ARMS = ("per-device", "secure", "central")
PROFILES: dict[str, dict[str, Any]] = {
    "full": {"seeds": list(range(10))},
    "quick": {"seeds": list(range(5))},
    "smoke": {"seeds": [0], "rounds": 3},
}
COLUMNS = ("task", "arm", "seed", "rounds", "metric", "local_epsilon", "central_epsilon",
           "round_s", "bytes_up", "bytes_down")


def central_arm_epsilon(epsilon: float, rounds: int) -> float:
    """Return the local ε target whose sum over all devices has the secure arm's central ε.

    The secure arm's central multiplier is √(2m)·z with m = 4; the central arm's, √(2n)·z' with
    n = 20 devices: z' = z·√(m/n), and the target is the RDP ε of ``rounds`` releases at z' (what
    the devices' calibration inverts back to z').
    """
    z = calibrate_gaussian_noise_multiplier(epsilon, DELTA, rounds)
    z_central_arm = z * (SECURE_COHORT / DEVICES) ** 0.5
    return composed_gaussian_epsilon_rdp({z_central_arm: rounds}, DELTA)


def run_config(task: str, arm: str, seed: int, rounds: int) -> dict[str, Any]:
    """Return one federation's run config."""
    spec = TASKS[task]
    config: dict[str, Any] = {
        **spec["config"], "num-rounds": rounds, "num-hypotheses": 2,
        "clients-per-round": DEVICES, "validation-users": 20, "local-epochs": 5,
        "patience": 0, "server-update": "plateau", "mechanism": "gaussian", "delta": DELTA,
        "epsilon": spec["epsilon"], "seed": seed, "data-seed": seed,
    }
    if arm == "secure":
        config.update({"aggregation-privacy": "secure-clusters", "min-cohort": SECURE_COHORT})
    elif arm == "central":
        config.update({"aggregation-privacy": "secure-clusters", "min-cohort": DEVICES,
                       "epsilon": central_arm_epsilon(spec["epsilon"], rounds)})
    return config


def _grid(ctx: Context) -> list[Cell]:
    profile = PROFILES[ctx.profile]
    cells = []
    for task, spec in TASKS.items():
        rounds = profile.get("rounds", spec["config"]["num-rounds"])
        for seed in ctx.pick_seeds(profile["seeds"]):
            for arm in ARMS:
                config = run_config(task, arm, seed, rounds)
                cells.append(Cell.of(FederationSpec(f"{task} {arm} seed={seed}", config,
                                                    DEVICES),
                                     task=task, arm=arm, seed=seed, rounds=rounds))
    return cells


def _utility(task: str, summary: Mapping[str, Any]) -> float:
    if task == "synthetic":
        return float(max(summary["optima_distances"]))
    best = summary["best_round"]
    entry = next(e for e in summary["history"] if e["round"] == best)
    return float(entry["val_metrics"]["accuracy"])


def _bytes(summary: Mapping[str, Any], arm: str, rounds: int) -> tuple[float, float]:
    """Return the bytes a device sends and receives in a round (see the module notes)."""
    if arm == "per-device":
        size = int(summary["task_info"]["num_parameters"])
        return 4.0 * size, 4.0 * 2 * size
    lines = (Path(summary["_run_dir"]) / "secure_rounds.jsonl").read_text().splitlines()
    checks = [json.loads(line) for line in lines][:rounds]
    up = statistics.mean(c["bytes_received_per_device"] for c in checks)
    down = statistics.mean(c["bytes_sent_per_device"] for c in checks)
    return up, down


def _measure(cell: Cell, summary: Mapping[str, Any]) -> dict[str, Any]:
    k = cell.keys
    clients = summary["privacy"]["per_client"].values()
    local = max(float(c["epsilon"]) for c in clients)
    central = max(float(c.get("central_epsilon", 0.0)) for c in clients)
    up, down = _bytes(summary, k["arm"], k["rounds"])
    return {**k, "metric": _utility(k["task"], summary), "local_epsilon": local,
            # Without secure clusters the server sees each release: its central ε is the local.
            "central_epsilon": central if central > 0 else local,
            "round_s": float(summary.get("_wall_s", 0.0)) / max(k["rounds"], 1),
            "bytes_up": up, "bytes_down": down}


# ------------------------------------------------------------------------------ the report
def section(rows: list[dict[str, str]]) -> list[str]:
    """Return the Markdown of the "Secure clusters" section from ``results.csv``'s rows."""
    out = [
        "**Secure clusters.** 20 devices, every device every round, k = 2, E = 5, `plateau`; "
        "the synthetic task (60 rounds; the largest distance from an optimum to its nearest "
        "delivered hypothesis, lower is better) and rotated digits with logistic regression "
        "(30 rounds; the delivered hypotheses' accuracy on 20 held-out users). Real federations "
        "on the direct engine, Flower's SecAgg+ in every secure round "
        "(`experiments/reproductions/secure_clusters.py`). *per-device*: today's Gaussian "
        "mode at local (ε = 50, δ = 1e-5); *secure*: `secure-clusters` at the same local "
        "charge, `min-cohort` = 4; *central*: the central-DP baseline at the secure arm's "
        "central ε (the same protocol with the noise split over all 20 devices). Mean ± 95 % "
        "interval over seeds; ε per device at δ = 1e-5 after the run (central: what the sums "
        "give away; for per-device the server sees each release, so it is the local ε). "
        "At one local charge the two modes' noise differs in kind: a per-device Gaussian "
        "release is the model, so its noise must also cover the hypothesis it was trained "
        "from (σ = z·(2C + D), D the diameter of the hypotheses, about 10 on the synthetic "
        "task), while a share holds only the update in its slot (σ = z·2B for any "
        "hypotheses), but every device's noise lands in every slot and the counts are as "
        "noisy as a coordinate. The local ε of the secure arms is RDP's alone; per-device "
        "charges the smaller of RDP's and PLD's.",
        "",
        "| task | arm | runs | utility | local ε | central ε | s / round | bytes up / down "
        "a device a round |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for task in TASKS:
        for arm in ARMS:
            group = [r for r in rows if r["task"] == task and r["arm"] == arm]
            if not group:
                continue
            metric = [float(r["metric"]) for r in group]
            out.append(
                f"| {task} | {arm} | {len(group)} | {mean_pm_ci(metric, seeds=True)} | "
                f"{statistics.mean(float(r['local_epsilon']) for r in group):.3g} | "
                f"{statistics.mean(float(r['central_epsilon']) for r in group):.3g} | "
                f"{statistics.mean(float(r['round_s']) for r in group):.2f} | "
                f"{statistics.mean(float(r['bytes_up']) for r in group):,.0f} / "
                f"{statistics.mean(float(r['bytes_down']) for r in group):,.0f} |")
    out += ["", *_differences(rows)]
    return out


def _differences(rows: list[dict[str, str]]) -> list[str]:
    """Paired differences (same task, seed): secure − per-device, secure − central."""
    lines = []
    for task in TASKS:
        by_arm = {arm: {int(r["seed"]): float(r["metric"]) for r in rows
                        if r["task"] == task and r["arm"] == arm} for arm in ARMS}
        for other in ("per-device", "central"):
            mean, half, n = paired_difference(by_arm["secure"], by_arm[other])
            if n:
                lines.append(f"- {task}, secure − {other} (paired by seed): "
                             f"{verdict(mean, half, n)}.")
    return lines


EXPERIMENT = Experiment(name=NAME, columns=COLUMNS, grid=_grid, measure=_measure,
                        report=section, shown=("metric", "local_epsilon", "central_epsilon"),
                        paper="secure aggregation with distributed noise (Kairouz et al. 2021)",
                        profiles=PROFILES,
                        volatile={"metric": "the secure arms' noise shares come from OpenDP's "
                                            "exact sampler and the OS's entropy, which takes "
                                            "no seed (a device's noise-seed does not apply)",
                                  "round_s": "a timing"})
