"""The DLG attack: Deep Leakage from Gradients against one per-layer Laplace-sanitized update.

The attack of seeds/000 (Section 5.4, Fig. 5) and seeds/001 (Fig. 5, Table 2), on
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

`experiments.dlg_audit` runs it over ν and seeds and scores the reconstructions. The server's
effort per attack is :data:`QUICK` (one L-BFGS start) or :data:`FULL` (the best of three).

Reproducible: the victim image, the weights, the noise and the dummy starts are all derived
from ``seed`` (the noise also from ν, so adding a ν to the list leaves the other rows as they
were). torch runs on one thread during an attack (:func:`one_thread`).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from mechanisms import EuclideanLaplace

if TYPE_CHECKING:
    import torch
    from torch import nn

__all__ = [
    "LABEL_ATTACKS",
    "Attack",
    "AttackSettings",
    "attack",
    "dlg_attack",
    "dlg_lenet",
    "idlg_label",
    "one_thread",
]

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


# --------------------------------------------------------------------------- one attack


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


@dataclass(frozen=True)
class Victim:
    """One client's training step: its image and label, the model θ and its update θ_c."""

    image: np.ndarray
    label: int
    net: nn.Module
    theta: list[np.ndarray]
    theta_c: list[np.ndarray]


def victim(seed: int, learning_rate: float = LEARNING_RATE) -> Victim:
    """Make the client of ``seed``: one SGD step of size ``learning_rate`` on one image."""
    import torch

    image, label = _victim(seed)
    net = dlg_lenet()
    _init_uniform(net, seed)
    x = torch.from_numpy(image).reshape(1, 1, IMAGE_SIDE, IMAGE_SIDE)
    y = torch.nn.functional.one_hot(torch.tensor([label]), NUM_CLASSES).to(torch.float64)
    grads = _gradients(net, x, y, create_graph=False)
    theta = [p.detach().numpy().copy() for p in net.parameters()]
    theta_c = [t - learning_rate * g.numpy() for t, g in zip(theta, grads, strict=True)]
    return Victim(image, label, net, theta, theta_c)


@dataclass(frozen=True)
class Attack:
    """What one attack gives: the reconstruction next to the truth, and what it cost to get.

    Attributes
    ----------
    reconstruction : numpy.ndarray
        The dummy image with the smallest matching loss, clipped to the pixel range [0, 1].
    truth : numpy.ndarray
        The client's image.
    cost : float
        The release's cost Σ_l n_l/ν (``inf`` for ν = 0: no mechanism).
    note : str
        The label read, the matching loss and the time taken, for a progress line.
    """

    reconstruction: np.ndarray
    truth: np.ndarray
    cost: float
    note: str


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Run torch on one thread: reductions in a fixed order, and the machine is shared."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def attack(seed: int, nu: float, *, quick: bool = False, label_attack: str = "idlg",
           learning_rate: float = LEARNING_RATE) -> Attack:
    """Attack the release of seed's client at ν with DLG.

    Parameters
    ----------
    seed : int
        Picks the victim image, the weights, the noise and the dummy starts.
    nu : float
        The noise multiplier; 0 releases θ_c as it is (the baseline where DLG must succeed).
    quick : bool
        :data:`QUICK` effort instead of :data:`FULL`.
    label_attack : {"idlg", "dlg"}
        How the server gets the label (see the module notes).
    learning_rate : float
        The client's step size s (public).

    Call it inside :func:`one_thread` for numbers that do not depend on the machine.
    """
    import torch

    start = time.perf_counter()
    client = victim(seed, learning_rate)
    released, cost = _release(client.theta, client.theta_c, nu, seed)
    estimate = [torch.from_numpy((t - r) / learning_rate)
                for t, r in zip(client.theta, released, strict=True)]
    guess = idlg_label(estimate[-2].numpy())
    dummy, loss = dlg_attack(client.net, estimate, settings=QUICK if quick else FULL,
                             label=guess if label_attack == "idlg" else None, seed=seed)
    reconstruction = np.clip(np.nan_to_num(dummy, nan=0.0), 0.0, 1.0)
    note = (f"true label {client.label}, iDLG reads {guess}; matching loss {loss:.3g}; "
            f"{time.perf_counter() - start:.1f} s")
    return Attack(reconstruction, client.image, cost, note)
