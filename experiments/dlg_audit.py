"""The DLG audit (seeds/001 Figure 5; 000 section 5.4): wires `experiments.dlg` into the CLI.

The attack itself (an honest-but-curious server running Deep Leakage from Gradients on one
client's per-layer Laplace-sanitized update; batch 1, one local step, sigmoid network, L-BFGS) is
`experiments.dlg.run_dlg_audit`; this module picks ν and seeds per profile, writes
``results.csv`` (``nu,seed,mse,psnr,ssim,...``) and a summary figure next to the
reconstructions the audit draws (``figures/dlg_reconstructions.png``).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from experiments.common import Context, Progress, mean_std, plt_module, read_csv, write_csv

NAME = "dlg"
#: The paper's noise multipliers; ν = 0 (no noise) is added by the audit as a baseline.
NUS = [0.001, 0.01, 0.1, 1.0, 10.0]
PROFILES: dict[str, dict[str, Any]] = {
    "full": {"nus": NUS, "seeds": [0, 1, 2, 3, 4], "quick": False},
    "quick": {"nus": NUS, "seeds": [0, 1], "quick": True},
    "smoke": {"nus": [0.001, 1.0, 10.0], "seeds": [0], "quick": True},
}
COLUMNS = ("nu", "seed", "mse", "psnr", "ssim", "epsilon_per_layer_sum")


def run(ctx: Context) -> list[dict[str, Any]]:
    """Run the audit for the profile's ν and seeds; write results.csv and the figures."""
    from experiments.dlg import run_dlg_audit

    p = PROFILES[ctx.profile]
    seeds = ctx.pick_seeds(p["seeds"])
    nus = list(p["nus"])
    progress = Progress(NAME, len(seeds) * (len(nus) + (0.0 not in nus)), ctx.stream)

    def report(line: str) -> None:
        label, _, message = line.partition(": ")
        progress.step(label.removeprefix("dlg "), message)

    rows = run_dlg_audit(nus, seeds, ctx.out, p["quick"], report)
    columns = [*COLUMNS, *sorted({k for r in rows for k in r} - set(COLUMNS))]
    write_csv(ctx.out / "results.csv", rows, columns)
    plot(read_csv(ctx.out / "results.csv"), ctx.figures / "dlg_scores.png")
    return rows


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
    plt = plt_module()
    agg = aggregate(rows)
    positive = [nu for nu in agg if nu > 0]
    zero_at = min(positive) / 10 if positive else 1e-4
    xs = [nu if nu > 0 else zero_at for nu in agg]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, key, label in ((axes[0], "mse", "MSE (lower: better reconstruction)"),
                           (axes[1], "ssim", "SSIM (1: perfect reconstruction)")):
        ax.errorbar(xs, [agg[nu][key][0] for nu in agg], yerr=[agg[nu][key][1] for nu in agg],
                    marker="o", capsize=3)
        ax.set_xscale("log")
        if key == "mse":
            ax.set_yscale("log")
        ax.set_xlabel(f"noise multiplier ν (no noise drawn at {zero_at:g})")
        ax.set_ylabel(label)
    fig.suptitle("DLG attack on a per-layer Laplace-sanitized update (001 Figure 5 analogue)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


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
