"""DLG audit: does the per-layer Euclidean Laplace release stop Deep Leakage from Gradients.

The experiment of seeds/000 (Section 5.4, Fig. 5) and seeds/001 (Fig. 5, Table 2), on
scikit-learn's bundled 8×8 digits. An honest-but-curious server sends a client the model θ;
the client takes **one** SGD step on **one** image (batch size 1, learning rate s), so that
θ_c = θ − s·∇ℓ(θ; x, y), and releases

    θ̂_c = EuclideanLaplace(calibration="neighbourhood", noise_multiplier=ν, per_layer=True)
             .sanitize(θ, θ_c, rng)

(every weight and bias array is a layer with its own ε_l = n_l/(ν‖δ_l‖), so E‖ρ_l‖ = ν‖δ_l‖).
The server knows θ and s and estimates the gradient as ĝ = (θ − θ̂_c)/s. It then runs DLG
(Zhu, Liu and Han, NeurIPS 2019): a dummy image x̃ (and, in ``"dlg"`` mode, a dummy soft label
ỹ) is optimized with L-BFGS to minimise the gradient-matching loss Σ_l ‖∇_l ℓ(θ; x̃, ỹ) − ĝ_l‖².

Conditions favour the attacker, as in the paper: sigmoid activations (twice differentiable),
batch size 1, one local step, float64 throughout (the wire format is float32; its rounding acts
as extra noise, so float64 is the attacker's best case), and weights drawn uniformly from
[−0.5, 0.5] as in Zhu et al.'s code (large gradients, unsaturated sigmoids).

**Network** (:func:`dlg_lenet`): Zhu et al.'s LeNet (three 5×5 convolutions with 12 channels,
padding 2, the first with stride 2, each followed by a sigmoid, then one linear layer), sized
for 8×8: 1×8×8 → 12×4×4 → 12×4×4 → 12×4×4 → 10 logits, 9,466 parameters in 8 arrays. On the
un-noised gradient DLG recovers the image to MSE ≈ 1e-14 within ~60 (iDLG) to ~350 (DLG)
function evaluations for every seed tried. The paper's Table 3 CNN with its ReLUs swapped for
sigmoids (83,562 parameters, max pooling) was tried too and rejected: L-BFGS stalls at
MSE ≈ 0.02 even without noise, so it would understate the attack.

**Label** (``label_attack``): ``"idlg"`` (default) reads the label off the last layer's
gradient first (Zhao, Mopuri and Bilen 2020: its inputs are sigmoid outputs, > 0, so only the
true class's row of ∂ℓ/∂W sums to a negative number; the server takes the most negative row of
ĝ) and then optimizes the image alone with that one-hot label; this converges several times
faster and is never worse here. ``"dlg"`` optimizes a soft label jointly, as in Zhu et al.

**Scores** of the reconstruction (clipped to the known pixel range [0, 1]) against the true
image: MSE, PSNR with data range 1, and SSIM (Wang et al. 2004) by
``skimage.metrics.structural_similarity`` with a 3×3 uniform window (``win_size=3``; the
default 7 leaves only a 2×2 interior on 8×8 images), ``data_range=1``, K1 = 0.01, K2 = 0.03,
averaged over the 6×6 interior. ``quick`` runs one L-BFGS start of at most 200 function
evaluations per attack; full mode keeps the best (by matching loss, which the server can
see) of 3 starts of at most 1,000 evaluations.

Reproducible: the victim image, the weights, the noise and the dummy starts are all derived
from ``seed`` (the noise also from ν, so adding a ν to the list leaves the other rows as they
were). torch runs on one thread for the duration of the audit.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mechanisms import EuclideanLaplace

if TYPE_CHECKING:
    import torch
    from torch import nn

__all__ = [
    "FULL_SEEDS",
    "QUICK_NUS",
    "ROW_KEYS",
    "SSIM_WIN_SIZE",
    "AttackSettings",
    "dlg_attack",
    "dlg_lenet",
    "idlg_label",
    "mse",
    "psnr",
    "run_dlg_audit",
    "ssim",
]

#: The keys of every row that :func:`run_dlg_audit` returns, in order.
ROW_KEYS = ("nu", "seed", "mse", "psnr", "ssim", "epsilon_per_layer_sum")
#: The paper's noise multipliers (ν = 0, the un-noised baseline, is added by the audit).
QUICK_NUS = (0.001, 0.01, 0.1, 1.0, 10.0)
#: Seeds of the full audit.
FULL_SEEDS = (0, 1, 2, 3, 4)
#: SSIM window side for 8×8 images.
SSIM_WIN_SIZE = 3
#: Local learning rate s of the client's single SGD step (public: the server divides by it).
LEARNING_RATE = 0.1
NUM_CLASSES = 10
IMAGE_SIDE = 8
LABEL_ATTACKS = ("idlg", "dlg")

# Tags that separate the random streams derived from one seed.
_STREAM_IMAGE, _STREAM_WEIGHTS, _STREAM_NOISE, _STREAM_DUMMY = 1, 2, 3, 4
_ENTROPY = 0x646C67  # "dlg"


@dataclass(frozen=True)
class AttackSettings:
    """The server's effort per attack.

    Parameters
    ----------
    restarts : int
        Independent random starts of L-BFGS; the one with the smallest final
        gradient-matching loss is kept (the server can compute that loss).
    max_evals : int
        Function evaluations (closure calls) allowed per start.
    """

    restarts: int
    max_evals: int


QUICK = AttackSettings(restarts=1, max_evals=200)
FULL = AttackSettings(restarts=3, max_evals=1000)


# --------------------------------------------------------------------------- metrics


def _pair(true: np.ndarray, reconstruction: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    a = np.asarray(true, dtype=np.float64)
    b = np.asarray(reconstruction, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"images must have the same shape, got {a.shape} and {b.shape}")
    return a, b


def mse(true: np.ndarray, reconstruction: np.ndarray) -> float:
    """Mean squared error between two images of the same shape (float64)."""
    a, b = _pair(true, reconstruction)
    return float(np.mean((a - b) ** 2))


def psnr(true: np.ndarray, reconstruction: np.ndarray, *, data_range: float = 1.0) -> float:
    """Peak signal-to-noise ratio in dB, 10·log10(data_range² / MSE); ``inf`` when MSE = 0."""
    error = mse(true, reconstruction)
    if error == 0.0:
        return math.inf
    return 10.0 * math.log10(data_range**2 / error)


def ssim(
    true: np.ndarray,
    reconstruction: np.ndarray,
    *,
    data_range: float = 1.0,
    win_size: int = SSIM_WIN_SIZE,
) -> float:
    """Mean structural similarity (Wang et al. 2004) of two 2-D images.

    ``skimage.metrics.structural_similarity`` with a ``win_size``×``win_size`` uniform window,
    K1 = 0.01, K2 = 0.03 and the given ``data_range``; the mean is taken over the pixels whose
    window lies inside the image.
    """
    from skimage.metrics import structural_similarity

    a, b = _pair(true, reconstruction)
    if a.ndim != 2:
        raise ValueError(f"ssim expects 2-D images, got shape {a.shape}")
    return float(structural_similarity(a, b, win_size=win_size, data_range=data_range))


# --------------------------------------------------------------------------- victim


def _stream(seed: int, tag: int, *extra: int) -> np.random.SeedSequence:
    return np.random.SeedSequence([_ENTROPY, seed, tag, *extra])


def _torch_seed(seed: int, tag: int, *extra: int) -> int:
    return int(_stream(seed, tag, *extra).generate_state(1, np.uint64)[0] >> np.uint64(1))


def _nu_key(nu: float) -> int:
    """Return the bits of ν as an integer: a stream key that does not depend on the list's order."""
    return int(np.float64(nu).view(np.uint64))


def dlg_lenet() -> nn.Sequential:
    """Zhu et al.'s sigmoid LeNet sized for 1×8×8 inputs and 10 classes (float64, 9,466 params).

    Conv(1→12, 5, pad 2, stride 2) σ, Conv(12→12, 5, pad 2) σ, Conv(12→12, 5, pad 2) σ,
    Flatten (192), Linear(192→10). Weights are left at torch's default initialisation; the
    audit redraws them with :func:`_init_uniform`.
    """
    import torch
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(1, 12, kernel_size=5, padding=2, stride=2),
        nn.Sigmoid(),
        nn.Conv2d(12, 12, kernel_size=5, padding=2, stride=1),
        nn.Sigmoid(),
        nn.Conv2d(12, 12, kernel_size=5, padding=2, stride=1),
        nn.Sigmoid(),
        nn.Flatten(),
        nn.Linear(12 * 4 * 4, NUM_CLASSES),
    ).to(torch.float64)


def _init_uniform(net: nn.Module, seed: int) -> None:
    """Every parameter uniform on [−0.5, 0.5], as in Zhu et al.'s ``weights_init``."""
    import torch

    generator = torch.Generator().manual_seed(_torch_seed(seed, _STREAM_WEIGHTS))
    with torch.no_grad():
        for param in net.parameters():
            param.uniform_(-0.5, 0.5, generator=generator)


def _victim(seed: int) -> tuple[np.ndarray, int]:
    """One digit chosen by ``seed``: its 8×8 image scaled to [0, 1] and its label."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    index = int(np.random.default_rng(_stream(seed, _STREAM_IMAGE)).integers(len(digits.target)))
    return digits.images[index].astype(np.float64) / 16.0, int(digits.target[index])


def _soft_cross_entropy(logits: torch.Tensor, soft_label: torch.Tensor) -> torch.Tensor:
    """Σ −y·log softmax(z): the ordinary cross-entropy for a one-hot y, DLG's for a soft one."""
    import torch

    return torch.sum(-soft_label * torch.log_softmax(logits, dim=-1))


def _gradients(
    net: nn.Module, image: torch.Tensor, soft_label: torch.Tensor, *, create_graph: bool
) -> tuple[torch.Tensor, ...]:
    import torch

    loss = _soft_cross_entropy(net(image), soft_label)
    return torch.autograd.grad(loss, list(net.parameters()), create_graph=create_graph)


# --------------------------------------------------------------------------- attack


def idlg_label(last_weight_gradient: np.ndarray | torch.Tensor) -> int:
    """Return the iDLG label: the last layer's weight-gradient row with the most negative sum.

    For a softmax cross-entropy on a linear layer over positive inputs h (sigmoid outputs),
    row c of ∂ℓ/∂W is (p_c − y_c)·hᵀ: negative for the true class only.
    """
    rows = np.asarray(last_weight_gradient, dtype=np.float64)
    if rows.ndim != 2:
        raise ValueError(f"expected a 2-D weight gradient, got shape {rows.shape}")
    return int(np.argmin(rows.sum(axis=1)))


def dlg_attack(
    net: nn.Module,
    target: Sequence[torch.Tensor],
    *,
    settings: AttackSettings,
    label: int | None,
    seed: int,
) -> tuple[np.ndarray, float]:
    """Reconstruct one input from a (noisy) gradient by DLG with L-BFGS.

    Parameters
    ----------
    net : torch.nn.Module
        The model at the parameters the server sent (float64); left unchanged.
    target : sequence of torch.Tensor
        The server's gradient estimate, one tensor per parameter of ``net``.
    settings : AttackSettings
        Restarts and function evaluations per restart.
    label : int or None
        A known (iDLG) label, or ``None`` to optimize a soft label jointly (DLG).
    seed : int
        Seeds the dummy starts (restart ``r`` uses its own stream).

    Returns
    -------
    numpy.ndarray, float
        The dummy image (8×8, not clipped) with the smallest gradient-matching loss seen over
        all restarts and evaluations, and that loss.
    """
    best = _Best()
    target = [t.detach() for t in target]
    for restart in range(settings.restarts):
        start_seed = _torch_seed(seed, _STREAM_DUMMY, restart)
        _one_start(net, target, settings.max_evals, label, start_seed, best)
    return best.image, best.loss


@dataclass
class _Best:
    """The dummy image with the smallest gradient-matching loss seen so far."""

    loss: float = math.inf
    image: np.ndarray = field(default_factory=lambda: np.full((IMAGE_SIDE, IMAGE_SIDE), np.nan))


def _one_start(
    net: nn.Module,
    target: Sequence[torch.Tensor],
    max_evals: int,
    label: int | None,
    torch_seed: int,
    best: _Best,
) -> None:
    """One L-BFGS run from a random dummy (and soft label); updates ``best`` at every evaluation."""
    import torch

    params = list(net.parameters())
    generator = torch.Generator().manual_seed(torch_seed)
    shape = (1, 1, IMAGE_SIDE, IMAGE_SIDE)
    dummy = torch.randn(shape, generator=generator, dtype=torch.float64).requires_grad_()
    variables = [dummy]
    if label is None:
        dummy_label = torch.randn((1, NUM_CLASSES), generator=generator, dtype=torch.float64)
        variables.append(dummy_label.requires_grad_())
    else:
        one_hot = torch.nn.functional.one_hot(torch.tensor([label]), NUM_CLASSES)
        fixed = one_hot.to(torch.float64)
    optimizer = torch.optim.LBFGS(
        variables,
        lr=1.0,
        max_iter=max_evals,
        max_eval=max_evals,
        history_size=100,
        tolerance_grad=1e-12,
        tolerance_change=1e-14,
        line_search_fn="strong_wolfe",
    )

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        soft = torch.softmax(dummy_label, dim=-1) if label is None else fixed
        grads = _gradients(net, dummy, soft, create_graph=True)
        loss = sum(
            (((g - t) ** 2).sum() for g, t in zip(grads, target, strict=True)),
            torch.zeros((), dtype=torch.float64),
        )
        value = float(loss.detach())
        # L-BFGS may wander (or overflow) after its best point; keep the best one seen.
        if value < best.loss:
            best.loss = value
            best.image = dummy.detach().numpy().reshape(IMAGE_SIDE, IMAGE_SIDE).copy()
        loss.backward()
        for param in params:  # the model is fixed: drop what backward left on it
            param.grad = None
        return loss

    optimizer.step(closure)


# --------------------------------------------------------------------------- audit


def _check_inputs(nus: Sequence[float], seeds: Sequence[int]) -> tuple[list[float], list[int]]:
    checked_nus = []
    for nu in nus:
        value = float(nu)
        if not (value >= 0.0 and math.isfinite(value)):
            raise ValueError(f"every nu must be non-negative and finite, got nu={nu!r}")
        if value not in checked_nus:
            checked_nus.append(value)
    if not seeds:
        raise ValueError("seeds must not be empty, got seeds=[]")
    checked_seeds = []
    for seed in seeds:
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"every seed must be a non-negative integer, got seed={seed!r}")
        if int(seed) not in checked_seeds:
            checked_seeds.append(int(seed))
    if 0.0 not in checked_nus:
        checked_nus.insert(0, 0.0)  # the un-noised baseline, where DLG must succeed
    return checked_nus, checked_seeds


def _release(
    theta: list[np.ndarray], theta_c: list[np.ndarray], nu: float, seed: int
) -> tuple[list[np.ndarray], float]:
    """Return the client's release and its cost Σ_l n_l/ν (``inf`` for ν = 0: no noise)."""
    if nu == 0.0:
        return [layer.copy() for layer in theta_c], math.inf
    mechanism = EuclideanLaplace(calibration="neighbourhood", noise_multiplier=nu, per_layer=True)
    cost = mechanism.event(theta, theta_c).cost
    rng = np.random.default_rng(_stream(seed, _STREAM_NOISE, _nu_key(nu)))
    return mechanism.sanitize(theta, theta_c, rng=rng), cost


def run_dlg_audit(
    nus: list[float],
    seeds: list[int],
    out_dir: Path,
    quick: bool = False,
    progress: Callable[[str], None] = print,
    *,
    label_attack: str = "idlg",
    learning_rate: float = LEARNING_RATE,
) -> list[dict[str, Any]]:
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
        One L-BFGS start of at most 200 evaluations per attack (:data:`QUICK`) instead of
        the best of 3 starts of at most 1,000 (:data:`FULL`).
    progress : callable
        Called with one line per attack.
    label_attack : {"idlg", "dlg"}
        How the server gets the label (see the module notes).
    learning_rate : float
        The client's step size s (public).

    Returns
    -------
    list of dict
        One row per (seed, ν), seeds outer, with the keys :data:`ROW_KEYS`: ``nu``,
        ``seed``, ``mse``, ``psnr`` (dB, ``inf`` for a perfect match), ``ssim`` and
        ``epsilon_per_layer_sum`` (Σ_l n_l/ν, ``inf`` for ν = 0).
    """
    import torch

    if label_attack not in LABEL_ATTACKS:
        raise ValueError(f"label_attack must be one of {LABEL_ATTACKS}, got {label_attack!r}")
    if not (learning_rate > 0.0 and math.isfinite(learning_rate)):
        raise ValueError(f"learning_rate must be positive and finite, got {learning_rate!r}")
    all_nus, all_seeds = _check_inputs(nus, seeds)
    settings = QUICK if quick else FULL
    rows: list[dict[str, Any]] = []
    images: dict[tuple[int, float], np.ndarray] = {}
    truths: dict[int, np.ndarray] = {}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # deterministic reductions, and the machine is shared
    try:
        for seed in all_seeds:
            image, label = _victim(seed)
            truths[seed] = image
            net = dlg_lenet()
            _init_uniform(net, seed)
            x = torch.from_numpy(image).reshape(1, 1, IMAGE_SIDE, IMAGE_SIDE)
            y = torch.nn.functional.one_hot(torch.tensor([label]), NUM_CLASSES).to(torch.float64)
            grads = _gradients(net, x, y, create_graph=False)
            theta = [p.detach().numpy().copy() for p in net.parameters()]
            theta_c = [t - learning_rate * g.numpy() for t, g in zip(theta, grads, strict=True)]
            for nu in all_nus:
                start = time.perf_counter()
                released, cost = _release(theta, theta_c, nu, seed)
                estimate = [
                    torch.from_numpy((t - r) / learning_rate)
                    for t, r in zip(theta, released, strict=True)
                ]
                guess = idlg_label(estimate[-2].numpy())
                dummy, loss = dlg_attack(
                    net,
                    estimate,
                    settings=settings,
                    label=guess if label_attack == "idlg" else None,
                    seed=seed,
                )
                reconstruction = np.clip(np.nan_to_num(dummy, nan=0.0), 0.0, 1.0)
                images[seed, nu] = reconstruction
                row = {
                    "nu": nu,
                    "seed": seed,
                    "mse": mse(image, reconstruction),
                    "psnr": psnr(image, reconstruction),
                    "ssim": ssim(image, reconstruction),
                    "epsilon_per_layer_sum": cost,
                }
                rows.append(row)
                progress(
                    f"dlg seed={seed} nu={nu:g}: mse={row['mse']:.3g} psnr={row['psnr']:.1f} dB "
                    f"ssim={row['ssim']:.3f} (true label {label}, iDLG reads {guess}; "
                    f"matching loss {loss:.3g}; {time.perf_counter() - start:.1f} s)"
                )
    finally:
        torch.set_num_threads(threads)
    _plot(truths, images, all_nus, out_dir / "figures" / "dlg_reconstructions.png")
    return rows


def _plot(
    truths: dict[int, np.ndarray],
    images: dict[tuple[int, float], np.ndarray],
    nus: Sequence[float],
    path: Path,
) -> None:
    """Grid: one row per seed; the true image, then the reconstruction for each ν."""
    from matplotlib.figure import Figure

    seeds = list(truths)
    cols = 1 + len(nus)
    fig = Figure(figsize=(1.25 * cols, 1.45 * len(seeds) + 0.4), layout="constrained")
    axes = fig.subplots(len(seeds), cols, squeeze=False)
    for r, seed in enumerate(seeds):
        panels = [(truths[seed], "true", "")]
        for nu in nus:
            rec = images[seed, nu]
            value = psnr(truths[seed], rec)
            panels.append((rec, f"ν = {nu:g}", f"{value:.1f} dB"))
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
