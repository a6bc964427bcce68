"""The DLG audit (seeds/001 Figure 5; 000 section 5.4): what a capable server recovers.

What an honest-but-curious server recovers from one Laplace-sanitized update, over ν, in both
noise modes.

For every noise mode (per layer, as in the paper's test; over the whole model, as a gpfl client
releases by default), every noise multiplier ν (and ν = 0, no noise, where the attacks must
succeed) and every victim image (ten different digits in the quick profile), the attacks of
`experiments.dlg` (the DLG family, Geiping et al.'s cosine + total variation, the noise's own
likelihood, and that likelihood with a Gaussian digit prior) are run on the client's release,
and every reconstruction is scored against the true image.

**Strongest attack.** For each (mode, ν) the audit also reports the attack with the highest
mean recognised fraction over the images (ties: the highest mean PSNR), as ``attack =
"strongest"`` rows (``picked`` names it). An attacker can make this choice itself: ν is
public (a release's cost is n/ν), and it can try every attack on public images of its own.
Picking per image instead would need the true image, and taking the best of several guesses
per image raises the chance level (four guesses at a 10 % chance are right 34 % of the time);
picking once per (mode, ν) over ten images keeps that bias small. Each attack's own rows stay
in the CSV. Within an attack, restarts are chosen by the attack's own objective, never by the
truth.

**Scores** of a reconstruction (pixels in [0, 1]) against the true image: MSE, PSNR with data
range 1 (``inf`` for a perfect match) and SSIM (``skimage.metrics``; a 3×3 window, the default
7 leaving only a 2×2 interior on 8×8 images); ``recognised``: 1 when the recogniser of
`experiments.dlg.Digits` (an RBF SVM trained on public digits, none of them a victim) reads
the true digit in it (chance: 0.1 over ten images of ten different digits, whatever the
recogniser's bias); ``closer_than_class_mean``: 1 when its MSE is below that of the mean
public image of the true digit, the reference point of an attacker who knows the label and
nothing else (``class_mean_*`` columns: that image's own scores). ``label_read`` is the label
the attack used (read off the gradient by iDLG, or DLG's soft label).

``results.csv`` holds one row per (mode, ν, attack or "strongest", image) with the columns
:data:`COLUMNS`; the figures are the strongest attack's reconstructions per mode
(``dlg_reconstructions_<mode>.png``) and the scores versus ν with Student-t 95 % intervals over
the images (``dlg_scores.png``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from experiments.common import Context
from experiments.dlg import (
    ATTACKS,
    FULL,
    MODES,
    QUICK,
    SMOKE,
    Attack,
    Effort,
    attack,
    digits,
    one_thread,
)
from experiments.figures import decorate, pyplot, save
from experiments.runner import Cell, Experiment, Run
from experiments.tables import mean_ci, paired_difference

NAME = "dlg"
#: The attacks of the quick and smoke profiles: DLG (a soft label too) costs as much as iDLG
#: and did no better in our trials, so only the full profile runs it.
FAST_ATTACKS = tuple(name for name in ATTACKS if name != "dlg")
PROFILES: dict[str, dict[str, Any]] = {
    "full": {"nus": [0.01, 0.1, 0.3, 1.0, 2.0, 3.0, 5.0, 10.0, 30.0],
             "images": list(range(20)), "effort": FULL, "attacks": ATTACKS},
    "quick": {"nus": [0.1, 1.0, 2.0, 3.0, 5.0, 10.0], "images": list(range(10)),
              "effort": QUICK, "attacks": FAST_ATTACKS},
    "smoke": {"nus": [1.0, 10.0], "images": [0, 1, 2], "effort": SMOKE,
              "attacks": FAST_ATTACKS},
}
#: The pseudo-attack of the rows that report the strongest attack of a (mode, ν).
STRONGEST = "strongest"
#: The header of ``results.csv``.
COLUMNS = ("mode", "nu", "image", "label", "attack", "picked", "mse", "psnr", "ssim",
           "recognised", "closer_than_class_mean", "label_read", "label_recovered",
           "class_mean_mse", "class_mean_psnr", "class_mean_ssim", "loss", "cost")
ROW_KEYS = COLUMNS
#: The recognised fraction of a reconstruction that tells nothing, over images of ten digits.
CHANCE = 0.1
#: SSIM window side for 8×8 images.
SSIM_WIN_SIZE = 3
#: How every interval is named in the tables.
INTERVAL = "mean ± half-width of the two-sided Student-t 95 % interval over the images"


# --------------------------------------------------------------------------- scores


def _pair(true: np.ndarray, reconstruction: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    a = np.asarray(true, dtype=np.float64)
    b = np.asarray(reconstruction, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"images must have the same shape, got {a.shape} and {b.shape}")
    return a, b


def mse(true: np.ndarray, reconstruction: np.ndarray) -> float:
    """Mean squared error between two images of the same shape (float64)."""
    from skimage.metrics import mean_squared_error

    return float(mean_squared_error(*_pair(true, reconstruction)))


def psnr(true: np.ndarray, reconstruction: np.ndarray, *, data_range: float = 1.0) -> float:
    """Peak signal-to-noise ratio in dB, 10·log10(data_range² / MSE); ``inf`` when MSE = 0."""
    from skimage.metrics import peak_signal_noise_ratio

    # A perfect reconstruction divides by an MSE of 0: +inf is the answer, not a warning.
    with np.errstate(divide="ignore"):
        return float(peak_signal_noise_ratio(*_pair(true, reconstruction), data_range=data_range))


def ssim(true: np.ndarray, reconstruction: np.ndarray, *, data_range: float = 1.0,
         win_size: int = SSIM_WIN_SIZE) -> float:
    """Mean structural similarity of two 2-D images over the pixels whose window fits inside.

    ``skimage.metrics.structural_similarity`` with a ``win_size``×``win_size`` uniform window,
    K1 = 0.01, K2 = 0.03 and the given ``data_range``.
    """
    from skimage.metrics import structural_similarity

    a, b = _pair(true, reconstruction)
    if a.ndim != 2:
        raise ValueError(f"ssim expects 2-D images, got shape {a.shape}")
    return float(structural_similarity(a, b, win_size=win_size, data_range=data_range))


def scores(truth: np.ndarray, label: int, image: np.ndarray) -> dict[str, float | int]:
    """MSE, PSNR, SSIM and whether the recogniser reads ``label`` in ``image``."""
    return {"mse": mse(truth, image), "psnr": psnr(truth, image), "ssim": ssim(truth, image),
            "recognised": int(digits().recognise(image)[0] == label)}


@functools.lru_cache(maxsize=64)
def _class_mean_scores(image_id: int) -> dict[str, float | int]:
    """Score the mean public image of victim ``image_id``'s digit (the reference point)."""
    data = digits()
    index = data.victim_index(image_id)
    label = int(data.labels[index])
    return scores(data.images[index], label, data.class_means[label])


# --------------------------------------------------------------------------- the experiment


@functools.lru_cache(maxsize=128)
def _attacked(image: int, nu: float, mode: str, names: tuple[str, ...], effort: Effort
              ) -> Attack:
    """Every attack of ``names`` on one release, run once and kept for the rows that share it."""
    with one_thread():
        return attack(image, nu, mode, names, effort)


def attacked(image: int, nu: float, mode: str, names: Sequence[str], effort: Effort) -> Attack:
    """Attack victim ``image``'s release at ν in ``mode`` (cached: one run per release).

    Without noise both modes release θ_c itself: it is attacked once, for both.
    """
    return _attacked(image, float(nu), MODES[0] if nu == 0.0 else mode, tuple(names), effort)


@dataclass(frozen=True)
class Trial:
    """One row's reconstruction: the release's attacks and which of them the row scores.

    Attributes
    ----------
    result : experiments.dlg.Attack
        Every attack on the release.
    name : str
        The attack scored (for a "strongest" row, the one picked).
    """

    result: Attack
    name: str


def check_profile(nus: Sequence[float], images: Sequence[int]) -> tuple[list[float], list[int]]:
    """Validate ν and the images; return them once each, with ν = 0 in front.

    Raises
    ------
    ValueError
        Naming the first bad value.
    """
    checked_nus: list[float] = []
    for nu in nus:
        value = float(nu)
        if not (value >= 0.0 and math.isfinite(value)):
            raise ValueError(f"every nu must be non-negative and finite, got nu={nu!r}")
        if value not in checked_nus:
            checked_nus.append(value)
    if not images:
        raise ValueError("images must not be empty, got images=[]")
    checked_images: list[int] = []
    for image in images:
        if isinstance(image, bool) or not isinstance(image, (int, np.integer)) or image < 0:
            raise ValueError(f"every image must be a non-negative integer, got image={image!r}")
        if int(image) not in checked_images:
            checked_images.append(int(image))
    if 0.0 not in checked_nus:
        checked_nus.insert(0, 0.0)  # the un-noised baseline, where the attacks must succeed
    return sorted(checked_nus), checked_images


def grid(ctx: Context) -> list[Cell]:
    """(mode, ν, attack, image), then each image's "strongest" row after all its (mode, ν)'s.

    ``--seeds`` picks the victim images (see `experiments.dlg.Digits`).
    """
    p = PROFILES[ctx.profile]
    nus, images = check_profile(p["nus"], ctx.pick_seeds(p["images"]))
    common = {"attacks": tuple(p["attacks"]), "effort": p["effort"], "images": tuple(images)}
    cells = []
    for mode in MODES:
        for nu in nus:
            for image in images:
                cells += [Cell(f"{mode} nu={nu:g} image={image} {name}",
                               {"mode": mode, "nu": nu, "image": image, "attack": name, **common})
                          for name in p["attacks"]]
            cells += [Cell(f"{mode} nu={nu:g} image={image} {STRONGEST}",
                           {"mode": mode, "nu": nu, "image": image, "attack": STRONGEST, **common})
                      for image in images]
    return cells


@functools.lru_cache(maxsize=64)
def strongest(mode: str, nu: float, images: tuple[int, ...], names: tuple[str, ...],
              effort: Effort) -> str:
    """Name the attack with the highest mean recognised fraction over ``images``.

    Ties go to the highest mean PSNR.

    PSNR is capped at 100 dB for this choice: above it every attack has reconstructed the
    image to rounding. Cached: every image's "strongest" row of a (mode, ν) asks.
    """
    def key(name: str) -> tuple[float, float]:
        rows = [scores(r.truth, r.label, r.reconstructions[name].image)
                for r in (attacked(image, nu, mode, names, effort) for image in images)]
        return (float(np.mean([row["recognised"] for row in rows])),
                float(np.mean([min(float(row["psnr"]), 100.0) for row in rows])))

    return max(names, key=key)


def perform(ctx: Context, cell: Cell) -> Trial:
    """Attack the cell's release (once per release, cached) and name the attack its row scores."""
    keys = cell.keys
    result = attacked(keys["image"], keys["nu"], keys["mode"], keys["attacks"], keys["effort"])
    if keys["attack"] != STRONGEST:
        return Trial(result, keys["attack"])
    return Trial(result, strongest(keys["mode"], keys["nu"], tuple(keys["images"]),
                                   tuple(keys["attacks"]), keys["effort"]))


def measure(cell: Cell, trial: Trial) -> dict[str, Any]:
    """Score one reconstruction: its row, with the keys :data:`COLUMNS`."""
    result = trial.result
    rec = result.reconstructions[trial.name]
    row: dict[str, Any] = {"mode": cell.keys["mode"], "nu": cell.keys["nu"],
                           "image": result.image_id, "label": result.label,
                           "attack": cell.keys["attack"],
                           "picked": trial.name if cell.keys["attack"] == STRONGEST else ""}
    row.update(scores(result.truth, result.label, rec.image))
    reference = _class_mean_scores(result.image_id)
    row["closer_than_class_mean"] = int(row["mse"] < float(reference["mse"]))
    row.update(label_read=rec.label, label_recovered=int(rec.label == result.label),
               class_mean_mse=reference["mse"], class_mean_psnr=reference["psnr"],
               class_mean_ssim=reference["ssim"], loss=rec.loss, cost=result.cost)
    return {column: row[column] for column in COLUMNS}


def describe(row: Mapping[str, Any], trial: Trial) -> str:
    """Say the scores and the label read (the progress message)."""
    picked = f" ({row['picked']})" if row["picked"] else ""
    return (f"{row['attack']}{picked}: psnr={row['psnr']:.1f} dB ssim={row['ssim']:.3f} "
            f"recognised={row['recognised']} label {row['label']} read as {row['label_read']} "
            f"(release attacked in {trial.result.seconds:.1f} s)")


def figures(ctx: Context, rows: list[dict[str, str]], runs: list[Run]) -> None:
    """Draw the strongest attack's reconstructions per mode, and the scores versus ν."""
    for mode in MODES:
        picked = {(cell.keys["nu"], cell.keys["image"]): trial for cell, trial in runs
                  if cell.keys["mode"] == mode and cell.keys["attack"] == STRONGEST}
        if picked:
            plot_reconstructions(picked, ctx.figures / f"dlg_reconstructions_{mode}.png",
                                 title=f"Strongest attack, {mode} Euclidean Laplace")
    plot(rows, ctx.figures / "dlg_scores.png")


def plot_reconstructions(done: Mapping[tuple[float, int], Trial], path: Path, *,
                         title: str) -> Path:
    """Grid: one column per image; the truth, its class mean, then one row per ν."""
    from matplotlib.figure import Figure

    nus = sorted({nu for nu, _ in done})
    images = list(dict.fromkeys(image for _, image in done))
    data = digits()
    fig = Figure(figsize=(0.95 * len(images) + 1.2, 1.0 * (len(nus) + 2) + 0.5),
                 layout="constrained")
    axes = fig.subplots(len(nus) + 2, len(images), squeeze=False)
    for c, image in enumerate(images):
        first = done[nus[0], image].result
        mean_image = data.class_means[first.label]
        panels = [(first.truth, "true", ""),
                  (mean_image, "class mean", f"{psnr(first.truth, mean_image):.1f}")]
        for nu in nus:
            trial = done[nu, image]
            rec = trial.result.reconstructions[trial.name].image
            mark = "✓" if data.recognise(rec)[0] == trial.result.label else "✗"
            panels.append((rec, f"ν = {nu:g}", f"{psnr(trial.result.truth, rec):.1f} {mark}"))
        for r, (picture, row_name, note) in enumerate(panels):
            ax = axes[r][c]
            ax.imshow(picture, cmap="gray", vmin=0.0, vmax=1.0, interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            if c == 0:
                ax.set_ylabel(row_name, fontsize=8)
            if note:
                ax.set_xlabel(note, fontsize=7)
        axes[0][c].set_title(f"image {image}", fontsize=8)
    fig.suptitle(f"{title}: PSNR (dB) below, ✓ read as the true digit", fontsize=9)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130)
    return path


# --------------------------------------------------------------------------- summaries


def _values(rows: Sequence[Mapping[str, str]], key: str) -> list[float]:
    return [float(r[key]) for r in rows]


def interval(values: Sequence[float]) -> tuple[float, float, int]:
    """`experiments.tables.mean_ci` that keeps an infinite PSNR (a perfect match) as ∞."""
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
    """Return the attacks of the rows in :data:`experiments.dlg.ATTACKS` order, strongest last."""
    present = {r["attack"] for r in rows}
    return [name for name in (*ATTACKS, STRONGEST) if name in present]


@dataclass(frozen=True)
class Summary:
    """One (mode, ν, attack) over the images: each score's (mean, 95 % half-width, n).

    ``gain`` is the PSNR above the class mean's, paired by image; ``label`` the label
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
    gain = paired_difference({r["image"]: min(float(r["psnr"]), 100.0) for r in sel},
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


def _cell(value: tuple[float, float, int], digits: int = 2) -> str:
    mean, half, n = value
    if math.isinf(mean):
        return "∞"
    if n < 2 or math.isnan(half):
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {half:.{digits}f}"


def strongest_table(rows: Sequence[Mapping[str, str]], mode: str) -> list[str]:
    """Markdown lines: per ν, the strongest attack's scores (mean ± 95 % half-width)."""
    lines = ["| ν | strongest attack | recognised | PSNR (dB) | PSNR − class mean's (dB) | "
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
    means = np.array([min(m, 100.0) for m, _, _ in stats_])
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
                ax.plot(xs, [min(y[0], 100.0) for y in ys], lw=0.8, alpha=0.6, label=name)
            xs, ys = series(STRONGEST, key)
            bounds = {"recognised": (0.0, 1.0), "psnr": (0.0, 100.0), "ssim": (-1.0, 1.0)}[key]
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


EXPERIMENT = Experiment(NAME, COLUMNS, grid, measure, figures, describe=describe, perform=perform)
