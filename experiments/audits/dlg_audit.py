"""The DLG audit (001 Figure 5; 000 section 5.4): what a capable server recovers.

What an honest-but-curious server recovers from one Laplace-sanitized update, over ν, in both
noise modes.

For every noise mode (per layer, as in the paper's test; over the whole model, as a gpfl client
releases by default), every noise multiplier ν (and ν = 0, no noise, where the attacks must
succeed) and every victim image (ten different digits in the quick profile), the attacks of
`experiments.audits.dlg` (the DLG family, Geiping et al.'s cosine + total variation, the noise's own
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
`experiments.audits.dlg.Digits` (an RBF SVM trained on public digits, none of them a victim) reads
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

from experiments.audits.dlg import (
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
from experiments.audits.dlg_report import (
    PSNR_CAP_DB,
    STRONGEST,
    plot,
    report_section,
)
from experiments.core.common import Context
from experiments.core.runner import Cell, Experiment, Run
from experiments.core.sanity import flag, within

NAME = "dlg"
#: The attacks of the smoke profile: DLG (a soft label too) costs as much as iDLG and did no
#: better in our trials; the quick and full profiles run it, since it is the paper's attack.
FAST_ATTACKS = tuple(name for name in ATTACKS if name != "dlg")
PROFILES: dict[str, dict[str, Any]] = {
    "full": {"nus": [0.001, 0.01, 0.1, 0.3, 1.0, 2.0, 3.0, 5.0, 10.0, 30.0],
             "images": list(range(20)), "effort": FULL, "attacks": ATTACKS},
    # The paper's ν from 10⁻³ (Fig. 5: 10⁻³, 10⁻², 10⁻¹, 1, 10), with 2, 3 and 5 between.
    "quick": {"nus": [0.001, 0.01, 0.1, 1.0, 2.0, 3.0, 5.0, 10.0], "images": list(range(10)),
              "effort": QUICK, "attacks": ATTACKS},
    "smoke": {"nus": [1.0, 10.0], "images": [0, 1, 2], "effort": SMOKE,
              "attacks": FAST_ATTACKS},
}
#: The header of ``results.csv``.
COLUMNS = ("mode", "nu", "image", "label", "attack", "picked", "mse", "psnr", "ssim",
           "recognised", "closer_than_class_mean", "label_read", "label_recovered",
           "class_mean_mse", "class_mean_psnr", "class_mean_ssim", "loss", "cost")
ROW_KEYS = COLUMNS
#: SSIM window side for 8×8 images.
SSIM_WIN_SIZE = 3


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
    result : experiments.audits.dlg.Attack
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

    ``--seeds`` picks the victim images (see `experiments.audits.dlg.Digits`).
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

    PSNR is capped at `PSNR_CAP_DB` for this choice: above it every attack has reconstructed the
    image to rounding. Cached: every image's "strongest" row of a (mode, ν) asks.
    """
    def key(name: str) -> tuple[float, float]:
        rows = [scores(r.truth, r.label, r.reconstructions[name].image)
                for r in (attacked(image, nu, mode, names, effort) for image in images)]
        return (float(np.mean([row["recognised"] for row in rows])),
                float(np.mean([min(float(row["psnr"]), PSNR_CAP_DB) for row in rows])))

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


EXPERIMENT = Experiment(NAME, COLUMNS, grid, measure, figures, describe=describe, perform=perform,
                        report=report_section, paper="001 Fig. 5 / 000 §5.4",
                        engine="in-process", profiles=PROFILES,
                        checks=(*within("mse", 0, float("inf")), *within("ssim", -1, 1),
                                flag("recognised"), flag("closer_than_class_mean"),
                                flag("label_recovered")))
