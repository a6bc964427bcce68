"""The papers' server update against gpfl's ``plateau`` on rotated digits (accuracy vs ν).

``small-federations`` chose ``plateau`` on the synthetic task, where the server's validation
loss measures the distance to the optima directly. This experiment asks whether it costs
anything where the model is a CNN and the server validates on 20 held-out users: the digits
federation of ``accuracy-vs-nu`` (50 users, 7 a round, E = 5, k = 2, Euclidean Laplace with the
neighbourhood calibration, the same run config,
``experiments.reproductions.accuracy_vs_nu.digits_config``), once with ``server-update = mean``
(Algorithm 1, the papers') and once with the quickstart's ``server-update = plateau`` and
``reseed-after = 3``, at ν = 1 and ν = 5, each seed with its own data draw. Runs at one seed differ
only in the update: the same data, the same devices asked in the same rounds (devices are drawn by
name), so the difference is paired by seed.

Reported per run: the validation accuracy of the delivered hypotheses (the best validation
round's) and of the last round's, and each device's spend (the update is post-processing, so
the two updates spend the same).
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from deploy.quickstart import QUICKSTART_RUN_CONFIG, ROBUST_CLUSTERS
from experiments.core.claims import flow
from experiments.core.common import Context, FederationSpec
from experiments.core.runner import Cell, Experiment
from experiments.core.sanity import at_most, within
from experiments.core.tables import (
    CI_NAME,
    best_entry,
    excludes_zero,
    last_entry,
    mean_ci,
    paired_difference,
    spends_of,
    verdict,
)
from experiments.reproductions.accuracy_vs_nu import USERS, digits_config
from strategies.server_update import RESEEDED

NAME = "digits-server-update"
COLUMNS = ("nu", "update", "seed", "accuracy", "final_accuracy", "mean_accuracy", "best_round",
           "rounds", "median_spend", "max_spend", "dropped", "reseeded")
#: Each arm's overrides of the digits run config (whose clusters are plain means,
#: ``experiments.core.common.PAPERS_AGGREGATION``); ``papers`` is the app's default update, ``gpfl``
#: the quickstart's update and robust cluster aggregation (``deploy.quickstart``).
UPDATES: dict[str, dict[str, Any]] = {
    "papers": {"server-update": "mean"},
    "plateau": {"server-update": "plateau", "reseed-after": 3},
    "gpfl": {**{key: QUICKSTART_RUN_CONFIG[key] for key in ("server-update", "reseed-after")},
             **ROBUST_CLUSTERS},
}
#: The paired claims: (arm, against it, what the difference measures).
COMPARISONS = (("plateau", "papers", "plateau − papers (the server update)"),
               ("gpfl", "plateau", "gpfl − plateau (the robust aggregation)"))
#: accuracy-vs-nu's profile of the same name supplies rounds, validation and early stopping.
PROFILES: dict[str, dict[str, Any]] = {
    "full": {"nus": [1.0, 5.0], "seeds": [0, 1, 2, 3, 4]},
    "quick": {"nus": [1.0, 5.0], "seeds": [0, 1, 2, 3, 4]},
    "smoke": {"nus": [5.0], "seeds": [0]},
}
#: How much lower an accuracy may be and still count as "no worse" (one validation user of 20
#: scored on ~7 images moves the accuracy by about 0.007; 0.02 is three such users' worth).
TOLERANCE = 0.02


def grid(ctx: Context) -> list[Cell]:
    """Seeds outermost, then ν, then the update (the two arms of a seed run side by side)."""
    p = PROFILES[ctx.profile]
    cells = []
    for seed in ctx.pick_seeds(p["seeds"]):
        for nu in p["nus"]:
            for update, overrides in UPDATES.items():
                config = {**digits_config(nu, 2, seed, ctx.profile), **overrides}
                spec = FederationSpec(f"digits nu={nu:g} update={update} seed={seed}", config,
                                      USERS)
                cells.append(Cell.of(spec, nu=nu, update=update, seed=seed))
    return cells


def measure(cell: Cell, summary: dict[str, Any]) -> dict[str, Any]:
    """One results.csv row from a finished run."""
    curve = [e["val_metrics"]["accuracy"] for e in summary["history"]
             if e["round"] > 0 and e.get("val_loss") is not None]
    spends = spends_of(summary, USERS)
    best = best_entry(summary)
    return {
        **cell.keys,
        "accuracy": best["val_metrics"].get("accuracy"),
        "final_accuracy": last_entry(summary)["val_metrics"].get("accuracy"),
        "mean_accuracy": sum(curve) / len(curve) if curve else None,
        "best_round": best["round"],
        "rounds": summary["rounds_completed"],
        "median_spend": statistics.median(spends),
        "max_spend": max(spends),
        # Replies left out of the clusters (screened out, or set aside by the persistence test).
        "dropped": sum(len(e.get("dropped", [])) for e in summary["history"]),
        "reseeded": reseeds(Path(summary["_run_dir"])),
    }


def reseeds(run_dir: Path) -> int:
    """Count the re-seedings the ServerApp logged (``logs/flwr-run.log`` of the run)."""
    log = run_dir / "logs" / "flwr-run.log"
    text = log.read_text(encoding="utf-8", errors="replace") if log.is_file() else ""
    return text.count(RESEEDED)


def _by_seed(rows: list[dict[str, str]], nu: float, update: str, key: str) -> dict[int, float]:
    return {int(r["seed"]): float(r[key]) for r in rows
            if float(r["nu"]) == nu and r["update"] == update and r.get(key) not in (None, "")}


def no_worse(text: str, mean: float, half: float, n: int) -> str:
    """Say whether one arm is no worse than the other: the interval's lower end ≥ −TOLERANCE."""
    shown = verdict(mean, half, n)
    if n < 2 or math.isnan(half):
        return f"{text}: {shown}; no interval, so not claimed."
    if mean - half >= -TOLERANCE:
        better = " and better (the interval excludes 0)" if excludes_zero(mean, half, n) else ""
        status = f"no worse (the interval's lower end is above −{TOLERANCE:g}){better}"
    elif excludes_zero(mean, half, n) and mean < 0:
        status = "**worse** (the interval lies below 0)"
    else:
        status = f"**not shown to be no worse** (the interval reaches below −{TOLERANCE:g})"
    return f"{text}: {shown}; {status}."


_TEXT = flow("""
**Setting.** The digits federation of accuracy-vs-nu (k = 2, 50 users, 7 a round, E = 5, its
profile's rounds and validation; `experiments/reproductions/digits_server_update.py`) with the
papers' update (`server-update = mean`), with the quickstart's (`server-update = plateau`,
`reseed-after = 3`), both averaging each cluster plainly (`cluster-aggregator = mean`), and
*gpfl*: the quickstart's update with the quickstart's robust clusters
(`cluster-aggregator = clipped-mean`, `persistence-threshold = 3`); each seed its own data
draw, the arms of a seed on the same data and devices. Half the users' images are rotated, so
the devices of a cluster differ, which is what the persistence test could mistake for a rogue.
*Delivered*: the validation accuracy of the best validation round's hypotheses (what a run
delivers); *final*: the last round's; *dropped*: replies left out of the clusters over the run
(screened out, or from devices the persistence test set aside); *re-seeded*: hypotheses
re-seeded by splitting another's cluster (`reseed-after`; under a robust aggregator a cluster
no larger than ⌈0.2·m⌉ of the round's m releases counts as empty: 2 of 7 here); both summed
over seeds.
""")


def section(rows: list[dict[str, str]]) -> list[str]:
    """Write the section of docs/RESULTS.md from the rows."""
    nus = sorted({float(r["nu"]) for r in rows})
    lines = [_TEXT, "", f"Validation accuracy ({CI_NAME}, (seeds)):", "",
             "| ν | update | delivered | final | mean over rounds | best round (median) | "
             "spend per device (median) | dropped | re-seeded |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for nu in nus:
        for update in UPDATES:
            mine = [r for r in rows if float(r["nu"]) == nu and r["update"] == update]
            if not mine:
                continue
            cells = []
            for key in ("accuracy", "final_accuracy", "mean_accuracy"):
                m, h, n = mean_ci(float(r[key]) for r in mine)
                cells.append(f"{m:.3f} ({n})" if n < 2 else f"{m:.3f} ± {h:.3f} ({n})")
            best = statistics.median(int(r["best_round"]) for r in mine)
            spend = statistics.median(float(r["median_spend"]) for r in mine)
            counts = [sum(int(r.get(key) or 0) for r in mine) for key in ("dropped", "reseeded")]
            lines.append(f"| {nu:g} | {update} | " + " | ".join(cells) +
                         f" | {best:g} | {spend:g} | {counts[0]} | {counts[1]} |")
    same = sum(1 for r in rows if r["update"] == "plateau" and any(
        q["update"] == "papers" and q["seed"] == r["seed"] and q["nu"] == r["nu"] and all(
            q[key] == r[key] for key in ("accuracy", "final_accuracy", "mean_accuracy"))
        for q in rows))
    pairs = sum(1 for r in rows if r["update"] == "plateau")
    lines += ["", f"In {same} of {pairs} pairs the papers' and the plateau runs end with the "
              "same accuracies in every column: until the validation loss stalls for "
              "`anneal-after` validations, `plateau` takes the papers' full step, so a run that "
              "never stalls is the papers' run.", "",
              "Paired by seed, mean [95 % Student-t interval]; \"no worse\" means the "
              f"interval's lower end is above −{TOLERANCE:g}:", ""]
    for arm, against, what_differs in COMPARISONS:
        for nu in nus:
            for key, what in (("accuracy", "delivered"), ("final_accuracy", "final")):
                a, b = _by_seed(rows, nu, arm, key), _by_seed(rows, nu, against, key)
                if a and b:
                    lines.append("- " + no_worse(f"{what_differs}, ν = {nu:g}, {what} accuracy",
                                                 *paired_difference(a, b)))
    reseeded = {arm: sum(int(r.get("reseeded") or 0) for r in rows if r["update"] == arm)
                for arm in ("plateau", "gpfl")}
    if any(r["update"] == "gpfl" for r in rows):
        lines += ["", f"Re-seedings over all runs: {reseeded['gpfl']} with the robust clusters, "
                  f"{reseeded['plateau']} without. With 7 releases a round and k = 2, a cluster of "
                  "two releases is common; under a robust aggregator it cannot move and counts "
                  "as empty, so after `reseed-after` rounds the other, trained hypothesis's "
                  "cluster is split, and under this much noise both halves land far from it "
                  "(the validation loss jumps, then recovers over rounds). This is why the app's "
                  "defaults keep the papers' mean and `gpfl launch` asks for the robust clusters "
                  "only from 10 SuperNodes (`deploy/quickstart.py`), where every device answers "
                  "every round and rogue-devices measured them."]
    return lines


EXPERIMENT = Experiment(NAME, COLUMNS, grid, measure, shown=("accuracy", "final_accuracy"),
                        report=section, paper="001 Table 2 with gpfl's server update",
                        checks=(*within(("accuracy", "final_accuracy", "mean_accuracy"), 0, 1),
                                at_most("best_round", "rounds"),
                                at_most("median_spend", "max_spend")))
