"""The DLG audit (seeds/001 Figure 5; 000 section 5.4): the attack of `experiments.dlg` over ν.

For every seed and noise multiplier ν (and ν = 0, no noise, the baseline where DLG must
succeed) an honest-but-curious server runs DLG on one client's per-layer Laplace-sanitized
update (batch 1, one local step, sigmoid network, L-BFGS; see `experiments.dlg`) and the
reconstruction is scored against the true image. ``results.csv`` holds
``nu,seed,mse,psnr,ssim,epsilon_per_layer_sum``; the figures are the reconstructions
(``dlg_reconstructions.png``) and the scores versus ν (``dlg_scores.png``).

**Scores** of the reconstruction (clipped to the known pixel range [0, 1]) against the true
image, all from ``skimage.metrics``: MSE, PSNR with data range 1 (``inf`` for a perfect
match), and SSIM (Wang et al. 2004) with a 3×3 uniform window (``win_size=3``; the default 7
leaves only a 2×2 interior on 8×8 images), ``data_range=1``, K1 = 0.01, K2 = 0.03, averaged
over the 6×6 interior.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from experiments.common import Context
from experiments.dlg import LABEL_ATTACKS, LEARNING_RATE, Attack, attack, one_thread
from experiments.figures import decorate, pyplot, save
from experiments.runner import Cell, Experiment, Run
from experiments.tables import mean_std

NAME = "dlg"
#: The paper's noise multipliers; ν = 0 (no noise) is added by the audit as a baseline.
QUICK_NUS = (0.001, 0.01, 0.1, 1.0, 10.0)
PROFILES: dict[str, dict[str, Any]] = {
    "full": {"nus": list(QUICK_NUS), "seeds": [0, 1, 2, 3, 4], "quick": False},
    "quick": {"nus": list(QUICK_NUS), "seeds": [0, 1], "quick": True},
    "smoke": {"nus": [0.001, 1.0, 10.0], "seeds": [0], "quick": True},
}
#: The keys of every row, in order.
ROW_KEYS = ("nu", "seed", "mse", "psnr", "ssim", "epsilon_per_layer_sum")
COLUMNS = ROW_KEYS
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


def score(nu: float, seed: int, result: Attack) -> dict[str, Any]:
    """Score one attack: its row, with the keys :data:`ROW_KEYS`."""
    truth, rec = result.truth, result.reconstruction
    return {"nu": nu, "seed": seed, "mse": mse(truth, rec), "psnr": psnr(truth, rec),
            "ssim": ssim(truth, rec), "epsilon_per_layer_sum": result.cost}


# --------------------------------------------------------------------------- the audit


def check_audit(nus: Sequence[float], seeds: Sequence[int], *, label_attack: str = "idlg",
                learning_rate: float = LEARNING_RATE) -> tuple[list[float], list[int]]:
    """Validate an audit's inputs; return its ν (0 in front when missing) and seeds, each once.

    Raises
    ------
    ValueError
        Naming the first bad value.
    """
    if label_attack not in LABEL_ATTACKS:
        raise ValueError(f"label_attack must be one of {LABEL_ATTACKS}, got {label_attack!r}")
    if not (learning_rate > 0.0 and math.isfinite(learning_rate)):
        raise ValueError(f"learning_rate must be positive and finite, got {learning_rate!r}")
    checked_nus: list[float] = []
    for nu in nus:
        value = float(nu)
        if not (value >= 0.0 and math.isfinite(value)):
            raise ValueError(f"every nu must be non-negative and finite, got nu={nu!r}")
        if value not in checked_nus:
            checked_nus.append(value)
    if not seeds:
        raise ValueError("seeds must not be empty, got seeds=[]")
    checked_seeds: list[int] = []
    for seed in seeds:
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"every seed must be a non-negative integer, got seed={seed!r}")
        if int(seed) not in checked_seeds:
            checked_seeds.append(int(seed))
    if 0.0 not in checked_nus:
        checked_nus.insert(0, 0.0)  # the un-noised baseline, where DLG must succeed
    return checked_nus, checked_seeds


def run_dlg_audit(nus: list[float], seeds: list[int], out_dir: Path, quick: bool = False,
                  progress: Callable[[str], None] = print, *, label_attack: str = "idlg",
                  learning_rate: float = LEARNING_RATE) -> list[dict[str, Any]]:
    """Attack one client's sanitized update with DLG for every (seed, ν) and score the result.

    Parameters
    ----------
    nus : list of float
        Noise multipliers ν >= 0 (repeats are dropped). ν = 0 (no mechanism: the raw θ_c is
        released) is the sanity baseline; it is added in front when missing.
    seeds : list of int
        Non-negative seeds (repeats are dropped); each picks the victim image, the weights,
        the noise and the dummy starts.
    out_dir : pathlib.Path
        The figure goes to ``out_dir/figures/dlg_reconstructions.png``.
    quick : bool
        One L-BFGS start of at most 200 evaluations per attack instead of the best of 3
        starts of at most 1,000.
    progress : callable
        Called with one line per attack.
    label_attack : {"idlg", "dlg"}
        How the server gets the label (see `experiments.dlg`).
    learning_rate : float
        The client's step size s (public).

    Returns
    -------
    list of dict
        One row per (seed, ν), seeds outer, with the keys :data:`ROW_KEYS`: ``nu``,
        ``seed``, ``mse``, ``psnr`` (dB, ``inf`` for a perfect match), ``ssim`` and
        ``epsilon_per_layer_sum`` (Σ_l n_l/ν, ``inf`` for ν = 0).
    """
    all_nus, all_seeds = check_audit(nus, seeds, label_attack=label_attack,
                                     learning_rate=learning_rate)
    done: dict[tuple[int, float], Attack] = {}
    rows = []
    with one_thread():
        for seed in all_seeds:
            for nu in all_nus:
                result = attack(seed, nu, quick=quick, label_attack=label_attack,
                                learning_rate=learning_rate)
                done[seed, nu] = result
                rows.append(score(nu, seed, result))
                progress(f"dlg seed={seed} nu={nu:g}: {describe(rows[-1], result)}")
    plot_reconstructions(done, out_dir / "figures" / "dlg_reconstructions.png")
    return rows


# --------------------------------------------------------------------------- the experiment


def grid(ctx: Context) -> list[Cell]:
    """(seed, ν) of the profile, seeds outer; ν = 0 first."""
    p = PROFILES[ctx.profile]
    nus, seeds = check_audit(p["nus"], ctx.pick_seeds(p["seeds"]))
    return [Cell(f"seed={seed} nu={nu:g}", {"seed": seed, "nu": nu, "quick": p["quick"]})
            for seed in seeds for nu in nus]


def perform(ctx: Context, cell: Cell) -> Attack:
    """One attack, on one thread."""
    with one_thread():
        return attack(cell.keys["seed"], cell.keys["nu"], quick=cell.keys["quick"])


def measure(cell: Cell, result: Attack) -> dict[str, Any]:
    """Score one attack."""
    return score(cell.keys["nu"], cell.keys["seed"], result)


def describe(row: Mapping[str, Any], result: Attack) -> str:
    """Say the scores, then the attack's notes (the progress message)."""
    return (f"mse={row['mse']:.3g} psnr={row['psnr']:.1f} dB ssim={row['ssim']:.3f} "
            f"({result.note})")


def figures(ctx: Context, rows: list[dict[str, str]], runs: list[Run]) -> None:
    """Draw the reconstructions, and the scores versus ν."""
    plot_reconstructions({(cell.keys["seed"], cell.keys["nu"]): result for cell, result in runs},
                         ctx.figures / "dlg_reconstructions.png")
    plot(rows, ctx.figures / "dlg_scores.png")


def plot_reconstructions(done: Mapping[tuple[int, float], Attack], path: Path) -> None:
    """Grid: one row per seed; the true image, then the reconstruction for each ν."""
    from matplotlib.figure import Figure

    seeds = list(dict.fromkeys(seed for seed, _ in done))
    nus = list(dict.fromkeys(nu for _, nu in done))
    cols = 1 + len(nus)
    fig = Figure(figsize=(1.25 * cols, 1.45 * len(seeds) + 0.4), layout="constrained")
    axes = fig.subplots(len(seeds), cols, squeeze=False)
    for r, seed in enumerate(seeds):
        truth = done[seed, nus[0]].truth
        panels = [(truth, "true", "")]
        for nu in nus:
            rec = done[seed, nu].reconstruction
            panels.append((rec, f"ν = {nu:g}", f"{psnr(truth, rec):.1f} dB"))
        for c, (picture, title, note) in enumerate(panels):
            ax = axes[r][c]
            ax.imshow(picture, cmap="gray", vmin=0.0, vmax=1.0, interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            if r == 0:
                ax.set_title(title, fontsize=9)
            if note:
                ax.set_xlabel(note, fontsize=8)
        axes[r][0].set_ylabel(f"seed {seed}", fontsize=9)
    fig.suptitle("DLG against per-layer Euclidean Laplace (PSNR below)", fontsize=10)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=150)


def aggregate(rows: list[dict[str, str]]) -> dict[float, dict[str, tuple[float, float, int]]]:
    """ν -> metric -> (mean, std, seeds); an infinite PSNR (perfect match) is kept as ∞."""
    out: dict[float, dict[str, tuple[float, float, int]]] = {}
    for nu in sorted({float(r["nu"]) for r in rows}):
        sel = [r for r in rows if float(r["nu"]) == nu]
        cell = {}
        for key in ("mse", "psnr", "ssim"):
            values = [float(r[key]) for r in sel]
            if any(math.isinf(v) for v in values):
                cell[key] = (math.inf, 0.0, len(values))
            else:
                cell[key] = (*mean_std(values), len(values))
        out[nu] = cell
    return out


def plot(rows: list[dict[str, str]], path: Path) -> Path:
    """MSE and SSIM of the reconstruction versus ν (mean ± std over seeds)."""
    agg = aggregate(rows)
    positive = [nu for nu in agg if nu > 0]
    zero_at = min(positive) / 10 if positive else 1e-4
    xs = [nu if nu > 0 else zero_at for nu in agg]
    fig, axes = pyplot().subplots(1, 2, figsize=(10, 3.8))
    for ax, key, label in ((axes[0], "mse", "MSE (lower: better reconstruction)"),
                           (axes[1], "ssim", "SSIM (1: perfect reconstruction)")):
        ax.errorbar(xs, [agg[nu][key][0] for nu in agg], yerr=[agg[nu][key][1] for nu in agg],
                    marker="o", capsize=3)
        decorate(ax, xlabel=f"noise multiplier ν (no noise drawn at {zero_at:g})",
                 ylabel=label, xscale="log", yscale="log" if key == "mse" else None)
    return save(fig, path, suptitle="DLG attack on a per-layer Laplace-sanitized update "
                                    "(001 Figure 5 analogue)")


def table(rows: list[dict[str, str]]) -> list[str]:
    """Markdown lines: per ν, MSE, PSNR and SSIM (mean ± std over seeds)."""
    lines = ["| ν | MSE | PSNR (dB) | SSIM | seeds |", "| --- | --- | --- | --- | --- |"]
    for nu, cell in aggregate(rows).items():
        def f(key: str, cell: dict[str, tuple[float, float, int]] = cell) -> str:
            m, s, _ = cell[key]
            return "∞" if math.isinf(m) else f"{m:.3g} ± {s:.2g}"
        lines.append(f"| {nu:g}{' (no noise)' if nu == 0 else ''} | {f('mse')} | {f('psnr')} | "
                     f"{f('ssim')} | {cell['mse'][2]} |")
    return lines


EXPERIMENT = Experiment(NAME, COLUMNS, grid, measure, figures, describe=describe, perform=perform)
