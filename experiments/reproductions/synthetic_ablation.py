"""Synthetic ablation: FedAvg, IFCA without noise and ours (001 §4.1, Figures 1 and 2).

The paper's setting: 100 users with 10 samples each from y = xᵀθ*_g + u, θ*_1 = (5, 6),
θ*_2 = (4, −4.5); U = 7 users per round, E = 1, s = 0.1, B = 10; hypotheses drawn from N(0, I).

* ``fedavg``: one hypothesis, no noise (Figure 1 a-c);
* ``ifca``: two hypotheses, no noise (Figure 1 d-f);
* ``ours``: two hypotheses, Euclidean Laplace with ν = 5 (Figure 1 g-i, Figure 2).

Rounds: the paper stops after 6 rounds without a better validation loss. Under ν = 5 noise with
7 users per round (≈ 3.5 per cluster) the validation loss is noisy and that rule stops long
before the hypotheses reach the optima (the loss is still falling on average at round 100), so
here the patience is 40 validations in the full profile (300 rounds at most) and the quick
profile runs 300 rounds without early stop: with hypotheses drawn near each other the two
clusters separate slowly: in seeds 0-3 the best validation round was 216, 243, 244 and 283 (all
four then within 0.5 of both optima; at 150 rounds seed 0 was still 1.9 from θ*_1). The
delivered hypotheses are those of the best validation round (``summary.json``'s ``hypotheses``).

Figure 2 is "the max privacy leakage over clients of the same cluster" per round. The server does
not know which cluster a client is in (no cluster id is sent), so the clusters here are the
users' true groups (user u is in group u mod 2), which k-means recovers once it has converged;
each client's spend per round comes from its own privacy ledger (n/ν = 0.4 per release).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from experiments.core.claims import claim, flow
from experiments.core.common import Context, FederationSpec
from experiments.core.figures import decorate, pyplot, save
from experiments.core.runner import Cell, Experiment, Run
from experiments.core.sanity import at_most, equals_max, flag
from experiments.core.tables import CI_NAME, fmt, mean_pm_ci, paired_difference, spends_of
from server.results import optima_distances

NAME = "synthetic-ablation"
OPTIMA = np.array([[5.0, 6.0], [4.0, -4.5]])
METHODS: dict[str, dict[str, Any]] = {
    "fedavg": {"num-hypotheses": 1, "mechanism": "none"},
    "ifca": {"num-hypotheses": 2, "mechanism": "none"},
    "ours": {"num-hypotheses": 2, "mechanism": "laplace", "noise-multiplier": 5.0},
}
TITLES = {
    "fedavg": "FedAvg (k = 1, no noise)",
    "ifca": "IFCA (k = 2, no noise)",
    "ours": "ours (k = 2, Laplace ν = 5)",
}
COLUMNS = (
    "method", "k", "mechanism", "nu", "seed", "rounds", "stopped_early", "best_round",
    "best_val_loss", "dist_opt1", "dist_opt2", "max_dist", "last_max_dist", "median_spend",
    "max_spend",
)
PROFILES: dict[str, dict[str, Any]] = {
    "full": {"num-rounds": 300, "patience": 40, "seeds": [0, 1, 2, 3, 4]},
    "quick": {"num-rounds": 300, "patience": 0, "seeds": [0, 1, 2, 3, 4]},
    # The tests: FedAvg and ours only, in the denser setting of `gpfl launch`'s default (20
    # users, all of them every round, E = 5): 20 releases a round instead of 7 reach the optima
    # in ~30-45 rounds instead of ~250 (docs/USAGE.md, "What convergence takes").
    "smoke": {"num-rounds": 60, "patience": 0, "seeds": [0], "methods": ["fedavg", "ours"],
              "rounds": {"fedavg": 15}, "users": 20,
              "setting": {"clients-per-round": 20, "local-epochs": 5}},
}
USERS = 100


def specs(profile: str, seeds: list[int]) -> list[tuple[str, int, FederationSpec]]:
    """List (method, seed, federation) for every configuration of the profile."""
    p = PROFILES[profile]
    out = []
    for seed in seeds:
        for method in p.get("methods", list(METHODS)):
            overrides = METHODS[method]
            config = {
                "task": "synthetic",
                "optima": "5,6;4,-4.5",
                "samples-per-user": 10,
                "validation-users": 100,
                "clients-per-round": 7,
                "local-epochs": 1,
                "learning-rate": 0.1,
                "batch-size": 10,
                "num-rounds": p.get("rounds", {}).get(method, p["num-rounds"]),
                "patience": p["patience"],
                "eval-every": 1,
                "seed": seed,
                "data-seed": seed,
                **p.get("setting", {}),
                **overrides,
            }
            users = p.get("users", USERS)
            out.append((method, seed, FederationSpec(f"{method} seed={seed}", config, users)))
    return out


def grid(ctx: Context) -> list[Cell]:
    """List the three methods (the smoke profile: two) for every seed."""
    seeds = ctx.pick_seeds(PROFILES[ctx.profile]["seeds"])
    return [Cell.of(spec, method=method, seed=seed) for method, seed, spec in specs(ctx.profile,
                                                                                      seeds)]


def distances(hypotheses: list[list[float]]) -> list[float]:
    """For each optimum, the distance to the nearest hypothesis."""
    found = optima_distances(hypotheses, OPTIMA.tolist())
    assert found is not None, "hypotheses of the synthetic task are 2-dimensional"
    return found


def measure(cell: Cell, summary: dict[str, Any]) -> dict[str, Any]:
    """Measure the distances of the delivered and last hypotheses to the optima, the spend."""
    assert cell.spec is not None
    config = cell.spec.run_config
    best = distances(summary["hypotheses"])
    last = distances(summary["last_hypotheses"])
    spends = spends_of(summary)
    return {
        "method": cell.keys["method"],
        "k": config["num-hypotheses"],
        "mechanism": config["mechanism"],
        "nu": config.get("noise-multiplier", 0.0),
        "seed": cell.keys["seed"],
        "rounds": summary["rounds_completed"],
        "stopped_early": int(bool(summary["stopped_early"])),
        "best_round": summary["best_round"],
        "best_val_loss": summary["best_val_loss"],
        "dist_opt1": best[0],
        "dist_opt2": best[1],
        "max_dist": max(best),
        "last_max_dist": max(last),
        "median_spend": float(np.median(spends)) if spends else None,
        "max_spend": max(spends) if spends else None,
    }


def figures(ctx: Context, rows: list[dict[str, str]], runs: list[Run]) -> None:
    """Figures 1 and 2 of the first seed's runs, and the loss curves of every run."""
    summaries = {(cell.keys["method"], cell.keys["seed"]): summary for cell, summary in runs}
    first = runs[0][0].keys["seed"]
    plot_figure1({m: summaries[m, first] for m in METHODS if (m, first) in summaries},
                 ctx.figures / "figure1_ablation.png")
    plot_figure2(summaries["ours", first], ctx.figures / "figure2_max_leakage.png")
    plot_loss(summaries, first, ctx.figures / "validation_loss.png")


def plot_figure1(summaries: dict[str, dict[str, Any]], path: Path) -> Path:
    """Figure 1 of 001: released vectors and hypotheses (top), validation loss (bottom)."""
    fig, axes = pyplot().subplots(2, len(summaries), figsize=(5 * len(summaries), 8.5))
    for col, (method, summary) in enumerate(summaries.items()):
        ax = axes[0, col]
        released = [(vec, e["round"])
                    for e in summary["history"] for vec in e.get("released") or []]
        if released:
            pts = np.asarray([vec for vec, _ in released])
            sc = ax.scatter(pts[:, 0], pts[:, 1], c=[t for _, t in released], cmap="viridis", s=6,
                            alpha=0.5)
            fig.colorbar(sc, ax=ax, label="round")
        hyp = np.asarray(summary["hypotheses"])
        ax.scatter(hyp[:, 0], hyp[:, 1], marker="X", s=140, c="red", label="final hypotheses")
        ax.scatter(OPTIMA[:, 0], OPTIMA[:, 1], marker="*", s=260, facecolors="none",
                   edgecolors="black", linewidths=1.5, label="θ* (true optima)")
        decorate(ax, xlabel="θ[0]", ylabel="θ[1]", title=TITLES[method],
                 legend={"loc": "lower left", "fontsize": 8})
        lim = 12 if method == "ours" else 9
        ax.set_xlim(-lim, lim)
        ax.set_ylim(-lim, lim)
        ax2 = axes[1, col]
        ax2.plot(*_loss_curve(summary), lw=1)
        ax2.axhline(math.sqrt(1 / 3), color="grey", ls=":", label="RMSE at θ* (noise floor)")
        decorate(ax2, xlabel="round", ylabel="validation RMSE (Eq. 15)", yscale="log",
                 legend={"fontsize": 8})
    return save(fig, path, suptitle="Synthetic data (001 Figure 1): released parameter vectors "
                                    "and validation loss")


def _loss_curve(summary: dict[str, Any]) -> tuple[list[int], list[float]]:
    """Return the validated rounds and their validation loss."""
    history = [e for e in summary["history"] if e.get("val_loss") is not None]
    return [e["round"] for e in history], [e["val_loss"] for e in history]


def leakage_per_round(summary: dict[str, Any], groups: int = 2) -> tuple[list[int], np.ndarray]:
    """Max cumulative spend per true group after each round, from the clients' ledgers.

    Returns the rounds and an array of shape (groups, rounds).
    """
    from mechanisms import PrivacyLedger

    ledger_dir = Path(summary["_run_dir"]) / "ledgers"
    rounds = [e["round"] for e in summary["history"] if e["round"] > 0]
    last = max(rounds) if rounds else 0
    per_group = np.zeros((groups, last + 1))
    for path in sorted(ledger_dir.glob("client-*.json")):
        user = int(path.stem.split("-")[1])
        ledger = PrivacyLedger(path, delta=float(summary["config"].get("delta", 1e-5)))
        spent = np.zeros(last + 1)
        for entry in ledger.entries():
            cost = getattr(entry.event, "cost", 0.0)
            if entry.round is not None and 0 < entry.round <= last:
                spent[entry.round] += float(cost)
        cumulative = np.cumsum(spent)
        g = user % groups
        per_group[g] = np.maximum(per_group[g], cumulative)
    return list(range(1, last + 1)), per_group[:, 1:]


def plot_figure2(summary: dict[str, Any], path: Path) -> Path:
    """Figure 2 of 001: max privacy leakage among the clients of each cluster, per round."""
    rounds, per_group = leakage_per_round(summary)
    fig, ax = pyplot().subplots(figsize=(6.5, 4))
    for g in range(per_group.shape[0]):
        ax.step(rounds, per_group[g], where="post", label=f"cluster {g + 1} (θ*_{g + 1})")
    decorate(ax, xlabel="round", ylabel="max Σ ε·r over the cluster's clients",
             title="Synthetic data (001 Figure 2): max privacy leakage per cluster, ν = 5",
             legend={})
    return save(fig, path)


def plot_loss(summaries: dict[tuple[str, int], dict[str, Any]], first_seed: int,
              path: Path) -> Path:
    """Plot the validation loss per round of every method and seed."""
    fig, ax = pyplot().subplots(figsize=(7, 4))
    colors = {"fedavg": "tab:blue", "ifca": "tab:orange", "ours": "tab:green"}
    for (method, seed), summary in summaries.items():
        ax.plot(*_loss_curve(summary), color=colors[method], lw=1, alpha=0.8,
                label=TITLES[method] if seed == first_seed else None)
    decorate(ax, xlabel="round", ylabel="validation RMSE", yscale="log", legend={})
    return save(fig, path)


def table(rows: list[dict[str, str]]) -> list[str]:
    """Markdown lines: per method, distances and losses over seeds (mean ± 95 % t half-width)."""
    lines = [
        "| method | seeds | distance to θ*₁ | distance to θ*₂ | max distance (best round) | "
        "max distance (last round) | best val RMSE | best round | rounds | max spend Σε·r |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for method in METHODS:
        sel = [r for r in rows if r["method"] == method]
        if not sel:
            continue

        def ms(key: str, sel: list[dict[str, str]] = sel) -> str:
            return mean_pm_ci(float(r[key]) for r in sel if r[key] not in ("", "nan"))

        lines.append(
            f"| {TITLES[method]} | {len(sel)} | {ms('dist_opt1')} | {ms('dist_opt2')} | "
            f"{ms('max_dist')} | {ms('last_max_dist')} | {ms('best_val_loss')} | "
            f"{_span(sel, 'best_round')} | {_span(sel, 'rounds')} | {ms('max_spend')} |"
        )
    return lines


def _span(rows: list[dict[str, str]], key: str) -> str:
    """Format an integer column over seeds: the value, or "min-max" when the seeds differ."""
    values = sorted({int(float(r[key])) for r in rows if r[key] not in ("", "nan")})
    if not values:
        return "-"
    return str(values[0]) if len(values) == 1 else f"{values[0]}-{values[-1]}"


# --------------------------------------------------------------------------- report

_TEXT_1 = flow("""
**Paper (001 §4.1, appendix; 000 §5.1).** 100 users × 10 samples, U = 7 per round, E = 1, s =
0.1, B = 10, ν = 5, patience 6. FedAvg "settles somewhere in between the optimal parameters"
(Fig. 1b); with IFCA "the optimized clients parameters almost overlap the optimal parameters"
(Fig. 1e); with ours "in just a few rounds of training the process converges to values very
close to the two optimal parameters" (Fig. 1h). Each release costs n/ν = 2/5 = 0.4; "the
maximum composed value of the privacy leakage was 2.4" (000).
""")
_TEXT_2 = flow("""
**Differences.** (1) Rounds: the paper's patience of 6 rounds stops our ν = 5 runs long before
the optima (the validation loss under noise is not monotone), so we run 300 rounds (quick) or
up to 300 with a patience of 40 (full), and deliver the best validation round; the paper's 2.4
is the spend of a run that patience stopped early (at 0.4 a release, 6 releases), not of a
converged one. (2) Leakage:
the maximum composed spend here is {spend} (Σ ε·r = 0.4 × releases) against the paper's 2.4,
because our runs are longer: 7 of 100 users per round over up to 300 rounds gives ~20 releases
per user on average, the paper's short run ~6 at most. The per-release cost, 0.4, is the
paper's. (3) Figure 2's clusters are the users' true groups (the server never learns a
client's cluster).
""")


def report_section(rows: list[dict[str, str]]) -> list[str]:
    """Write this experiment's section of docs/RESULTS.md from its rows."""
    ours = [r for r in rows if r["method"] == "ours"]
    fedavg = [r for r in rows if r["method"] == "fedavg"]
    ok = sum(float(r["max_dist"]) <= 0.5 for r in ours)
    ok_last = sum(float(r["last_max_dist"]) <= 0.5 for r in ours)
    fed_ok = sum(float(r["max_dist"]) <= 0.5 for r in fedavg)
    apart = float(np.linalg.norm(OPTIMA[0] - OPTIMA[1]))
    spend = [float(r["max_spend"]) for r in ours if r["max_spend"]]
    rounds = sorted({r["rounds"] for r in rows})

    def by(method: str) -> dict[int, float]:
        return {int(r["seed"]): float(r["max_dist"]) for r in rows
                if r["method"] == method and r["max_dist"] not in ("", "nan")}

    return [
        _TEXT_1,
        "",
        "**Ours.** Distances are from each optimum θ* to the nearest delivered hypothesis (those "
        f"of the best validation round), {CI_NAME}:",
        "",
        *table(rows),
        "",
        f"Ours delivers hypotheses (best validation round) within 0.5 of both optima in {ok} "
        f"of {len(ours)} seeds, and its last round's are within 0.5 in {ok_last} of "
        f"{len(ours)} (`max_dist`, `last_max_dist`); FedAvg delivers within 0.5 in {fed_ok} of "
        f"{len(fedavg)} (one hypothesis cannot be near two optima {apart:.3f} apart: it stays "
        f"between them, as in Fig. 1b). Rounds run: {', '.join(rounds)}.",
        "",
        "Claims, as differences paired by seed, mean [95 % Student-t interval]:",
        "",
        "- " + claim("ours delivers hypotheses nearer both optima than FedAvg (max distance, "
                     "ours − FedAvg)", *paired_difference(by("ours"), by("fedavg")), expect=-1),
        "- " + claim("the noise costs ours distance against IFCA without noise (max distance, "
                      "ours − IFCA)", *paired_difference(by("ours"), by("ifca")), expect=1),
        "",
        _TEXT_2.format(
            spend=fmt(max(spend) if spend else math.nan)),
    ]


EXPERIMENT = Experiment(NAME, COLUMNS, grid, measure, figures,
                        shown=("dist_opt1", "dist_opt2", "best_val_loss", "best_round"),
    report=report_section, paper="001 §4.1, Fig. 1-2",
    checks=(equals_max("max_dist", ("dist_opt1", "dist_opt2")), at_most("best_round", "rounds"),
            at_most("median_spend", "max_spend"), flag("stopped_early")))
