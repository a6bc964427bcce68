"""Membership inference against models gpfl trained (thesis 004 ch. 4): loss, shadow, noisy.

For each task (`experiments.audits.mia_models.TASKS`), noise setting and seed, one cell:

1. **Target.** A random half of the candidate records (`CANDIDATES`) are the members; gpfl's
   client (`experiments.audits.mia_models.release`) trains one device's model on them and releases
   it with the noise setting's mechanism. The other half are the non-members.
2. **Scores** of every candidate, each "higher is more likely a member":
   ``loss``: minus the target's cross-entropy on it (eq. 4.2);
   ``shadow``: the target's logit-scaled confidence φ = log(p/(1 − p)) of the true label
   (`experiments.audits.mia_models.logit_confidence`, a decreasing function of the loss) minus its
   mean over the *shadow* models that did not train on the record (each shadow is the same
   client on an independent random half of the candidates, so about half of them are out
   for any record: Carlini et al.'s offline calibration);
   ``noisy``: φ minus its mean over ``neighbours`` noisy neighbours (Gaussian noise at the
   output of the first layer, eq. 4.6), with σ picked by a golden-section search of the AUC
   on a *calibration* half of the candidates (the thesis's search, Fig. 4.2).
   Eq. 4.5 subtracts the calibration from the loss itself; φ does the same on the scale
   LiRA uses, where the near-zero losses of confident records are spread apart instead of
   all reading as 0, which is what a difference needs to compare records.
3. **Metrics** on the other half of the records (the same evaluation half for every attack,
   never used to tune): AUC, TPR at FPR 1 % and 0.1 % (the highest TPR of the ROC at or
   below that FPR; with ~450 non-members, 0.1 % can only be met at FPR 0), the thesis's
   empirical ε at FPR 1 % (ln(TPR/FPR), eq. 4.4, a point estimate), and a 95 % lower bound
   (`experiments.audits.privacy_audit.epsilon_lower_bound`, δ = 0). Each record is one trial of
   one trained model, not an independent run of the mechanism, so these are eq. 4.4's
   measurements of the released model; the mechanism audit is `empirical-privacy`.
4. **Cost** (seconds, on this run's machine): shadow = training the shadows and scoring;
   noisy = the σ search and scoring; loss = scoring.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
from sklearn.metrics import roc_auc_score, roc_curve

from experiments.audits import privacy_report
from experiments.audits.mia_models import (
    TASKS,
    TrainingPlan,
    first_layer_scale,
    logit_confidence,
    neighbour_confidence,
    per_record_loss,
    pool,
    release,
)
from experiments.audits.privacy_audit import epsilon_lower_bound
from experiments.core.common import Context
from experiments.core.figures import decorate, pyplot, save
from experiments.core.runner import Cell, Experiment, Run
from experiments.core.sanity import within
from experiments.core.tables import fmt, mean_ci

NAME = "mia"
ATTACKS = ("loss", "shadow", "noisy")
METRICS = ("auc", "tpr_1", "tpr_01", "eps_1", "eps_lb", "cost_s")
COLUMNS = ("task", "noise", "seed", "members", "shadows", "accuracy_in", "accuracy_out",
           "sigma", *(f"{m}_{a}" for a in ATTACKS for m in METRICS))
#: The columns a rerun cannot reproduce: each attack's seconds on this machine.
TIMINGS = {f"cost_s_{a}": "seconds of compute, which vary with the machine and its load"
           for a in ATTACKS}
#: The noise settings: gpfl's mechanism and its parameter (the run config's request).
NOISES: dict[str, dict[str, Any]] = {
    "none": {"mechanism": "none"},
    "laplace nu=1": {"mechanism": "laplace", "noise_multiplier": 1.0},
    "gaussian eps=8": {"mechanism": "gaussian", "epsilon": 8.0},
}
#: Local training per task: long enough to memorise (one device, one round, many epochs).
PLANS = {"digits": TrainingPlan(epochs=80, learning_rate=0.1, batch_size=16),
         "breast-cancer": TrainingPlan(epochs=200, learning_rate=0.1, batch_size=8)}
#: Candidate records per task (half of them members): a device's local data set is small, and
#: few records trained on for many epochs are what a model memorises.
CANDIDATES = {"digits": 400, "breast-cancer": 300}
PROFILES: dict[str, dict[str, Any]] = {
    "full": {"seeds": [0, 1, 2, 3, 4], "shadows": 16, "neighbours": 50, "epochs": 1.0},
    "quick": {"seeds": [0, 1, 2, 3, 4], "shadows": 8, "neighbours": 30, "epochs": 1.0},
    "smoke": {"seeds": [0], "shadows": 2, "neighbours": 2, "epochs": 0.1},
}


def grid(ctx: Context) -> list[Cell]:
    """One cell per (task, noise, seed)."""
    seeds = ctx.pick_seeds(PROFILES[ctx.profile]["seeds"])
    noises = list(NOISES) if ctx.profile != "smoke" else ["none"]
    return [Cell(f"{task} {noise} seed {seed}", {"task": task, "noise": noise, "seed": seed})
            for task in TASKS for noise in noises for seed in seeds]


def perform(ctx: Context, cell: Cell) -> dict[str, Any]:
    """Train the target and the shadows, score every record three ways, measure."""
    profile = PROFILES[ctx.profile]
    task, seed = str(cell.keys["task"]), int(cell.keys["seed"])
    p = pool(task)
    base = PLANS[task]
    plan = replace(base, epochs=max(1, round(base.epochs * profile["epochs"])),
                   **NOISES[str(cell.keys["noise"])])
    rng = np.random.default_rng(np.random.SeedSequence([seed, 25]))
    # The candidates: a random subset of the task's records (all of them for the table).
    everyone = np.sort(rng.permutation(len(p))[: CANDIDATES[task]])
    n = everyone.size
    member = np.zeros(n, dtype=bool)
    member[rng.permutation(n)[: n // 2]] = True
    target = release(p, everyone[member], plan, seed=seed)
    loss = per_record_loss(p, target, everyone)
    confidence = logit_confidence(loss)
    # One evaluation half for every attack; the noisy attack tunes σ on the other half.
    evaluation = np.zeros(n, dtype=bool)
    evaluation[rng.permutation(n)[: n // 2]] = True

    started = time.perf_counter()
    shadow_sum = np.zeros(n)
    shadow_count = np.zeros(n)
    for s in range(profile["shadows"]):
        inside = np.zeros(n, dtype=bool)
        inside[rng.permutation(n)[: n // 2]] = True
        model = release(p, everyone[inside], plan, seed=seed * 1000 + s + 1)
        out = ~inside
        shadow_sum[out] += logit_confidence(per_record_loss(p, model, everyone[out]))
        shadow_count[out] += 1
    # A record no shadow left out (probability 2^-shadows) is calibrated by nothing.
    shadow = confidence - np.where(shadow_count > 0,
                                   shadow_sum / np.maximum(shadow_count, 1), 0.0)
    cost_shadow = time.perf_counter() - started

    started = time.perf_counter()
    calibration = everyone[~evaluation]
    scale = first_layer_scale(p, target, calibration)

    def auc_at(log_sigma: float) -> float:
        # The same noise draws at every σ (common random numbers): the search then compares
        # σ, not the luck of each draw.
        draws = np.random.default_rng(np.random.SeedSequence([seed, 46]))
        nb = neighbour_confidence(p, target, calibration, [scale * math.exp(log_sigma)],
                                  neighbours=profile["neighbours"], rng=draws)[0]
        return _auc(member[~evaluation], confidence[~evaluation] - nb)

    log_sigma = _golden_max(auc_at, math.log(1e-3), math.log(10.0), steps=10)
    sigma = scale * math.exp(log_sigma)
    draws = np.random.default_rng(np.random.SeedSequence([seed, 47]))
    noisy = confidence - neighbour_confidence(p, target, everyone, [sigma],
                                              neighbours=profile["neighbours"], rng=draws)[0]
    cost_noisy = time.perf_counter() - started

    started = time.perf_counter()
    per_record_loss(p, target, everyone)
    cost_loss = time.perf_counter() - started
    correct = _correct(p, target, everyone)
    return {
        "members": int(member.sum()), "shadows": profile["shadows"], "sigma": sigma,
        "accuracy_in": float(correct[member].mean()),
        "accuracy_out": float(correct[~member].mean()),
        "member": member[evaluation],
        "scores": {"loss": -loss[evaluation], "shadow": shadow[evaluation],
                   "noisy": noisy[evaluation]},
        "cost": {"loss": cost_loss, "shadow": cost_shadow, "noisy": cost_noisy},
        "seed": seed,
    }


def measure(cell: Cell, result: dict[str, Any]) -> dict[str, Any]:
    """Return the row: the target's accuracy, then each attack's metrics on the evaluation half."""
    row: dict[str, Any] = {**cell.keys, **{k: result[k] for k in (
        "members", "shadows", "accuracy_in", "accuracy_out", "sigma")}}
    member = result["member"]
    for attack in ATTACKS:
        score = result["scores"][attack]
        m = attack_metrics(member, score, seed=int(result["seed"]))
        row.update({f"{k}_{attack}": v for k, v in m.items()})
        row[f"cost_s_{attack}"] = result["cost"][attack]
    return row


def attack_metrics(member: np.ndarray, score: np.ndarray, *, seed: int) -> dict[str, float]:
    """AUC, TPR at FPR 1 % and 0.1 %, ε at FPR 1 % (eq. 4.4) and its 95 % lower bound."""
    fpr, tpr, _ = roc_curve(member, score)
    tpr_1, tpr_01 = _tpr_at(fpr, tpr, 0.01), _tpr_at(fpr, tpr, 0.001)
    # eq. 4.4 at the ROC point with the largest FPR ≤ 1 %.
    at = np.flatnonzero(fpr <= 0.01)[-1]
    eps_1 = math.log(tpr[at] / fpr[at]) if fpr[at] > 0 and tpr[at] > 0 else math.nan
    inside, outside = score[member], score[~member]
    m = min(inside.size, outside.size)
    rng = np.random.default_rng(seed)
    bound = epsilon_lower_bound(rng.permutation(outside)[:m], rng.permutation(inside)[:m],
                                delta=0.0, rng=rng)
    return {"auc": _auc(member, score), "tpr_1": tpr_1, "tpr_01": tpr_01, "eps_1": eps_1,
            "eps_lb": bound.epsilon}


def _auc(member: np.ndarray, score: np.ndarray) -> float:
    return float(roc_auc_score(member, score))


def _tpr_at(fpr: np.ndarray, tpr: np.ndarray, level: float) -> float:
    return float(tpr[fpr <= level].max())


def _correct(p: Any, params: Any, index: np.ndarray) -> np.ndarray:
    import torch

    from experiments.audits.mia_models import _module

    with torch.no_grad():
        out = _module(p, params)(torch.as_tensor(p.x[index])).argmax(dim=1).numpy()
    return np.asarray(out == p.y[index])


def _golden_max(f: Callable[[float], float], lo: float, hi: float, *, steps: int) -> float:
    """Maximise a unimodal ``f`` on [lo, hi] by golden-section search (``steps`` shrinkings)."""
    ratio = (math.sqrt(5) - 1) / 2
    a, b = lo, hi
    c, d = b - ratio * (b - a), a + ratio * (b - a)
    fc, fd = f(c), f(d)
    for _ in range(steps):
        if fc >= fd:
            b, d, fd = d, c, fc
            c = b - ratio * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + ratio * (b - a)
            fd = f(d)
    return c if fc >= fd else d


def figures(ctx: Context, rows: list[dict[str, str]], runs: list[Run]) -> None:
    """ROC curves (log-log, as the thesis's Fig. 4.3b) of the first seed of each task and noise."""
    first: dict[tuple[str, str], dict[str, Any]] = {}
    for cell, result in runs:
        first.setdefault((str(cell.keys["task"]), str(cell.keys["noise"])), result)
    if not first:
        return
    plt = pyplot()
    fig, axes = plt.subplots(1, len(first), figsize=(4 * len(first), 4), squeeze=False)
    for ax, ((task, noise), result) in zip(axes[0], sorted(first.items()), strict=True):
        for attack in ATTACKS:
            fpr, tpr, _ = roc_curve(result["member"], result["scores"][attack])
            ax.plot(np.maximum(fpr, 1e-3), np.maximum(tpr, 1e-3), label=attack)
        ax.plot([1e-3, 1], [1e-3, 1], "k:", linewidth=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        decorate(ax, xlabel="FPR", ylabel="TPR", title=f"{task}, {noise}",
                 legend={"fontsize": 8})
    save(fig, ctx.figures / "mia_roc.png",
         suptitle="Membership inference on gpfl releases: ROC (004 Fig. 4.3b analogue)")


def table(rows: list[dict[str, str]]) -> list[str]:
    """Markdown: per task, noise and attack, each metric as mean ± 95 % t half-width."""
    head = ["task", "noise", "attack", "AUC", "TPR @ FPR 1 %", "TPR @ FPR 0.1 %",
            "ε at FPR 1 % (eq. 4.4)", "ε 95 % lower bound", "cost (s)", "target accuracy "
            "in / out"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    keys = list(dict.fromkeys((r["task"], r["noise"]) for r in rows))
    for task, noise in keys:
        cell = [r for r in rows if r["task"] == task and r["noise"] == noise]
        acc = f"{_ci(cell, 'accuracy_in')} / {_ci(cell, 'accuracy_out')}"
        for attack in ATTACKS:
            values = [_ci(cell, f"{m}_{attack}", 3 if m != "cost_s" else 2) for m in METRICS]
            lines.append(f"| {task} | {noise} | {attack} | " + " | ".join(values)
                         + f" | {acc} |")
    seeds = sorted({int(r["seed"]) for r in rows})
    lines += ["", f"Seeds: {len(seeds)}; each entry mean ± half-width of the 95 % Student-t "
              "interval over seeds."]
    return lines


def _ci(rows: Sequence[dict[str, str]], column: str, digits: int = 3) -> str:
    values = [float(r[column]) for r in rows if r.get(column) not in ("", None)]
    mean, half, n = mean_ci(values)
    if n == 0:
        return "-"
    text = fmt(mean, digits) if n == 1 or math.isnan(half) else \
        f"{fmt(mean, digits)} ± {fmt(half, 2)}"
    # eq. 4.4 is undefined where no record passes at FPR ≤ 1 %: say over how many seeds.
    return text if n == len(rows) else f"{text} ({n} of {len(rows)} seeds)"


def mia_section(rows: list[dict[str, str]]) -> list[str]:
    """Return the Markdown of this experiment's section of docs/RESULTS.md from its rows."""
    return [privacy_report.MIA_TEXT, "", *table(rows), "", *privacy_report.mia_findings(rows),
            "", privacy_report.MIA_LIMITS]


EXPERIMENT = Experiment(NAME, COLUMNS, grid, measure, figures,
                        shown=("auc_loss", "auc_shadow", "auc_noisy", "cost_s_shadow",
                               "cost_s_noisy"), perform=perform,
                        report=mia_section,
                        paper="004 ch. 4: membership inference (Fig. 4.4)", engine="in-process",
                        profiles=PROFILES, volatile=TIMINGS,
                        checks=tuple(within(("accuracy_in", "accuracy_out",
                                             *(f"{m}_{a}" for a in ATTACKS
                                               for m in ("auc", "tpr_1", "tpr_01"))), 0, 1)))
