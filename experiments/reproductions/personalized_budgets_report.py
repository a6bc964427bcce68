"""The personalized-budgets experiment's results: A, B and C compared, and its report section.

`experiments.reproductions.personalized_budgets` runs the panels; this module reads their rows: each
aggregation's accuracy per panel, accounting and budgets (mean and Student-t 95 % interval over
seeds), B − A and C − A paired by seed, the two readings of ε_i set side by side by the
clients' spends and noise, the table and the section of docs/RESULTS.md with 002's own numbers
beside ours. Every measured number of the section comes from the rows; 002's are quoted.
"""

from __future__ import annotations

import itertools
import math
import statistics
from typing import NamedTuple

from experiments.core.claims import claim, flow
from experiments.core.tables import excludes_zero, fmt, mean_ci, paired_difference, verdict

__all__ = ["AGGREGATIONS", "PAPER_BUDGETS", "PAPER_GAINS", "aggregate", "differences", "gains",
           "ours", "readings", "report_section", "table", "uniform_claims"]

#: 002's letter for each gpfl aggregation.
AGGREGATIONS = {"mean": "A", "weighted": "B", "probability": "C"}
#: What 002 reports in its text (its figures hold the rest): accuracy gains of B and C over A
#: in the personalized scenario, percentage points, and the accuracy without noise.
PAPER_GAINS = {
    "MNIST (sklearn digits), IID, Gaussian": {"B": 5.57, "C": 11.28, "no noise": 88.7},
    "Fashion-MNIST, IID, Gaussian": {"B": 3.04, "C": 3.93, "no noise": 73.1},
    "forest cover types, IID, Gaussian": {"B": 4.07, "C": 10.90, "no noise": 49.0},
    "MNIST, non-IID, sign": {"C": 6.97, "no noise": 65.2},
    "Fashion-MNIST, non-IID, sign": {"C": 19.85, "no noise": 49.8},
    "forest cover types, non-IID, sign": {"no noise": 62.6},
}


#: 002's personalized budgets for its MNIST experiments, ε_i per client (its N clients), by
#: mechanism; a panel's name ends with its mechanism.
PAPER_BUDGETS = {
    "gaussian": ("1,1,10", "1,5,10", "1,10,10"),
    "sign": ("5,5,5,5,5,15,15,15,15,15", "5,5,5,10,10,10,10,15,15,15"),
}
_MECHANISMS = {"gaussian": "Gaussian", "sign": "stochastic-sign"}

#: Two readings put "the same noise" on a release when their σ differ by at most this share.
SAME_NOISE = 0.05
#: A composed ε from which on a guarantee bounds nothing of use (e^10 ≈ 22,000 as a
#: likelihood ratio).
VOID_EPSILON = 10.0

Key = tuple[str, str, str, str]  # (accounting, setting, budgets, aggregation)


def aggregate(rows: list[dict[str, str]], panel: str
              ) -> dict[Key, tuple[float, float, int, float]]:
    """Map (accounting, setting, budgets, aggregation) to (mean, 95 % half-width, seeds, max ε).

    ``max ε`` is the largest composed spend of any client in those runs (NaN without noise).
    """
    cells: dict[Key, list[float]] = {}
    spent: dict[Key, list[float]] = {}
    for r in rows:
        if r["panel"] == panel:
            key = (r.get("accounting", "composed"), r["setting"], r["budgets"],
                   r["aggregation"])
            cells.setdefault(key, []).append(float(r["accuracy"]))
            if r.get("max_epsilon") not in (None, "", "nan"):
                spent.setdefault(key, []).append(float(r["max_epsilon"]))
    return {key: (*mean_ci(v), max(spent.get(key, [math.nan]))) for key, v in cells.items()}


def _name(accounting: str, setting: str, budgets: str) -> str:
    if setting == "no noise":
        return "no noise"
    return f"{accounting}: " + (f"uniform {budgets}" if setting == "uniform" else budgets)


def gains(rows: list[dict[str, str]], panel: str
          ) -> dict[tuple[str, str], dict[str, dict[int, float]]]:
    """Per (accounting, personalized budgets): seed -> accuracy of A, B and C."""
    out: dict[tuple[str, str], dict[str, dict[int, float]]] = {}
    for r in rows:
        if r["panel"] == panel and r["setting"] == "personalized":
            key = (r.get("accounting", "composed"), r["budgets"])
            method = AGGREGATIONS[r["aggregation"]]
            out.setdefault(key, {}).setdefault(method, {})[int(r["seed"])] = float(r["accuracy"])
    return out


def differences(rows: list[dict[str, str]], panel: str
                ) -> dict[tuple[str, str], dict[str, tuple[float, float, int]]]:
    """Per (accounting, budgets): B − A and C − A paired by seed (mean, 95 % half-width, n)."""
    return {key: {x: paired_difference(by[x], by["A"]) for x in ("B", "C")
                  if x in by and "A" in by}
            for key, by in gains(rows, panel).items()}


def table(rows: list[dict[str, str]]) -> list[str]:
    """Markdown lines: a row per panel, accounting and budgets: A / B / C, B−A, C−A, max ε."""
    lines = ["| panel | accounting: budgets ε_i | A (mean) | B (weighted) | C (probability) "
             "| B − A (paired) | C − A (paired) | max composed ε |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]

    def cell(m: float, h: float, n: int) -> str:
        if n == 0:
            return "-"
        return f"{m:.3f} (1)" if n == 1 else f"{m:.3f} ± {h:.3f} ({n})"

    for panel in dict.fromkeys(r["panel"] for r in rows):
        agg = aggregate(rows, panel)
        for (accounting, setting, budgets, aggregation), (m, h, n, eps) in agg.items():
            if setting != "personalized" and aggregation == "mean":
                lines.append(f"| {panel} | {_name(accounting, setting, budgets)} | "
                             f"{cell(m, h, n)} | (= A) | (= A) | | | {fmt(eps)} |")
        diffs = differences(rows, panel)
        for (accounting, budgets) in gains(rows, panel):
            cells, spent = [], []
            for method in ("A", "B", "C"):
                aggregation = {v: k for k, v in AGGREGATIONS.items()}[method]
                m, h, n, eps = agg.get((accounting, "personalized", budgets, aggregation),
                                       (math.nan, math.nan, 0, math.nan))
                cells.append(cell(m, h, n))
                spent.append(eps)
            d = diffs.get((accounting, budgets), {})
            finite = [e for e in spent if not math.isnan(e)]
            lines.append(f"| {panel} | {accounting}: {budgets} | {' | '.join(cells)} | "
                         f"{verdict(*d['B']) if 'B' in d else '-'} | "
                         f"{verdict(*d['C']) if 'C' in d else '-'} | "
                         f"{fmt(max(finite)) if finite else '-'} |")
    return lines


# --------------------------------------------------------------------------- report


class Reading(NamedTuple):
    """One accounting's personalized budgets on a panel, as its runs spent them (run means)."""

    budgets: str
    rounds: int
    spend: tuple[float, float]  # the smallest and the largest composed spend of a client
    sigma: tuple[float, float]  # the noise σ of the smallest budget's and the largest's


def _mean(rows: list[dict[str, str]], column: str) -> float:
    values = [float(r[column]) for r in rows if r.get(column) not in (None, "", "nan")]
    return statistics.fmean(values) if values else math.nan


def readings(rows: list[dict[str, str]], panel: str) -> dict[tuple[str, str], Reading]:
    """Per (accounting, personalized budgets) of ``panel``: its clients' spends and noise."""
    runs: dict[tuple[str, str], list[dict[str, str]]] = {}
    for r in rows:
        if r["panel"] == panel and r["setting"] == "personalized":
            runs.setdefault((r.get("accounting", "composed"), r["budgets"]), []).append(r)
    return {key: Reading(key[1], round(_mean(rs, "rounds")),
                         (_mean(rs, "min_epsilon"), _mean(rs, "max_epsilon")),
                         (_mean(rs, "max_sigma"), _mean(rs, "min_sigma")))
            for key, rs in runs.items()}


def _compact(budgets: str) -> str:
    """Write ε_i as 002 does: ``5,5,5,5,5,15,...`` as ``5×5, 15×5`` (runs of 3 or more)."""
    out: list[str] = []
    for value, run in itertools.groupby(budgets.split(",")):
        n = len(list(run))
        out += [f"{value}×{n}"] if n >= 3 else [value] * n
    return ", ".join(out)


def _scale(panel: str, budgets: str) -> str:
    """Say how ``budgets`` relate to 002's: its own, one of its patterns × a factor, or ''."""
    values = [float(v) for v in budgets.split(",")]
    for pattern in PAPER_BUDGETS.get(panel.rsplit("-", 1)[-1], ()):
        paper = [float(v) for v in pattern.split(",")]
        factors = {round(v / q, 6) for v, q in zip(values, paper, strict=False)}
        if len(paper) == len(values) and len(factors) == 1:
            factor = factors.pop()
            return "002's own" if factor == 1 else f"002's ({_compact(pattern)}) ×{factor:g}"
    return ""


def _ratio(r: float) -> str:
    if abs(r - 1.0) <= SAME_NOISE:
        return f"{r:.2f}× that noise (the same within {100 * SAME_NOISE:g} %)"
    return f"{r:.2f}× that noise ({100 * abs(r - 1.0):.0f} % {'more' if r > 1 else 'less'})"


def _compared(panel: str, by: dict[tuple[str, str], Reading]) -> list[tuple[str, float]]:
    """Each `composed` reading beside the `per-round` one whose totals are nearest its own.

    Returns the Markdown item of each and the ratios of their noise.
    """
    per_round = [r for (accounting, _), r in by.items() if accounting == "per-round"]
    out = []
    for (accounting, _), c in by.items():
        if accounting != "composed" or not per_round:
            continue
        p = min(per_round, key=lambda r: sum(abs(math.log(a / b))
                                             for a, b in zip(c.spend, r.spend, strict=True)))
        ratios = [a / b for a, b in zip(c.sigma, p.sigma, strict=True)]
        scale = _scale(panel, p.budgets)
        out.append((
            f"- {panel}: `per-round` ε_i = ({_compact(p.budgets)})"
            + (f", {scale}," if scale else "")
            + f" per release composes over the R = {p.rounds} releases to {fmt(p.spend[0])} "
            f"for the smallest budget and {fmt(p.spend[1])} for the largest (the ledgers' "
            f"totals); the `composed` totals ({_compact(c.budgets)}) put {_ratio(ratios[0])} "
            f"on a release of the smallest budget and {_ratio(ratios[1])} on one of the "
            "largest.", max(abs(r - 1.0) for r in ratios)))
    return out


def ours(rows: list[dict[str, str]]) -> list[str]:
    """Write the paragraph before the table: what the rows ran, how the two readings differ."""
    panels = list(dict.fromkeys(r["panel"] for r in rows))
    personalized = [r for r in rows if r["setting"] == "personalized"]
    rounds = sorted({round(float(r["rounds"])) for r in rows})
    paper = "; ".join(f"{' or '.join(f'({_compact(b)})' for b in budgets)} with the "
                      f"{_MECHANISMS[m]} mechanism" for m, budgets in PAPER_BUDGETS.items())
    own = any(_scale(r["panel"], r["budgets"]) == "002's own" for r in personalized)
    text = [
        "**Ours** (accuracy of the final model after R = "
        f"{' or '.join(str(r) for r in rounds)} rounds, as 002 reports it; mean ± half-width "
        "of the two-sided 95 % Student-t interval over seeds, (seeds); `composed`: ε_i is the "
        "client's total over the run, our semantics; `per-round`: ε_i per release, 002's "
        "reading, with the total the ledgers report in the last column). "
        + (f"Among the rows are 002's own budgets (ε_i = {paper})." if own else
           f"**The budgets are not 002's.** 002's own (ε_i = {paper}) are not among the rows "
           "(the full profile runs them).")
        + " Below, each panel's `composed` totals are set against the `per-round` budgets "
        "whose ledgers' totals are nearest, by the noise σ the clients' releases carried:",
        "",
    ]
    compared = [c for panel in panels for c in _compared(panel, readings(rows, panel))]
    text += [item for item, _ in compared]
    if compared and all(gap <= SAME_NOISE for _, gap in compared):
        after = ("Both readings thus put the same noise on every release (within "
                 f"{100 * SAME_NOISE:g} %) and differ only in what ε_i means.")
    elif compared:
        after = ("The readings put the same noise on a release only where the `composed` total "
                 "matches the `per-round` budget's composed value; where it is lower, the "
                 "`composed` rows' releases carry more noise, so those rows are not the "
                 "`per-round` rows under another name.")
    else:
        after = "No panel ran both readings."
    # The budgets scaled up from 002's (not its own): what their guarantee is worth.
    scaled = [r for r in personalized if _scale(r["panel"], r["budgets"]) != "002's own"]
    least = min((float(r["min_epsilon"]) for r in scaled
                 if r.get("min_epsilon") not in (None, "", "nan")), default=math.nan)
    if least >= VOID_EPSILON:
        after += (f" At the budgets above 002's the formal guarantee is void (no client of "
                  f"those rows spends less than ε = {fmt(least)} over the run, and e^ε that "
                  "large bounds nothing); they are here to test 002's aggregation claim where "
                  "A learns, not as a privacy setting.")
    missing = []
    for panel in panels:
        ran = {AGGREGATIONS[r["aggregation"]] for r in personalized if r["panel"] == panel}
        absent = [m for m in ("A", "B", "C") if m not in ran]
        if absent and ran:
            missing.append(f"{panel} runs {' and '.join(sorted(ran))} only, so "
                           f"{' and '.join(absent)} on it {'is' if len(absent) == 1 else 'are'}"
                           " untested here")
    if missing:
        after += (" 002 runs A, B and C on its non-IID panels as on its IID ones; "
                  + "; ".join(missing) + ".")
    return [*text, "", after]


_TEXT_1 = flow("""
002 also finds "the larger the privacy budget, the higher accuracy" with uniform budgets, and
C best in most personalized settings (B and C both better than A on IID data; on forest cover
types non-IID neither gains).
""")
_TEXT_3 = flow("""
**Differences.** (1) Accounting: 002 calibrates each round's noise to (ε_i, δ_i) and states no
composition; gpfl composes a client's releases with dp-accounting's RDP accountant, so under
our semantics ε_i is the total and a release carries ~√R times the noise that 002's reading
of the same ε_i puts on it. Both are run:
the `per-round` rows reproduce 002's reading and show what it really costs (the composed ε of
the R releases at δ_i), the `composed` rows are what a gpfl user configuring ε_i gets. (2)
Sensitivity: we clip the whole update to L2 norm C and release it (Δ = 2C for the vector,
user-level local privacy); 002's σ formula does not scale with the clipping bound and its sign
mechanism takes Δ₂ = 2c per coordinate, so the same ε_i does not give the same noise in both;
at 002's own budgets the quick profile runs 002's reading only (`per-round`), and its readable
budgets (larger than 002's) in both.
(3) Model and data: 002's logistic regression on the same 8×8 digits, trained with 5 local
epochs of SGD (learning rate 0.5) instead of sklearn's "optimal" schedule; 002's N clients are
cycled over 30 of ours (each stands for 10); the Dirichlet α (0.5) is ours, 002 does not give
it. (4) 002 computes C's probabilities once over all N clients; ours per round (identical
here: every client takes part every round). (5) The full profile adds 002's own budgets in our
reading (`composed`), the Table 3 CNN (83,562 parameters) and the fairness task's 3-parameter
logistic regression (the small-model regime). (6) Five seeds; 002 states no seeds or
repetitions.
""")


def report_section(rows: list[dict[str, str]]) -> list[str]:
    """Write this experiment's section of docs/RESULTS.md from its rows."""
    lines = [
        "**Paper (002 §5.2.2 and §5.3.2).** Personalized scenario, accuracy gains over the "
        "arithmetic mean A, in points:",
        "",
        "| data set | B (weighted) − A | C (probability) − A | accuracy without noise |",
        "| --- | --- | --- | --- |",
    ]
    for data, g in PAPER_GAINS.items():
        lines.append(f"| {data} | {fmt(g.get('B'))} | {fmt(g.get('C'))} | "
                     f"{fmt(g.get('no noise'))} % |")
    lines += [
        "",
        _TEXT_1,
        "",
        *ours(rows),
        "",
        *table(rows),
        "",
    ]
    lines += ["Does 002's improvement reproduce? Each difference paired by seed, mean [95 % "
              "Student-t interval]:", ""]
    names = {"B": "B (weighted) beats A (mean)", "C": "C (probability) beats A (mean)"}
    for panel in dict.fromkeys(r["panel"] for r in rows):
        accuracies = gains(rows, panel)
        for (accounting, budgets), diff in differences(rows, panel).items():
            by = accuracies[accounting, budgets]
            for method, d in diff.items():
                seeds = [s for s in by[method] if s in by["A"]]
                above = sum(by[method][s] > by["A"][s] for s in seeds)
                # The count beside the interval: one seed's collapse of A widens the t
                # interval past 0 even when every seed orders the two the same way.
                lines.append("- " + claim(f"{panel}, {accounting}, ε = ({budgets}): "
                                           f"{names[method]}", *d)
                             + f" Above A in {above} of {len(seeds)} seeds.")
    lines += best_of_three(rows)
    lines += uniform_claims(rows)
    return [*lines, "", _TEXT_3]


def best_of_three(rows: list[dict[str, str]]) -> list[str]:
    """002's "C best in most personalized settings": C − B paired by seed, per setting.

    C is the best of the three in a setting when both C − A and C − B have 95 % intervals
    above 0; the claim holds when that is so in more than half the settings that run all
    three aggregations.
    """
    lines = ["", "002's \"C best in most personalized settings\", tested: C − B paired by "
             "seed where a setting runs all three (C is best there when both C − A and C − B "
             "have intervals above 0):", ""]
    best = settings = 0
    for panel in dict.fromkeys(r["panel"] for r in rows):
        accuracies = gains(rows, panel)
        for (accounting, budgets), by in accuracies.items():
            if not {"A", "B", "C"} <= set(by):
                continue
            settings += 1
            versus_b = paired_difference(by["C"], by["B"])
            versus_a = paired_difference(by["C"], by["A"])
            best += excludes_zero(*versus_a) and versus_a[0] > 0 and excludes_zero(
                *versus_b) and versus_b[0] > 0
            lines.append("- " + claim(f"{panel}, {accounting}, ε = ({budgets}): "
                                       "C (probability) beats B (weighted)", *versus_b))
    if settings == 0:
        return [*lines, "- No setting runs all three aggregations: not tested."]
    held = "reproduced" if 2 * best > settings else "**not reproduced**"
    return [*lines, f"- C is the best of the three in {best} of {settings} settings: "
            f"002's claim is {held} here."]


def uniform_claims(rows: list[dict[str, str]]) -> list[str]:
    """002's "the larger the privacy budget, the higher accuracy", per panel and accounting.

    The largest uniform budget against the smallest, paired by seed.
    """
    out = []
    for panel in dict.fromkeys(r["panel"] for r in rows):
        runs: dict[tuple[str, float], dict[int, float]] = {}
        for r in rows:
            if r["panel"] == panel and r["setting"] == "uniform":
                key = (r.get("accounting", "composed"), float(r["budgets"]))
                runs.setdefault(key, {})[int(r["seed"])] = float(r["accuracy"])
        for accounting in dict.fromkeys(a for a, _ in runs):
            budgets = sorted(b for a, b in runs if a == accounting)
            if len(budgets) < 2:
                continue
            lo, hi = budgets[0], budgets[-1]
            out.append("- " + claim(
                f"{panel}, {accounting}, uniform budgets: the larger the budget, the higher "
                f"the accuracy (ε = {hi:g} − ε = {lo:g})",
                *paired_difference(runs[accounting, hi], runs[accounting, lo])))
    return out
