"""Leakage statistics: median and maximum per-client spend for ν × k (001 Table 1 analogue).

001's Table 1 gives, for the hospital-charges task, the median and maximum local privacy budget
Σ ε·r over the whole set of clients (averaged over 10 seeds) for ν ∈ {0, 0.1, 1, 2, 3, 5} and
k ∈ {7, 5, 3, 1}. Each release costs n/ν under the neighbourhood calibration, so a client's
spend is (its releases) × n/ν and the table mostly reflects how often clients are sampled.

* ``digits``: the federations of ``accuracy-vs-nu`` (same settings, so the cache is shared and
  nothing runs twice); n = 83,562, so one release costs 83,562/ν.
* ``hospital`` (only with ``--data-path`` = the CMS inpatient charges CSV): the paper's protocol,
  100 training clients per round, validation on 200 held-out providers, stop after 30
  validations without improvement; n = 11. E, s and B are not given in 001; E = 1, s = 0.05,
  B = 10 are used.

Clients never sampled count with a spend of 0 ("over the whole set of clients").
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from experiments.core.claims import flow
from experiments.core.common import Context, FederationSpec, laplace_or_none
from experiments.core.figures import decorate, pyplot, save
from experiments.core.runner import Cell, Experiment, Run
from experiments.core.sanity import at_most
from experiments.core.tables import fmt, mean_ci, spends_of
from experiments.reproductions import accuracy_vs_nu

NAME = "leakage"
COLUMNS = ("dataset", "nu", "k", "seed", "clients", "participating", "median_spend", "max_spend",
           "mean_releases", "rounds", "num_parameters")
HOSPITAL: dict[str, dict[str, Any]] = {
    "full": {"nus": [0.0, 0.1, 1.0, 2.0, 3.0, 5.0], "ks": [1, 3, 5, 7],
             "seeds": list(range(10)), "num-rounds": 500, "patience": 30},
    "quick": {"nus": [1.0, 5.0], "ks": [1, 3], "seeds": [0, 1, 2, 3, 4], "num-rounds": 20,
              "patience": 0},
    "smoke": {"nus": [1.0], "ks": [1], "seeds": [0], "num-rounds": 3, "patience": 0},
}
#: 001 Table 1 (hospital charges): ν -> {k: (median, max)} of Σ ε·r, averaged over 10 seeds.
PAPER_TABLE1 = {
    0.1: {7: (517.0, 1551.0), 5: (418.0, 1342.0), 3: (473.0, 1386.0), 1: (528.0, 1540.0)},
    1.0: {7: (36.3, 126.5), 5: (40.7, 127.6), 3: (44.0, 138.6), 1: (49.5, 147.4)},
    2.0: {7: (15.4, 57.8), 5: (14.3, 54.5), 3: (22.0, 69.3), 1: (21.5, 66.6)},
    3.0: {7: (7.7, 32.3), 5: (8.4, 36.7), 3: (12.5, 40.0), 1: (12.1, 40.0)},
    5.0: {7: (5.7, 21.3), 5: (5.9, 22.0), 3: (5.5, 21.6), 1: (5.3, 20.9)},
}


def hospital_specs(ctx: Context) -> list[tuple[float, int, int, FederationSpec]]:
    """Return the hospital grid (needs ``ctx.data_path``)."""
    from tasks.hospital import HospitalTask

    p = HOSPITAL[ctx.profile]
    task = HospitalTask(ctx.data_path, validation_users=200)
    users = len(task.training_providers)
    out = []
    for seed in ctx.pick_seeds(p["seeds"]):
        for k in p["ks"]:
            for nu in p["nus"]:
                config: dict[str, Any] = {
                    "task": "hospital", "server-data-path": str(Path(ctx.data_path).resolve()),
                    "validation-users": 200, "num-hypotheses": k,
                    "clients-per-round": min(100, users), "local-epochs": 1,
                    "learning-rate": 0.05, "batch-size": 10, "num-rounds": p["num-rounds"],
                    "patience": p["patience"], "eval-every": 1, "seed": seed, "data-seed": seed,
                    "server-device": "cpu", **laplace_or_none(nu),
                }
                out.append((nu, k, seed, FederationSpec(f"hospital nu={nu:g} k={k} seed={seed}",
                                                        config, users)))
    return out


def grid(ctx: Context) -> list[Cell]:
    """Digits (accuracy-vs-nu's federations) and, with a data path, hospital."""
    # The cross-entropy runs: a run's spend does not depend on its loss.
    digits = [(nu, k, seed, spec) for nu, k, loss, seed, spec in accuracy_vs_nu.specs(
        ctx.profile, ctx.pick_seeds(accuracy_vs_nu.PROFILES[ctx.profile]["seeds"]))
        if loss == accuracy_vs_nu.CROSS_ENTROPY]
    hospital = hospital_specs(ctx) if ctx.data_path else []
    return [Cell.of(spec, dataset=dataset, nu=nu, k=k, seed=seed)
            for dataset, specs in (("digits", digits), ("hospital", hospital))
            for nu, k, seed, spec in specs]


def measure(cell: Cell, summary: dict[str, Any]) -> dict[str, Any]:
    """One results.csv row: spend statistics over all clients (0 for never sampled)."""
    assert cell.spec is not None
    clients = cell.spec.supernodes
    spends = spends_of(summary, clients)
    releases = [c.get("releases", 0) for c in summary["privacy"]["per_client"].values()]
    private = cell.keys["nu"] > 0
    return {
        **cell.keys,
        "clients": clients,
        "participating": len(spends_of(summary)),
        "median_spend": statistics.median(spends) if private and spends else None,
        "max_spend": max(spends) if private and spends else None,
        "mean_releases": sum(releases) / clients if clients else None,
        "rounds": summary["rounds_completed"],
        "num_parameters": summary.get("task_info", {}).get("num_parameters"),
    }


def figures(ctx: Context, rows: list[dict[str, str]], runs: list[Run]) -> None:
    """Spend versus ν."""
    plot(rows, ctx.figures / "leakage.png")


def aggregate(rows: list[dict[str, str]], dataset: str
              ) -> dict[tuple[float, int], tuple[float, float, int]]:
    """(ν, k) -> (median spend, max spend, seeds), both averaged over seeds (as in 001)."""
    cells: dict[tuple[float, int], list[tuple[float, float]]] = {}
    for r in rows:
        if r["dataset"] != dataset:
            continue
        med = float(r["median_spend"]) if r["median_spend"] else math.nan
        mx = float(r["max_spend"]) if r["max_spend"] else math.nan
        cells.setdefault((float(r["nu"]), int(r["k"])), []).append((med, mx))
    return {
        key: (statistics.fmean(v[0] for v in vals), statistics.fmean(v[1] for v in vals),
              len(vals))
        for key, vals in sorted(cells.items())
    }


def table(rows: list[dict[str, str]], dataset: str) -> list[str]:
    """Markdown lines in 001 Table 1's layout: one row per ν, 'median, max' per k."""
    agg = aggregate(rows, dataset)
    if not agg:
        return []
    ks = sorted({k for _, k in agg}, reverse=True)
    nus = sorted({nu for nu, _ in agg})
    lines = ["| ν | " + " | ".join(f"k = {k}" for k in ks) + " |", "|" + " --- |" * (len(ks) + 1)]
    for nu in nus:
        cells = []
        for k in ks:
            if (nu, k) not in agg:
                cells.append("")
            elif nu == 0:
                cells.append("-, -")
            else:
                cells.append(", ".join(_pm(rows, dataset, nu, k, key)
                                       for key in ("median_spend", "max_spend")))
        lines.append(f"| {nu:g} | " + " | ".join(cells) + " |")
    return lines


def _pm(rows: list[dict[str, str]], dataset: str, nu: float, k: int, key: str) -> str:
    """``mean ± 95 % t half-width`` of one column over a cell's seeds, 4 significant digits."""
    mean, half, n = mean_ci(float(r[key]) for r in rows
                            if r["dataset"] == dataset and float(r["nu"]) == nu
                            and int(r["k"]) == k and r[key])
    return fmt(mean, 4) if n < 2 else f"{fmt(mean, 4)} ± {fmt(half, 2)}"


def paper_table() -> list[str]:
    """001 Table 1 as Markdown."""
    ks = [7, 5, 3, 1]
    lines = ["| ν | " + " | ".join(f"k = {k}" for k in ks) + " |", "|" + " --- |" * 5,
             "| 0 | " + " | ".join("-, -" for _ in ks) + " |"]
    for nu, cells in PAPER_TABLE1.items():
        lines.append(f"| {nu:g} | " + " | ".join(f"{cells[k][0]:g}, {cells[k][1]:g}" for k in ks)
                     + " |")
    return lines


def plot(rows: list[dict[str, str]], path: Path) -> Path:
    """Median and max spend versus ν (log-log), one line per dataset and k."""
    fig, ax = pyplot().subplots(figsize=(7, 4.2))
    for dataset in sorted({r["dataset"] for r in rows}):
        agg = aggregate(rows, dataset)
        for k in sorted({k for _, k in agg}):
            pts = sorted((nu, v) for (nu, kk), v in agg.items() if kk == k and nu > 0)
            if not pts:
                continue
            line = ax.plot([p[0] for p in pts], [p[1][1] for p in pts], marker="o",
                           label=f"{dataset} k = {k}: max")[0]
            ax.plot([p[0] for p in pts], [p[1][0] for p in pts], marker=".", ls="--",
                    color=line.get_color(), label=f"{dataset} k = {k}: median")
    paper = sorted(PAPER_TABLE1.items())
    ax.plot([nu for nu, _ in paper], [c[1][1] for _, c in paper], marker="s", color="grey",
            label="001 Table 1 hospital k = 1: max")
    decorate(ax, xlabel="noise multiplier ν", ylabel="per-client spend Σ ε·r",
             title="Leakage statistics (001 Table 1 analogue)", xscale="log", yscale="log",
             legend={"fontsize": 7})
    return save(fig, path)


# --------------------------------------------------------------------------- report

_TEXT_1 = flow("""
**Paper (001 Table 1).** Hospital charges (11-parameter network, 100 clients per round),
median and maximum of Σ ε·r over the whole set of clients, averaged over 10 seeds:
""")
_TEXT_2 = flow("""
**Differences.** Under the neighbourhood calibration every release costs exactly n/ν, so a
client's spend is (its releases) × n/ν: the table scales as 1/ν and with the number of
parameters, and k matters only through how many rounds a run lasts. On digits the numbers are
7,600× the hospital's for the same releases (83,562 vs 11 parameters): as 001 says for
FEMNIST, no meaningful formal guarantee remains for a CNN, which is what the DLG audit
examines empirically. Our digits users take part more often than the paper's hospitals (7 of
50 per round vs 100 of ~2,000).
""")


def report_section(rows: list[dict[str, str]]) -> list[str]:
    """Write this experiment's section of docs/RESULTS.md from its rows."""
    lines = [
        _TEXT_1,
        "",
        *paper_table(),
        "",
        "**Ours, digits** (the federations of accuracy-vs-nu; n = 83,562, so each release costs "
        "n/ν; median and max over all 50 users, each mean ± 95 % Student-t half-width over "
        "seeds):",
        "",
        *table(rows, "digits"),
        "",
    ]
    hospital = table(rows, "hospital")
    if hospital:
        lines += ["**Ours, hospital** (`--data-path`):", "", *hospital, ""]
    else:
        lines += ["The hospital table needs the CMS inpatient CSV, which is not bundled: "
                  "`python -m experiments leakage --data-path <Inpatient CSV>` adds it.", ""]
    lines += [
        _TEXT_2,
    ]
    return lines


EXPERIMENT = Experiment(NAME, COLUMNS, grid, measure, figures,
                        shown=("median_spend", "max_spend"),
    report=report_section, paper="001 Table 1",
    checks=(at_most("median_spend", "max_spend"), at_most("participating", "clients")))
