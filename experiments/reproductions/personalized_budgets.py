"""Personalized budgets and budget-aware aggregation (002, section 5, Figures 2-7 analogue).

002 compares three server aggregations when clients choose different privacy budgets:
A = arithmetic mean, B = weighted mean with α_i ∝ 1/σ_i, C = probability-based selection
(client i kept when P_i = ρ_i/Σρ > ω, ω ~ U[0, 1)); IID data with the Gaussian mechanism, and a
Dirichlet non-IID split with the stochastic-sign mechanism (k = 1). Budgets as in 002 for its
MNIST experiments (which use scikit-learn's 8×8 digits and a logistic regression):

* IID, Gaussian: δ = 1/500, R = 10 rounds; uniform ε ∈ {1, 5, 10}; personalized ε = (1, 1, 10),
  (1, 5, 10), (1, 10, 10);
* non-IID, sign: δ = 10⁻⁵, R = 10, sensitivity Δ₂ = 2c; uniform ε ∈ {5, 10, 15}; personalized
  ε = (5×5, 15×5) and (5, 5, 5, 10, 10, 10, 10, 15, 15, 15).

At those budgets the arithmetic mean stays near chance on our 30 users, so the quick profile runs
them in 002's reading only (with A, B and C on both panels, and the uniform budgets), and adds
"readable" budgets (``readable`` in each panel's budgets): 002's patterns ×10 (Gaussian)
and ×4 (sign) per release, and in the composed reading round totals at or below what those
per-release budgets compose to over R = 10 releases (equal for the low budgets, lower for the
high ones: there the composed rows carry more noise); the full profile runs both.

Two accountings of the same budgets, side by side (``accounting`` column):

* ``composed`` (gpfl's semantics): ε_i is the client's total over the R releases; dp-accounting's
  RDP accountant calibrates each release so that R of them compose to (ε_i, δ_i)
  (``planned-releases`` = R), i.e. ~√R times the noise of a one-release budget.
* ``per-round`` (002's reading: it states no composition): each release is calibrated to
  (ε_i, δ_i) alone (``planned-releases`` = 1, the cap lifted with ``cap-epsilon``); the
  ledgers then report what the R releases really cost in total (``max_epsilon``: the largest
  composed ε of the run, at δ_i).

Panels:

* ``digits-iid-gaussian``: scikit-learn's 8×8 digits (what 002 calls MNIST), equal slices, the
  650-parameter logistic regression 002 trains, Gaussian mechanism (L2 clipping, Δ = 2C).
* ``digits-dirichlet-sign``: the same with 002's label-skewed Dirichlet split (α = 0.5; 002 does
  not give its α) and the stochastic-sign mechanism (majority vote, server step 0.05).
* Full profile only: ``digits-cnn-iid-gaussian`` (Table 3's CNN, 83,562 parameters: the noise of
  any ε here drowns it) and ``logistic-*`` (the fairness task's 3-parameter logistic regression,
  IID and 20 % opposite-rule minority: the small-model regime).

Each of 002's N clients stands for 10 of ours (its budget pattern is cycled over 30 users, all
taking part every round), which keeps the seed-to-seed spread small enough to compare A, B and C.
Local training (5 epochs of SGD, learning rate 0.5, batch 50) replaces sklearn's "optimal"
schedule.

Accuracy is that of the final model (held-out users), as 002 reports it after its R rounds.
With uniform budgets the three aggregations coincide (equal σ give equal weights), so uniform
settings run once.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

from experiments.core.common import Context, FederationSpec
from experiments.core.figures import pyplot, save
from experiments.core.runner import Cell, Experiment, Run
from experiments.core.sanity import at_most, within
from experiments.core.tables import (
    best_entry,
    last_entry,
    spends_of,
)
from experiments.reproductions.personalized_budgets_report import (
    AGGREGATIONS,
    PAPER_BUDGETS,
    _name,
    aggregate,
    report_section,
)

NAME = "personalized-budgets"
COLUMNS = ("panel", "accounting", "setting", "budgets", "aggregation", "method", "seed",
           "accuracy", "val_loss", "best_round", "rounds", "failures", "max_epsilon",
           "min_epsilon", "max_sigma", "min_sigma")
ACCOUNTINGS = ("composed", "per-round")
#: ``cap-epsilon`` of the per-round accounting: a cap no run of these panels reaches (the
#: composed totals are reported, not enforced).
_PER_ROUND_CAP = 1e4

IID_BUDGETS: dict[str, Any] = {
    "personalized": list(PAPER_BUDGETS["gaussian"]), "uniform": ["1", "5", "10"],
    # 002's pattern ×10 (per release), and in the composed reading round totals. Over R = 10
    # releases at δ = 1/500, ε = 10 per release composes to 52.6 (50 used: ~3 % more noise)
    # but ε = 100 composes to 749.5 (500 used: ~25 % more noise), so the readings differ in
    # noise as well as in what ε means; the report compares the clients' σ of both.
    # 002's own budgets leave every aggregation at chance on 30 users (the arithmetic mean
    # reached 0.16-0.24); these are the smallest of the tried scales (×2, ×5, ×10) at which
    # A learns (~0.75 in a simulation of the panel) and B and C still have room above it.
    "readable": {"per-round": "10,10,100", "composed": "50,50,500"},
}
NONIID_BUDGETS: dict[str, Any] = {
    "personalized": list(PAPER_BUDGETS["sign"]),
    "uniform": ["5", "10", "15"],
    # 002's pattern ×4 per release, and round totals in the composed reading: over 10
    # releases at δ = 10⁻⁵, ε = 20 composes to 102 (100 used: ~1 % more noise) but ε = 60 to
    # 374.2 (300 used: ~14 % more noise). At ×1 the arithmetic mean reached 0.08-0.27.
    "readable": {"per-round": "20,20,20,20,20,60,60,60,60,60",
                 "composed": "100,100,100,100,100,300,300,300,300,300"},
}
# What the panels share: the mechanisms at 002's δ, and the two data sets' settings.
_GAUSSIAN = {"mechanism": "gaussian", "delta": 0.002}
_SIGN = {"mechanism": "sign", "delta": 1e-5}
_LOGISTIC = {"task": "fairness", "validation-users": 200, "samples-per-user": 10, "clip": 1.0,
             "local-epochs": 5, "learning-rate": 0.5, "batch-size": 10}
_DIGITS = {"task": "digits", "rotate-probability": 0.0, "validation-users": 20, "num-rounds": 10,
           "batch-size": 50, "server-device": "cpu"}
_DIGITS_LOGISTIC = {**_DIGITS, "model": "logistic", "clip": 1.0, "local-epochs": 5,
                    "learning-rate": 0.5}


def _panel(title: str, budgets: dict[str, Any], **config: Any) -> dict[str, Any]:
    """One panel: 30 users (002's N clients cycled, each standing for 10).

    ``aggregations`` (popped from ``config``): those the quick profile compares (002 compares
    B with A on its Gaussian panels only); the full profile runs all three everywhere.
    """
    aggregations = config.pop("aggregations", None) or list(AGGREGATIONS)
    return {"title": title, "users": 30, "budgets": budgets, "config": config,
            "aggregations": aggregations}


PANELS: dict[str, dict[str, Any]] = {
    "logistic-iid-gaussian": _panel(
        "logistic regression (3 parameters), IID, Gaussian", IID_BUDGETS,
        **_LOGISTIC, **_GAUSSIAN, **{"minority-fraction": 0.0, "num-rounds": 10}),
    "logistic-noniid-sign": _panel(
        "logistic regression (3 parameters), non-IID (20 % opposite rule), sign", NONIID_BUDGETS,
        **_LOGISTIC, **_SIGN,
        **{"minority-fraction": 0.2, "server-learning-rate": 0.1, "num-rounds": 20}),
    "digits-iid-gaussian": _panel(
        "digits, logistic regression (650 parameters), IID, Gaussian", IID_BUDGETS,
        **_DIGITS_LOGISTIC, **_GAUSSIAN, partition="contiguous"),
    "digits-dirichlet-sign": _panel(
        "digits, logistic regression, non-IID (Dirichlet α = 0.5), sign", NONIID_BUDGETS,
        **_DIGITS_LOGISTIC, **_SIGN,
        **{"partition": "dirichlet", "dirichlet-alpha": 0.5, "server-learning-rate": 0.05},
        aggregations=["mean", "probability"]),
    "digits-cnn-iid-gaussian": _panel(
        "digits, Table 3 CNN (83,562 parameters), IID, Gaussian", IID_BUDGETS,
        **_DIGITS, **_GAUSSIAN,
        **{"model": "cnn", "clip": 0.1, "local-epochs": 1, "learning-rate": 0.1}),
}
PROFILES: dict[str, dict[str, Any]] = {
    "full": {"panels": list(PANELS), "uniform": True, "personalized": None,
             "accountings": list(ACCOUNTINGS), "seeds": [0, 1, 2, 3, 4]},
    # 002's two digits panels at budgets where the arithmetic mean learns ("readable"), both
    # readings; and in 002's own reading ("own": per-round) 002's own personalized budgets
    # with A, B and C on both panels and its uniform budgets. Five seeds: 165 federations.
    "quick": {"panels": ["digits-iid-gaussian", "digits-dirichlet-sign"], "uniform": False,
              "personalized": "readable", "accountings": list(ACCOUNTINGS), "no_noise": True,
              "own": ["per-round"], "seeds": [0, 1, 2, 3, 4]},
    # The tests: the IID panel under 002's accounting, where B and C gain the most.
    "smoke": {"panels": ["digits-iid-gaussian"], "uniform": False, "personalized": 1,
              "accountings": ["per-round"], "seeds": [0]},
}


def specs(profile: str, seeds: list[int]
          ) -> list[tuple[str, str, str, str, str, int, FederationSpec]]:
    """(panel, accounting, setting, budgets, aggregation, seed, federation) of the profile."""
    p = PROFILES[profile]
    out = []
    for seed, panel, accounting in itertools.product(seeds, p["panels"], p["accountings"]):
        spec = PANELS[panel]
        settings: list[tuple[str, str, list[str]]] = []
        personalized = list(spec["budgets"]["personalized"])
        readable = spec["budgets"].get("readable", {}).get(accounting)
        aggregations = list(AGGREGATIONS)
        if p["personalized"] == "readable":
            personalized = [readable] if readable else personalized[:1]
            aggregations = list(spec["aggregations"])
        elif isinstance(p["personalized"], int):
            personalized = personalized[: p["personalized"]]
        elif readable:
            personalized.append(readable)
        settings += [("personalized", b, aggregations) for b in personalized]
        own = accounting in p.get("own", ())  # 002's own budgets, besides the readable ones
        if own:
            settings += [("personalized", b, list(AGGREGATIONS))
                         for b in spec["budgets"]["personalized"]]
        if p["uniform"] or own:
            settings += [("uniform", b, ["mean"]) for b in spec["budgets"]["uniform"]]
        if p["uniform"] or p.get("no_noise"):
            settings.append(("no noise", "", ["mean"]))
        for setting, budgets, aggs in settings:
            for agg in aggs:
                config: dict[str, Any] = {
                    **spec["config"], "num-hypotheses": 1,
                    "clients-per-round": spec["users"], "aggregation": agg,
                    "patience": 0, "eval-every": 1, "seed": seed, "data-seed": seed,
                }
                if setting == "no noise":
                    if accounting != p["accountings"][0]:
                        continue  # no budget, nothing to account: run once
                    config["mechanism"] = "none"
                    for key in ("delta", "clip", "server-learning-rate"):
                        config.pop(key, None)
                else:
                    config["client-epsilons"] = budgets
                    if accounting == "per-round":
                        config["planned-releases"] = 1
                        config["cap-epsilon"] = _PER_ROUND_CAP
                label = (f"{panel} {accounting} {setting} eps=({budgets}) "
                         f"{AGGREGATIONS[agg]} seed={seed}"
                         if budgets else f"{panel} no-noise seed={seed}")
                out.append((panel, accounting if budgets else "-", setting, budgets, agg,
                            seed, FederationSpec(label, config, spec["users"])))
    return out


def grid(ctx: Context) -> list[Cell]:
    """List the panels, accountings and budgets of the context's profile and seeds."""
    seeds = ctx.pick_seeds(PROFILES[ctx.profile]["seeds"])
    return [Cell.of(spec, panel=panel, accounting=accounting, setting=setting, budgets=budgets,
                    aggregation=agg, seed=seed)
            for panel, accounting, setting, budgets, agg, seed, spec in specs(ctx.profile, seeds)]


def measure(cell: Cell, summary: dict[str, Any]) -> dict[str, Any]:
    """Measure the final model's accuracy (as 002 reports it), the spends and the noise.

    ``min_epsilon``/``max_epsilon``: the smallest and largest composed spend of a client;
    ``max_sigma``/``min_sigma``: the noise σ of the most and of the least protected client's
    releases, as the devices reported it (what the two readings of ε_i are compared by).
    """
    setting = cell.keys["setting"]
    noisy = setting != "no noise"
    best = best_entry(summary)
    # 002 reports the model after its R rounds; with R = 10 and no early stop the accuracy
    # is still rising then, and the best-loss round can be round 0 under heavy noise.
    last = last_entry(summary)
    spends = spends_of(summary) if noisy else []
    per_client = summary.get("privacy", {}).get("per_client", {}).values()
    sigmas = [float(c["sigma"]) for c in per_client if noisy and c.get("sigma")]
    return {
        **cell.keys,
        "method": AGGREGATIONS[cell.keys["aggregation"]] if setting == "personalized" else "-",
        "accuracy": last["val_metrics"].get("accuracy"),
        "val_loss": last["val_loss"], "best_round": best["round"],
        "rounds": summary["rounds_completed"],
        "failures": sum(int(e.get("failures", 0)) for e in summary["history"]),
        "max_epsilon": max(spends) if spends else None,
        "min_epsilon": min(spends) if spends else None,
        "max_sigma": max(sigmas) if sigmas else None,
        "min_sigma": min(sigmas) if sigmas else None,
    }


def figures(ctx: Context, rows: list[dict[str, str]], runs: list[Run]) -> None:
    """One bar chart per panel."""
    for panel in dict.fromkeys(r["panel"] for r in rows):
        plot(rows, panel, ctx.figures / f"{panel}.png")


def plot(rows: list[dict[str, str]], panel: str, path: Path) -> Path:
    """Bars like 002's figures: uniform budgets (a) and A/B/C per personalized setting (b, c)."""
    agg = aggregate(rows, panel)
    fig, ax = pyplot().subplots(figsize=(9, 4))
    labels, means, stds, colors = [], [], [], []
    palette = {"A": "tab:blue", "B": "tab:orange", "C": "tab:green", "-": "tab:grey"}
    for (accounting, setting, budgets, aggregation), (m, s, _, _) in agg.items():
        method = AGGREGATIONS[aggregation] if setting == "personalized" else "-"
        name = _name(accounting, setting, f"ε=({budgets})")
        labels.append(f"{name}\n{method}" if method != "-" else name)
        means.append(m)
        stds.append(0.0 if math.isnan(s) else s)  # the 95 % interval (none for one seed)
        colors.append(palette[method])
    ax.bar(range(len(means)), means, yerr=stds, color=colors, capsize=3)
    ax.set_xticks(range(len(labels)), labels, fontsize=7, rotation=30, ha="right")
    ax.set_ylabel("validation accuracy")
    ax.set_ylim(0, 1)
    ax.set_title(f"{PANELS[panel]['title']}\nA = mean, B = weighted (1/σ), C = probability; "
                 "bars: 95 % interval over seeds")
    return save(fig, path)


EXPERIMENT = Experiment(NAME, COLUMNS, grid, measure, figures, shown=("accuracy",),
                        report=report_section, paper="002 §5, Fig. 2-7",
                        checks=(*within("accuracy", 0, 1), at_most("best_round", "rounds"),
                                at_most("min_epsilon", "max_epsilon"),
                                at_most("min_sigma", "max_sigma")))
