"""The DLG audit's results: intervals over images, where reconstruction stops, tables, figure.

Reads the rows of `experiments.audits.dlg_audit` (one per mode, ν, attack or the strongest attack,
and image): the Student-t 95 % interval of each score over the images, the largest ν at which the
strongest attack still beats its reference (chance for the recognised fraction, the class-mean
image for the MSE), the tables and the scores-versus-ν figure, and the audit's section of
docs/RESULTS.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from experiments.audits.dlg_attacks import ATTACKS
from experiments.audits.dlg_victim import MODES
from experiments.core.claims import flow
from experiments.core.figures import decorate, pyplot, save
from experiments.core.tables import mean_ci, paired_difference

#: The pseudo-attack of the rows that report the strongest attack of a (mode, ν).
STRONGEST = "strongest"
#: The recognised fraction of a reconstruction that tells nothing, over images of ten digits.
CHANCE = 0.1
#: How every interval is named in the tables.
INTERVAL = "mean ± half-width of the two-sided Student-t 95 % interval over the images"


def _values(rows: Sequence[Mapping[str, str]], key: str) -> list[float]:
    return [float(r[key]) for r in rows]


def interval(values: Sequence[float]) -> tuple[float, float, int]:
    """`experiments.core.tables.mean_ci` that keeps an infinite PSNR (a perfect match) as ∞."""
    if any(math.isinf(v) and v > 0 for v in values):
        return math.inf, math.nan, len(values)
    return mean_ci(values)


def select(rows: Sequence[Mapping[str, str]], *, mode: str, nu: float, attack: str
           ) -> list[Mapping[str, str]]:
    """Return the rows of one (mode, ν, attack), one per image."""
    return [r for r in rows
            if r["mode"] == mode and float(r["nu"]) == nu and r["attack"] == attack]


def nus_of(rows: Sequence[Mapping[str, str]]) -> list[float]:
    """Return the ν of the rows, ascending."""
    return sorted({float(r["nu"]) for r in rows})


def attacks_of(rows: Sequence[Mapping[str, str]]) -> list[str]:
    """Return the rows' attacks in :data:`experiments.audits.dlg.ATTACKS` order, strongest last."""
    present = {r["attack"] for r in rows}
    return [name for name in (*ATTACKS, STRONGEST) if name in present]


#: The PSNR (dB) a gain, a plotted mean and the choice of the strongest attack count at most: an
#: exact reconstruction has an infinite PSNR, a near-exact one a very large, meaningless one.
PSNR_CAP_DB = 100.0


@dataclass(frozen=True)
class Summary:
    """One (mode, ν, attack) over the images: each score's (mean, 95 % half-width, n).

    ``gain`` is the PSNR (capped at `PSNR_CAP_DB`) above the class mean's, paired by image;
    ``label`` the label
    recovered (iDLG's read, the same for every attack but DLG).
    """

    scores: dict[str, tuple[float, float, int]]
    gain: tuple[float, float, int]
    picked: str


def summarise(rows: Sequence[Mapping[str, str]], *, mode: str, nu: float, attack: str
              ) -> Summary:
    """Summarise one (mode, ν, attack) over its images (Student-t 95 % intervals)."""
    sel = select(rows, mode=mode, nu=nu, attack=attack)
    out = {key: interval(_values(sel, key))
           for key in ("mse", "psnr", "ssim", "recognised", "closer_than_class_mean",
                       "label_recovered", "class_mean_psnr", "class_mean_ssim")}
    gain = paired_difference({r["image"]: min(float(r["psnr"]), PSNR_CAP_DB) for r in sel},
                             {r["image"]: float(r["class_mean_psnr"]) for r in sel})
    picked = ", ".join(dict.fromkeys(r["picked"] for r in sel if r["picked"]))
    return Summary(out, gain, picked)


def label_read(rows: Sequence[Mapping[str, str]], *, mode: str, nu: float
               ) -> tuple[float, float, int]:
    """Return the fraction of images whose label iDLG reads off the gradient, and its interval."""
    attack = next((name for name in attacks_of(rows) if name not in ("dlg", STRONGEST)), "")
    return interval(_values(select(rows, mode=mode, nu=nu, attack=attack), "label_recovered"))


def _above(mean: float, half: float, n: int, level: float) -> bool:
    """Whether the interval lies wholly above ``level`` (two values or more)."""
    return n >= 2 and math.isfinite(half) and mean - half > level


@dataclass(frozen=True)
class Limits:
    """Where the strongest attack stops, per mode, from the rows.

    Attributes
    ----------
    recognisable : float or None
        The largest ν at which the recognised fraction's interval lies above chance (0.1).
    beyond_label : float or None
        The largest ν at which the PSNR above the class mean (paired) has an interval above 0:
        the reconstruction shows more of the image than its label does.
    label : float or None
        The largest ν at which the label-read fraction's interval lies above chance.
    first_unrecognisable : float or None
        The smallest ν at which the recognised fraction's interval reaches chance.
    """

    recognisable: float | None
    beyond_label: float | None
    label: float | None
    first_unrecognisable: float | None


def limits(rows: Sequence[Mapping[str, str]], mode: str) -> Limits:
    """Compute :class:`Limits` of ``mode`` from the strongest attack's rows."""
    recognisable, beyond, label, first_fail = [], [], [], []
    for nu in nus_of(rows):
        if not select(rows, mode=mode, nu=nu, attack=STRONGEST):
            continue
        s = summarise(rows, mode=mode, nu=nu, attack=STRONGEST)
        if _above(*s.scores["recognised"], CHANCE):
            recognisable.append(nu)
        else:
            first_fail.append(nu)
        if _above(*s.gain, 0.0):
            beyond.append(nu)
        if _above(*label_read(rows, mode=mode, nu=nu), CHANCE):
            label.append(nu)
    return Limits(max(recognisable, default=None), max(beyond, default=None),
                  max(label, default=None), min(first_fail, default=None))


def _up_to(value: float | None, nus: Sequence[float]) -> str:
    if value is None or value == 0.0:
        return "no ν with noise"
    return f"every ν tested (up to {value:g})" if value == max(nus) else f"ν up to {value:g}"


def conclusions(rows: Sequence[Mapping[str, str]]) -> list[str]:
    """Markdown bullets, one per mode: where reconstruction stops and how far the label leaks.

    Computed from the strongest attack's rows with :func:`limits`; "up to ν" means the largest
    ν of the grid at which the interval clears its reference.
    """
    lines = []
    for mode in MODES:
        if not any(r["mode"] == mode and r["attack"] == STRONGEST for r in rows):
            continue
        found = limits(rows, mode)
        nus = [nu for nu in nus_of(rows) if nu > 0]
        stop = ("" if found.first_unrecognisable is None
                else f" (the first ν where not: {found.first_unrecognisable:g})")
        lines.append(
            f"- **{mode}**: the strongest attack's reconstructions are read as the true digit "
            f"above chance (interval above {CHANCE:g}) at {_up_to(found.recognisable, nus)}"
            f"{stop}; they are closer to the true image than the mean image of its digit "
            f"(PSNR gain interval above 0) at {_up_to(found.beyond_label, nus)}; the label is "
            f"read off the gradient at {_up_to(found.label, nus)}.")
    return lines


def paper_claims(rows: Sequence[Mapping[str, str]]) -> list[str]:
    """Markdown bullets: each of the paper's three statements against DLG's own per-layer rows.

    The paper's test is DLG on a per-layer release. "Fully reconstructed" is read as every
    image recognised and the PSNR gain over the class mean's interval above 0; "at least
    partial" as the recognised fraction's interval above chance; "fails" as not above chance.
    """
    mode = "per-layer"
    have = [nu for nu in nus_of(rows) if nu > 0 and select(rows, mode=mode, nu=nu, attack="dlg")]
    if not have:
        return ["- The paper's statements: untested here (no DLG rows in this profile)."]

    summaries = {nu: summarise(rows, mode=mode, nu=nu, attack="dlg") for nu in have}

    def recognised(nu: float) -> bool:
        return _above(*summaries[nu].scores["recognised"], CHANCE)

    def shown(nu: float) -> str:
        s = summaries[nu]
        rec = s.scores["recognised"]
        return (f"recognised {_cell(rec)}, PSNR {_cell(s.scores['psnr'], 1)} dB, "
                f"PSNR − class mean's {_cell(s.gain, 1)} dB, n = {rec[2]}")

    lines = []
    small = [nu for nu in have if nu <= 0.001]
    if small:
        s = summaries[small[0]]
        full = s.scores["recognised"][0] == 1.0 and _above(*s.gain, 0.0)
        lines.append(f"- \"When ν = 10⁻³ the ground truth image is fully reconstructed\" (DLG, "
                     f"ν = {small[0]:g}: {shown(small[0])}): "
                     + ("reproduced." if full else "**not reproduced**."))
    partial = [nu for nu in have if 0.001 < nu <= 0.1]
    if partial:
        held = [nu for nu in partial if recognised(nu)]
        detail = "; ".join(f"ν = {nu:g}: {shown(nu)}" for nu in partial)
        lines.append("- \"Up to ν = 10⁻¹ [...] at least partial reconstruction is possible\" "
                     f"(DLG, {detail}): " + ("reproduced." if held == partial else
                                            "**not reproduced** at ν = " +
                                            ", ".join(f"{nu:g}" for nu in partial
                                                      if nu not in held) + "."))
    large = [nu for nu in have if nu >= 1.0]
    if large:
        beaten = [nu for nu in large if recognised(nu)]
        lines.append("- \"For ν ≥ 1 [...] the DLG attack fails to reconstruct input samples\" "
                     f"(DLG's recognised fraction not above chance at ν = "
                     f"{', '.join(f'{nu:g}' for nu in large)}): "
                     + ("reproduced for DLG (the stronger attacks above do better)." if not beaten
                        else "**not reproduced**: DLG's reconstructions are recognised above "
                        "chance at ν = " + ", ".join(f"{nu:g}" for nu in beaten) + "."))
    return lines


def _cell(value: tuple[float, float, int], digits: int = 2) -> str:
    mean, half, n = value
    if math.isinf(mean):
        return "∞"
    if n < 2 or math.isnan(half):
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {half:.{digits}f}"


def strongest_table(rows: Sequence[Mapping[str, str]], mode: str) -> list[str]:
    """Markdown lines: per ν, the strongest attack's scores (mean ± 95 % half-width)."""
    lines = [f"PSNR − class mean's: each image's PSNR capped at {PSNR_CAP_DB:g} dB (an exact "
             "reconstruction's is infinite), minus the class mean's, paired by image; the PSNR "
             "column is not capped.", "",
             "| ν | strongest attack | recognised | PSNR (dB) | PSNR − class mean's (dB) | "
             "SSIM | closer than class mean | label read | images |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    reference = None
    for nu in nus_of(rows):
        if not select(rows, mode=mode, nu=nu, attack=STRONGEST):
            continue
        s = summarise(rows, mode=mode, nu=nu, attack=STRONGEST)
        reference = s
        lines.append(
            f"| {nu:g}{' (no noise)' if nu == 0 else ''} | {s.picked} | "
            f"{_cell(s.scores['recognised'])} | {_cell(s.scores['psnr'], 1)} | "
            f"{_cell(s.gain, 1)} | {_cell(s.scores['ssim'])} | "
            f"{_cell(s.scores['closer_than_class_mean'])} | "
            f"{_cell(label_read(rows, mode=mode, nu=nu))} | {s.scores['psnr'][2]} |")
    if reference is not None:
        lines.append(f"| class mean of the true digit (reference) | - | 1 | "
                     f"{_cell(reference.scores['class_mean_psnr'], 1)} | 0 | "
                     f"{_cell(reference.scores['class_mean_ssim'])} | - | - | "
                     f"{reference.scores['class_mean_psnr'][2]} |")
    return lines


def attacks_table(rows: Sequence[Mapping[str, str]], mode: str) -> list[str]:
    """Markdown lines: per ν, every attack's mean PSNR (dB) / recognised fraction."""
    names = [name for name in attacks_of(rows) if name != STRONGEST]
    lines = ["| ν | " + " | ".join(names) + " |", "| --- |" + " --- |" * len(names)]
    for nu in nus_of(rows):
        cells = []
        for name in names:
            if not select(rows, mode=mode, nu=nu, attack=name):
                cells.append("-")
                continue
            s = summarise(rows, mode=mode, nu=nu, attack=name)
            cells.append(f"{_cell(s.scores['psnr'], 1)} dB / {_cell(s.scores['recognised'])}")
        lines.append(f"| {nu:g} | " + " | ".join(cells) + " |")
    return lines


def _band(ax: Any, xs: list[float], stats_: list[tuple[float, float, int]], label: str, *,
          bounds: tuple[float, float], **style: Any) -> None:
    means = np.array([min(m, PSNR_CAP_DB) for m, _, _ in stats_])
    halves = np.array([0.0 if not math.isfinite(h) else h for _, h, _ in stats_])
    ax.plot(xs, means, marker="o", label=label, **style)
    ax.fill_between(xs, np.clip(means - halves, *bounds), np.clip(means + halves, *bounds),
                    alpha=0.2, color=style.get("color"))


def plot(rows: list[dict[str, str]], path: Path) -> Path:
    """Recognised fraction, PSNR and SSIM versus ν per mode, with 95 % intervals over images."""
    nus = nus_of(rows)
    positive = [nu for nu in nus if nu > 0]
    zero_at = min(positive) / 10 if positive else 1e-2
    modes = [mode for mode in MODES if any(r["mode"] == mode for r in rows)]
    names = [name for name in attacks_of(rows) if name != STRONGEST]
    fig, axes = pyplot().subplots(len(modes), 3, figsize=(15, 4.2 * len(modes)), squeeze=False)
    for m, mode in enumerate(modes):
        def series(name: str, key: str, mode: str = mode) -> tuple[list[float], list[Any]]:
            pts = [(nu if nu > 0 else zero_at, summarise(rows, mode=mode, nu=nu, attack=name))
                   for nu in nus if select(rows, mode=mode, nu=nu, attack=name)]
            return [x for x, _ in pts], [s.scores[key] for _, s in pts]

        for col, key, ylabel in ((0, "recognised", "recognised as the true digit"),
                                 (1, "psnr", "PSNR (dB)"), (2, "ssim", "SSIM")):
            ax = axes[m][col]
            for name in names:
                xs, ys = series(name, key)
                ax.plot(xs, [min(y[0], PSNR_CAP_DB) for y in ys], lw=0.8, alpha=0.6, label=name)
            xs, ys = series(STRONGEST, key)
            bounds = {"recognised": (0.0, 1.0), "psnr": (0.0, PSNR_CAP_DB),
                      "ssim": (-1.0, 1.0)}[key]
            _band(ax, xs, ys, "strongest (95 % CI)", bounds=bounds, color="black")
            if key == "recognised":
                ax.axhline(CHANCE, color="grey", ls=":", label="chance")
                _, labels = series(STRONGEST, "label_recovered")
                ax.plot(xs, [y[0] for y in labels], color="tab:red", ls="--",
                        label="label read (iDLG)")
            else:
                _, ref = series(STRONGEST, f"class_mean_{key}")
                ax.axhline(ref[0][0], color="grey", ls=":", label="class mean of the true digit")
            decorate(ax, xlabel=f"noise multiplier ν (no noise drawn at {zero_at:g})",
                     ylabel=ylabel, title=f"{mode}", xscale="log",
                     legend={"fontsize": 7} if col == 0 else None)
    return save(fig, path, suptitle="Gradient inversion of one Laplace-sanitized update "
                                     "(001 Figure 5 analogue); bands: Student-t 95 % over images")


# --------------------------------------------------------------------------- report

_TEXT_1 = flow("""
**Paper (001 Fig. 5; 000 §5.4).** "When ν = 10⁻³ the ground truth image is fully
reconstructed. Up to ν = 10⁻¹ we see that at least partial reconstruction is possible. For ν ≥
1 [...] the DLG attack fails to reconstruct input samples" (FEMNIST, per-layer Laplace,
sigmoid network, batch 1, one local step; figure only).
""")
_TEXT_2 = flow("""
**Ours** (8×8 digits, `experiments/audits/dlg.py`: Zhu et al.'s sigmoid LeNet sized for 8×8, 9,466
parameters; one client, one image, one SGD step, released with the neighbourhood-calibrated
Euclidean Laplace mechanism). The server knows θ, the step size and ν (the release's cost is
n/ν) and runs five attacks: DLG and iDLG (L2 gradient matching, L-BFGS), Geiping et al.'s
cosine matching with total variation (signed Adam, pixels kept in [0, 1]), the noise's own
negative log-likelihood Σ_b n_b·(‖ĝ_b − g_b‖/(ν‖g_b‖) + log‖g_b‖) (not squared, per noised
block), and that likelihood plus a Gaussian prior fitted to public digits of every class (the
maximum a posteriori image). Every attack but DLG reads the label off the last layer's
gradient first; each keeps, of its restarts, the one with the lowest value of its own
objective. The victims are private digits, one per class (two in the full profile);
"recognised" means that an RBF SVM trained on the public digits reads the true digit in the
reconstruction (chance 0.1 over ten digits); the
class mean (the mean public image of the true digit) is the reference of an attacker who knows
the label and nothing else. The strongest attack of a (mode, ν) is the one with the highest
mean recognised fraction over the images (ties: PSNR), a choice the attacker can make itself
on public images since ν is public.
""")
_TEXT_PER_LAYER = "each layer noised with its own ε_l = n_l/(ν‖δ_l‖), the paper's test"
_TEXT_WHOLE_MODEL = ("one draw over the whole update, ε = n/(ν‖δ‖), what a gpfl client "
                     "releases by default")
_TEXT_4 = flow("""
**Where reconstruction stops** (from the strongest attack's rows: the largest ν of the grid at
which the 95 % interval clears its reference):
""")
_TEXT_3 = flow("""
**Differences.** 8×8 digits and a 9,466-parameter network instead of FEMNIST and Table 3's CNN
(which L-BFGS cannot invert even without noise, see the module's notes); the attacker is given
float64, the learning rate and ν. The paper ran DLG alone and shows images; the attacks that
use the noise's likelihood and a digit prior reconstruct at ν where DLG no longer does, so
"DLG fails for ν ≥ 1" is a statement about DLG, not about what the release protects. The
label is read off the gradient well beyond the ν where the image stops being reconstructed:
at those ν a release still tells the server which digit the client trained on.
""")
_TEXT_5 = flow("""
**The paper's statements**, each read on DLG's own rows in the per-layer mode (the paper's
attack and test):
""")
_MODE_TEXT = {"per-layer": _TEXT_PER_LAYER, "whole-model": _TEXT_WHOLE_MODEL}


def report_section(rows: list[dict[str, str]]) -> list[str]:
    """Write this experiment's section of docs/RESULTS.md from its rows."""
    images = len({r["image"] for r in rows})
    lines = [_TEXT_1, "", _TEXT_2, ""]
    for mode in MODES:
        if not any(r["mode"] == mode for r in rows):
            continue
        lines += [f"**{mode}** ({_MODE_TEXT[mode]}). The strongest attack per ν; "
                  f"{INTERVAL} ({images} images):", "",
                  *strongest_table(rows, mode), "",
                  f"Each attack alone ({mode}): mean PSNR / recognised fraction over the "
                  f"{images} images.", "", *attacks_table(rows, mode), ""]
    lines += [_TEXT_4, "", *conclusions(rows), "", _TEXT_5, "", *paper_claims(rows)]
    return [*lines, "", _TEXT_3]
