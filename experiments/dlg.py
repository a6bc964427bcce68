"""Gradient inversion against one Laplace-sanitized update: the attacks of the DLG audit.

The setting of seeds/000 (Section 5.4, Fig. 5) and seeds/001 (Fig. 5, Table 2), on
scikit-learn's bundled 8×8 digits. An honest-but-curious server sends a client the model θ;
the client takes **one** SGD step on **one** image (batch size 1, learning rate s), so that
θ_c = θ − s·∇ℓ(θ; x, y), and releases

    θ̂_c = EuclideanLaplace(calibration="neighbourhood", noise_multiplier=ν,
                            per_layer=<mode>).sanitize(θ, θ_c, rng)

in one of two noise modes (:data:`MODES`): ``"per-layer"`` (each weight and bias array has its
own ε_l = n_l/(ν‖δ_l‖), as in the paper's DLG test) and ``"whole-model"`` (one draw over the
flattened update, ε = n/(ν‖δ‖): what a gpfl client releases by default, ``per-layer = false``).
Both cost n/ν. The server knows θ, s and ν (ν is in the release's public cost n/ν) and
estimates the gradient as ĝ = (θ − θ̂_c)/s.

**Attacks** (:data:`ATTACKS`; each reads the label off the gradient first except ``"dlg"``,
which optimizes a soft label; each keeps, over its random restarts, the dummy with the smallest
value of *its own* objective: the server cannot see the true image):

* ``"dlg"``: Zhu, Liu and Han (NeurIPS 2019): Σ_l ‖∇_l ℓ(θ; x̃, ỹ) − ĝ_l‖² over a dummy image
  and a soft label, L-BFGS, pixels unconstrained (clipped to [0, 1] at the end).
* ``"idlg"``: the same with the label read off the gradient (Zhao, Mopuri and Bilen 2020).
* ``"geiping"``: Geiping et al. (NeurIPS 2020), *Inverting Gradients*: 1 − cos(∇ℓ(x̃), ĝ)
  over the whole flattened gradient plus a total-variation prior, Adam on the signed gradient,
  step decay at 3/8, 5/8 and 7/8 of the steps, pixels projected onto [0, 1] after every step.
* ``"likelihood"``: the noise's own negative log-likelihood. A block b of n_b coordinates
  (a layer, or the whole model) is released with density ∝ ε_b^{n_b}·exp(−ε_b‖ρ_b‖₂) and
  ε_b = n_b/(ν‖δ_b‖), δ_b = −s·g_b(x̃), so −log p(θ̂ | x̃) = Σ_b n_b·[‖ĝ_b − g_b(x̃)‖/(ν‖g_b(x̃)‖)
  + log‖g_b(x̃)‖] + const: not squared, and with the scale the mechanism itself took from the
  update. Adam, pixels projected onto [0, 1].
* ``"prior"``: the same likelihood plus a Gaussian prior over digits, ½(x̃ − μ)ᵀΣ⁻¹(x̃ − μ),
  fitted to the public digits of every class (so the prior alone does not give the label):
  the maximum a posteriori image.

**Network** (:func:`dlg_lenet`): Zhu et al.'s LeNet (three 5×5 convolutions with 12 channels,
padding 2, the first with stride 2, each followed by a sigmoid, then one linear layer), sized
for 8×8: 1×8×8 → 12×4×4 → 12×4×4 → 12×4×4 → 10 logits, 9,466 parameters in 8 arrays, weights
drawn uniformly from [−0.5, 0.5] as in Zhu et al.'s code (large gradients, unsaturated
sigmoids). The attacker computes the gradient of a batch of dummies, one gradient per dummy,
in closed form (:func:`batched_gradients`, equal to autograd's to rounding): one batched
evaluation per optimizer step serves every restart. The paper's Table 3 CNN with its ReLUs
swapped for sigmoids (83,562 parameters, max pooling) was tried with L-BFGS and rejected:
L-BFGS stalls at MSE ≈ 0.02 even without noise, so it would understate the attack.

Conditions favour the attacker, as in the paper: sigmoid activations, batch size 1, one local
step, float64 throughout (the wire format is float32; its rounding acts as extra noise).

**Data** (:func:`digits`): a fixed stratified split of the 1,797 digits into 1,347 public
images (the attacker's prior, the recogniser that scores reconstructions in
`experiments.dlg_audit`, and the class means) and 450 private ones; victim ``i`` is the
``i // 10``-th private image of class ``i % 10`` that the recogniser reads correctly, so
victims 0-9 are ten different digits.

Reproducible: the weights, the noise and the dummy starts are derived from the victim's index
(the noise also from the mode and ν, so adding a ν leaves the other results as they were).
torch runs on one thread during an attack (:func:`one_thread`).
"""

from __future__ import annotations

import contextlib
import functools
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from mechanisms import EuclideanLaplace
from settings import SETTINGS

if TYPE_CHECKING:
    import torch
    from sklearn.svm import SVC
    from torch import nn

__all__ = [
    "ATTACKS",
    "FULL",
    "MODES",
    "QUICK",
    "SMOKE",
    "Attack",
    "Digits",
    "Effort",
    "Observation",
    "Reconstruction",
    "Victim",
    "attack",
    "batched_gradients",
    "digits",
    "dlg_lenet",
    "idlg_label",
    "observe",
    "one_thread",
    "release",
    "run_attacks",
    "victim",
]

#: Local learning rate s of the client's single SGD step (public: the server divides by it).
LEARNING_RATE = 0.1
NUM_CLASSES = 10
IMAGE_SIDE = 8
#: The attacks, in the order the audit runs them.
ATTACKS = ("dlg", "idlg", "geiping", "likelihood", "prior")
#: Noise modes: one Laplace draw per layer (the paper's DLG test) or over the whole model.
MODES = ("per-layer", "whole-model")
#: The noise a gpfl client adds by default (the ``per-layer`` setting is false).
CLIENT_DEFAULT_MODE = "whole-model"
#: Share of the digits kept private (victims); the rest is public.
PRIVATE_SHARE = 0.25
#: Weight of the total-variation term of ``"geiping"``: the best of 0, 0.005 and 0.02 (with
#: signed or plain Adam, step 0.1 or 0.03) on victims 10-15, outside the quick profile's, at
#: ν = 1 and 3; 0 is better without noise, where the other attacks reconstruct anyway.
TV_WEIGHT = 0.005
#: Ridge added to the public digits' pixel covariance before inverting it (pixel² units).
PRIOR_RIDGE = 0.01

# Tags that separate the random streams derived from one victim.
_STREAM_WEIGHTS, _STREAM_NOISE, _STREAM_DUMMY, _STREAM_SPLIT = 2, 3, 4, 5
_ENTROPY = 0x646C67  # "dlg"


@dataclass(frozen=True)
class Effort:
    """The server's effort per attack.

    Parameters
    ----------
    restarts : int
        Independent random dummies; the one with the smallest final value of the attack's
        own objective is kept (the server can compute it; it cannot see the true image).
    lbfgs_evals : int
        Function evaluations per restart of the L-BFGS attacks (``"dlg"``, ``"idlg"``).
    adam_steps : int
        Adam steps of the other attacks (all restarts advance together, as one batch).
    """

    restarts: int
    lbfgs_evals: int
    adam_steps: int

    def __post_init__(self) -> None:
        for name in ("restarts", "lbfgs_evals", "adam_steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {name}={value!r}")


SMOKE = Effort(restarts=2, lbfgs_evals=60, adam_steps=60)
QUICK = Effort(restarts=2, lbfgs_evals=100, adam_steps=100)
FULL = Effort(restarts=4, lbfgs_evals=500, adam_steps=1000)


# --------------------------------------------------------------------------- data


def _stream(seed: int, tag: int, *extra: int) -> np.random.SeedSequence:
    return np.random.SeedSequence([_ENTROPY, seed, tag, *extra])


def _torch_seed(seed: int, tag: int, *extra: int) -> int:
    return int(_stream(seed, tag, *extra).generate_state(1, np.uint64)[0] >> np.uint64(1))


def _nu_key(nu: float) -> int:
    """Return the bits of ν as an integer: a stream key that does not depend on the list's order."""
    return int(np.float64(nu).view(np.uint64))


@dataclass(frozen=True)
class Digits:
    """The 8×8 digits split into public and private images, and what is fitted on the public ones.

    Attributes
    ----------
    images : numpy.ndarray
        All 1,797 images, (n, 8, 8), pixels scaled to [0, 1].
    labels : numpy.ndarray
        Their digits.
    public, private : numpy.ndarray
        Sorted indices of the two parts (a stratified split, :data:`PRIVATE_SHARE` private).
    recogniser : sklearn.svm.SVC
        An RBF support-vector classifier of the 64 pixels trained on the public images: reads a
        reconstruction as a digit.
    class_means : numpy.ndarray
        (10, 8, 8): the mean public image of each digit.
    prior_mean, prior_precision : numpy.ndarray
        μ (64) and (Σ + ridge·I)⁻¹ (64×64) of the public images of all digits.
    """

    images: np.ndarray
    labels: np.ndarray
    public: np.ndarray
    private: np.ndarray
    recogniser: SVC
    class_means: np.ndarray
    prior_mean: np.ndarray
    prior_precision: np.ndarray

    def recognise(self, images: np.ndarray) -> np.ndarray:
        """Return the digit the recogniser reads in each 8×8 image of ``images`` (…, 8, 8)."""
        flat = np.asarray(images, dtype=np.float64).reshape(-1, IMAGE_SIDE * IMAGE_SIDE)
        return np.asarray(self.recogniser.predict(flat), dtype=np.int64)

    def victim_index(self, image: int) -> int:
        """Return the dataset index of victim ``image``.

        Victim ``image`` is the ``image // 10``-th private image of class ``image % 10`` that
        the recogniser reads correctly: victims 0-9 are ten different digits.
        """
        if isinstance(image, bool) or not isinstance(image, (int, np.integer)) or image < 0:
            raise ValueError(f"image must be a non-negative integer, got image={image!r}")
        label, rank = int(image) % NUM_CLASSES, int(image) // NUM_CLASSES
        candidates = self.private[self.labels[self.private] == label]
        readable = candidates[self.recognise(self.images[candidates]) == label]
        if rank >= len(readable):
            raise ValueError(f"digit {label} has {len(readable)} private images the recogniser "
                             f"reads, too few for image={image}")
        return int(readable[rank])


@functools.lru_cache(maxsize=1)
def digits() -> Digits:
    """Load the digits, split them, fit the recogniser, class means and prior (cached)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    from sklearn.svm import SVC

    data = load_digits()
    images = data.images.astype(np.float64) / 16.0
    labels = data.target.astype(np.int64)
    state = int(_stream(0, _STREAM_SPLIT).generate_state(1)[0])
    public, private = train_test_split(np.arange(len(labels)), test_size=PRIVATE_SHARE,
                                       stratify=labels, random_state=state)
    public, private = np.sort(public), np.sort(private)
    flat = images[public].reshape(len(public), -1)
    recogniser = SVC().fit(flat, labels[public])
    class_means = np.stack([images[public][labels[public] == c].mean(axis=0)
                            for c in range(NUM_CLASSES)])
    covariance = np.cov(flat, rowvar=False) + PRIOR_RIDGE * np.eye(flat.shape[1])
    return Digits(images, labels, public, private, recogniser, class_means,
                  flat.mean(axis=0), np.linalg.inv(covariance))


# --------------------------------------------------------------------------- network


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


def _soft_cross_entropy(logits: torch.Tensor, soft_label: torch.Tensor) -> torch.Tensor:
    """Σ −y·log softmax(z): the ordinary cross-entropy for a one-hot y, DLG's for a soft one."""
    import torch

    return torch.sum(-soft_label * torch.log_softmax(logits, dim=-1))


def _gradients(
    net: nn.Module, image: torch.Tensor, soft_label: torch.Tensor, *, create_graph: bool
) -> tuple[torch.Tensor, ...]:
    """Return the client's gradient, by autograd through the module itself."""
    import torch

    loss = _soft_cross_entropy(net(image), soft_label)
    return torch.autograd.grad(loss, list(net.parameters()), create_graph=create_graph)


def batched_gradients(
    params: Sequence[torch.Tensor], images: torch.Tensor, soft_labels: torch.Tensor
) -> list[torch.Tensor]:
    """Return ∇_θ ℓ(θ; x_b, y_b) of :func:`dlg_lenet` for every image of a batch, in closed form.

    Parameters
    ----------
    params : sequence of torch.Tensor
        The network's 8 parameter arrays, in ``net.parameters()`` order.
    images : torch.Tensor
        (B, 1, 8, 8).
    soft_labels : torch.Tensor
        (B, 10): one-hot or soft labels (the loss is Σ −y·log softmax).

    Returns
    -------
    list of torch.Tensor
        One tensor per parameter, (B, *shape): the gradient of each image alone. Differentiable
        with respect to ``images`` and ``soft_labels`` (the attacks' second-order step).

    Notes
    -----
    Backpropagation written out with unfolded convolutions, so that one call gives B separate
    gradients (autograd would sum them): ∂ℓ/∂z = softmax(z)·Σy − y at the logits, then
    ∂ℓ/∂W = δ·colsᵀ and ∂ℓ/∂cols = Wᵀ·δ folded back onto the input of each convolution.
    """
    import torch
    import torch.nn.functional as F

    w1, b1, w2, b2, w3, b3, wf, bf = params
    batch = images.shape[0]
    side = IMAGE_SIDE // 2
    cols1 = F.unfold(images, 5, padding=2, stride=2)  # (B, 25, 16)
    a1 = torch.sigmoid(w1.reshape(12, -1) @ cols1 + b1[:, None])  # (B, 12, 16)
    cols2 = F.unfold(a1.reshape(batch, 12, side, side), 5, padding=2)  # (B, 300, 16)
    a2 = torch.sigmoid(w2.reshape(12, -1) @ cols2 + b2[:, None])
    cols3 = F.unfold(a2.reshape(batch, 12, side, side), 5, padding=2)
    a3 = torch.sigmoid(w3.reshape(12, -1) @ cols3 + b3[:, None])
    hidden = a3.reshape(batch, -1)
    logits = hidden @ wf.T + bf
    d_logits = torch.softmax(logits, dim=-1) * soft_labels.sum(-1, keepdim=True) - soft_labels
    d_z3 = (d_logits @ wf).reshape(batch, 12, -1) * a3 * (1 - a3)
    d_a2 = F.fold(w3.reshape(12, -1).T @ d_z3, (side, side), 5, padding=2)
    d_z2 = d_a2.reshape(batch, 12, -1) * a2 * (1 - a2)
    d_a1 = F.fold(w2.reshape(12, -1).T @ d_z2, (side, side), 5, padding=2)
    d_z1 = d_a1.reshape(batch, 12, -1) * a1 * (1 - a1)
    return [
        (d_z1 @ cols1.transpose(1, 2)).reshape(batch, *w1.shape), d_z1.sum(2),
        (d_z2 @ cols2.transpose(1, 2)).reshape(batch, *w2.shape), d_z2.sum(2),
        (d_z3 @ cols3.transpose(1, 2)).reshape(batch, *w3.shape), d_z3.sum(2),
        d_logits[:, :, None] * hidden[:, None, :], d_logits,
    ]


# --------------------------------------------------------------------------- victim, release


@dataclass(frozen=True)
class Victim:
    """One client's training step: its image and label, the model θ and its update θ_c."""

    image_id: int
    image: np.ndarray
    label: int
    net: nn.Module
    theta: list[np.ndarray]
    theta_c: list[np.ndarray]


def victim(image: int, learning_rate: float = LEARNING_RATE) -> Victim:
    """Make the client of victim ``image``: one SGD step of size ``learning_rate`` on its image.

    The gradient is autograd's through the module, as a client computes it (the attacker's
    closed form is checked against it in the tests).
    """
    import torch

    data = digits()
    index = data.victim_index(image)
    picture, label = data.images[index], int(data.labels[index])
    net = dlg_lenet()
    _init_uniform(net, image)
    x = torch.from_numpy(picture).reshape(1, 1, IMAGE_SIDE, IMAGE_SIDE)
    y = torch.nn.functional.one_hot(torch.tensor([label]), NUM_CLASSES).to(torch.float64)
    grads = _gradients(net, x, y, create_graph=False)
    theta = [p.detach().numpy().copy() for p in net.parameters()]
    theta_c = [t - learning_rate * g.numpy() for t, g in zip(theta, grads, strict=True)]
    return Victim(int(image), picture.copy(), label, net, theta, theta_c)


def mechanism(nu: float, mode: str) -> EuclideanLaplace:
    """Return the client's mechanism at ν in ``mode``.

    The neighbourhood calibration as `client.numpy_client.build_mechanism` builds it, per
    layer or over the whole model.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got mode={mode!r}")
    return EuclideanLaplace(calibration="neighbourhood", noise_multiplier=nu,
                            per_layer=mode == "per-layer",
                            least_radius=float(SETTINGS["least-radius"].default))


def release(client: Victim, nu: float, mode: str) -> tuple[list[np.ndarray], float]:
    """Return the client's release at ν in ``mode`` and its cost n/ν (``inf`` for ν = 0: no noise).

    The noise is drawn from a stream of the victim, the mode and ν.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got mode={mode!r}")
    if nu == 0.0:
        return [layer.copy() for layer in client.theta_c], math.inf
    laplace = mechanism(nu, mode)
    cost = laplace.event(client.theta, client.theta_c).cost
    rng = np.random.default_rng(_stream(client.image_id, _STREAM_NOISE, MODES.index(mode),
                                        _nu_key(nu)))
    return laplace.sanitize(client.theta, client.theta_c, rng=rng), cost


@dataclass(frozen=True)
class Observation:
    """What the server has: the model it sent, its gradient estimate, ν and the noise blocks.

    Attributes
    ----------
    params : tuple of torch.Tensor
        θ, the model the server sent (float64).
    gradient : tuple of torch.Tensor
        ĝ = (θ − θ̂_c)/s, one tensor per parameter.
    nu : float
        The noise multiplier (0: no noise).
    blocks : tuple of tuple of int
        The parameter arrays noised together: each alone (per layer) or all at once.
    target : torch.Tensor
        ĝ flattened (n).
    block_matrix : torch.Tensor
        (n, blocks): 1 where a coordinate belongs to a block, so that v @ block_matrix sums v
        over each block.
    block_sizes : torch.Tensor
        n_b of each block.
    """

    params: tuple[torch.Tensor, ...]
    gradient: tuple[torch.Tensor, ...]
    nu: float
    blocks: tuple[tuple[int, ...], ...]
    target: torch.Tensor
    block_matrix: torch.Tensor
    block_sizes: torch.Tensor


def observe(theta: Sequence[np.ndarray], released: Sequence[np.ndarray], *, nu: float, mode: str,
            learning_rate: float = LEARNING_RATE) -> Observation:
    """Return the server's view of a release: θ, ĝ = (θ − θ̂_c)/s, ν and the noise blocks."""
    import torch

    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got mode={mode!r}")
    params = tuple(torch.from_numpy(np.array(t, dtype=np.float64)) for t in theta)
    gradient = tuple(torch.from_numpy((np.asarray(t, np.float64) - np.asarray(r, np.float64))
                                      / learning_rate)
                     for t, r in zip(theta, released, strict=True))
    count = len(params)
    blocks = (tuple((i,) for i in range(count)) if mode == "per-layer"
              else (tuple(range(count)),))
    sizes = [p.numel() for p in params]
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    matrix = torch.zeros((int(offsets[-1]), len(blocks)), dtype=torch.float64)
    for b, block in enumerate(blocks):
        for i in block:
            matrix[int(offsets[i]):int(offsets[i + 1]), b] = 1.0
    block_sizes = matrix.sum(dim=0)
    target = torch.cat([g.reshape(-1) for g in gradient])
    return Observation(params, gradient, float(nu), blocks, target, matrix, block_sizes)


# --------------------------------------------------------------------------- objectives


def idlg_label(last_weight_gradient: np.ndarray | torch.Tensor) -> int:
    """Return the iDLG label: the last layer's weight-gradient row with the most negative sum.

    For a softmax cross-entropy on a linear layer over positive inputs h (sigmoid outputs),
    row c of ∂ℓ/∂W is (p_c − y_c)·hᵀ: negative for the true class only.
    """
    rows = np.asarray(last_weight_gradient, dtype=np.float64)
    if rows.ndim != 2:
        raise ValueError(f"expected a 2-D weight gradient, got shape {rows.shape}")
    return int(np.argmin(rows.sum(axis=1)))


def _flat(grads: Sequence[torch.Tensor]) -> torch.Tensor:
    """(B, n): each image's gradient as one vector, arrays in ``net.parameters()`` order."""
    import torch

    return torch.cat([g.reshape(g.shape[0], -1) for g in grads], dim=1)


def _block_sums(obs: Observation, values: torch.Tensor) -> torch.Tensor:
    """(B, blocks): ``values`` (B, n) summed over each noise block."""
    if len(obs.blocks) == 1:
        return values.sum(dim=1, keepdim=True)
    return values @ obs.block_matrix


def _l2_matching(obs: Observation, grads: torch.Tensor) -> torch.Tensor:
    """(B,): ‖g − ĝ‖², DLG's objective."""
    difference = grads - obs.target
    return (difference * difference).sum(dim=1)


def _cosine_distance(obs: Observation, grads: torch.Tensor) -> torch.Tensor:
    """(B,): 1 − cos(g, ĝ) over the whole flattened gradient (Geiping et al.)."""
    norms = grads.norm(dim=1) * obs.target.norm()
    return 1.0 - (grads @ obs.target) / norms.clamp_min(1e-300)


def _total_variation(images: torch.Tensor) -> torch.Tensor:
    """(B,): mean absolute difference of neighbouring pixels, across plus down (Geiping et al.)."""
    across = (images[..., :, 1:] - images[..., :, :-1]).abs().mean(dim=(1, 2, 3))
    down = (images[..., 1:, :] - images[..., :-1, :]).abs().mean(dim=(1, 2, 3))
    return across + down


def _negative_log_likelihood(obs: Observation, grads: torch.Tensor) -> torch.Tensor:
    """(B,): −log p(θ̂ | x̃) of the Euclidean Laplace release, up to a constant.

    Σ_b n_b·(‖ĝ_b − g_b‖/(ν‖g_b‖) + log‖g_b‖) (see the module notes). For ν = 0 (no noise) the
    limit of ν times it, Σ_b n_b‖ĝ_b − g_b‖/‖g_b‖: zero exactly at a matching gradient.
    """
    difference = grads - obs.target
    residual = _block_sums(obs, difference * difference).clamp_min(1e-300).sqrt()
    norm = _block_sums(obs, grads * grads).clamp_min(1e-300).sqrt()
    if obs.nu == 0.0:
        return (obs.block_sizes * residual / norm).sum(dim=1)
    return (obs.block_sizes * (residual / (obs.nu * norm) + norm.log())).sum(dim=1)


def _digit_prior(images: torch.Tensor) -> torch.Tensor:
    """(B,): ½(x − μ)ᵀ Σ⁻¹ (x − μ) under the public digits' Gaussian (:class:`Digits`)."""
    import torch

    data = digits()
    centred = images.reshape(images.shape[0], -1) - torch.from_numpy(data.prior_mean)
    return 0.5 * ((centred @ torch.from_numpy(data.prior_precision)) * centred).sum(dim=1)


#: An attack's objective: (dummies (B, 1, 8, 8), their flat gradients (B, n)) -> (B,) losses.
Objective = Callable[["torch.Tensor", "torch.Tensor"], "torch.Tensor"]


def geiping_objective(obs: Observation) -> Objective:
    """Geiping et al.'s *Inverting Gradients*: cosine distance plus :data:`TV_WEIGHT`·TV."""
    return lambda images, grads: (_cosine_distance(obs, grads)
                                  + TV_WEIGHT * _total_variation(images))


def likelihood_objective(obs: Observation) -> Objective:
    """Return the noise's own negative log-likelihood of the dummy."""
    return lambda images, grads: _negative_log_likelihood(obs, grads)


def prior_objective(obs: Observation) -> Objective:
    """Return the negative log-posterior: the likelihood plus the Gaussian digit prior.

    Without noise the posterior is the likelihood alone (ν·NLL's limit drops the prior).
    """
    if obs.nu == 0.0:
        return likelihood_objective(obs)
    return lambda images, grads: _negative_log_likelihood(obs, grads) + _digit_prior(images)


@dataclass(frozen=True)
class _AdamAttack:
    """How an attack moves its dummies: its objective, Adam's step and whether it is signed."""

    objective: Callable[[Observation], Objective]
    lr: float
    signed: bool


#: The attacks that run projected Adam, batched together; the others run L-BFGS.
ADAM_ATTACKS: dict[str, _AdamAttack] = {
    "geiping": _AdamAttack(geiping_objective, lr=0.1, signed=True),
    "likelihood": _AdamAttack(likelihood_objective, lr=0.1, signed=False),
    "prior": _AdamAttack(prior_objective, lr=0.1, signed=False),
}


# --------------------------------------------------------------------------- attacks


@dataclass(frozen=True)
class Reconstruction:
    """An attack's answer: the kept dummy (clipped to [0, 1]), the label it used and its loss.

    Attributes
    ----------
    image : numpy.ndarray
        8×8, pixels in [0, 1].
    label : int
        The label read off the gradient (iDLG), or the soft label's argmax (DLG).
    loss : float
        The attack's own objective at the kept dummy (what chose among restarts).
    """

    image: np.ndarray
    label: int
    loss: float


def _one_hot(label: int, batch: int) -> torch.Tensor:
    import torch

    one_hot = torch.nn.functional.one_hot(torch.tensor([label]), NUM_CLASSES)
    return one_hot.to(torch.float64).expand(batch, NUM_CLASSES)


def _lbfgs_start(obs: Observation, label: int | None, evals: int, torch_seed: int
                 ) -> Reconstruction:
    """One L-BFGS run of DLG (``label=None``: a soft label too) or iDLG from a random dummy.

    Returns the dummy (not clipped) with the smallest matching loss seen at any evaluation.
    """
    import torch

    generator = torch.Generator().manual_seed(torch_seed)
    dummy = torch.randn((1, 1, IMAGE_SIDE, IMAGE_SIDE), generator=generator,
                        dtype=torch.float64).requires_grad_()
    dummy_label = torch.randn((1, NUM_CLASSES), generator=generator, dtype=torch.float64)
    variables = [dummy] if label is not None else [dummy, dummy_label.requires_grad_()]
    optimizer = torch.optim.LBFGS(variables, lr=1.0, max_iter=evals, max_eval=evals,
                                  history_size=100, tolerance_grad=1e-12, tolerance_change=1e-14,
                                  line_search_fn="strong_wolfe")
    best = [Reconstruction(np.full((IMAGE_SIDE, IMAGE_SIDE), np.nan), -1, math.inf)]

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        soft = _one_hot(label, 1) if label is not None else torch.softmax(dummy_label, dim=-1)
        loss = _l2_matching(obs, _flat(batched_gradients(obs.params, dummy, soft)))[0]
        value = float(loss.detach())
        # L-BFGS may wander (or overflow) after its best point: keep the best one seen.
        if value < best[0].loss:
            best[0] = Reconstruction(dummy.detach().numpy()[0, 0].copy(),
                                     int(soft.detach().argmax()), value)
        loss.backward()
        return loss

    optimizer.step(closure)
    return best[0]


def _lbfgs(obs: Observation, effort: Effort, seed: int, label: int | None) -> Reconstruction:
    """Return the restart with the smallest matching loss, clipped to [0, 1]."""
    runs = [_lbfgs_start(obs, label, effort.lbfgs_evals, _torch_seed(seed, _STREAM_DUMMY, r))
            for r in range(effort.restarts)]
    best = min(runs, key=lambda run: run.loss)
    image = np.clip(np.nan_to_num(best.image, nan=0.0), 0.0, 1.0)
    return Reconstruction(image, best.label, best.loss)


def attack_dlg(obs: Observation, effort: Effort, seed: int) -> Reconstruction:
    """Zhu et al.'s DLG: L2 gradient matching over a dummy image and soft label, L-BFGS."""
    return _lbfgs(obs, effort, seed, None)


def attack_idlg(obs: Observation, effort: Effort, seed: int) -> Reconstruction:
    """iDLG: the label read off the gradient, then DLG's L2 matching over the image alone."""
    return _lbfgs(obs, effort, seed, idlg_label(obs.gradient[-2]))


def _projected_adam(obs: Observation, names: Sequence[str], effort: Effort, seed: int
                    ) -> dict[str, Reconstruction]:
    """Run the Adam attacks ``names`` together, ``effort.restarts`` uniform dummies each.

    Every dummy moves by its own attack's Adam step (signed for Geiping et al.), divided by 10
    at 3/8, 5/8 and 7/8 of the steps (their schedule), and is projected onto [0, 1] after every
    step. One closed-form evaluation per step serves every dummy; each attack's dummies start
    from their own stream, and Adam acts coordinate by coordinate, so an attack's answer does
    not depend on which others run beside it. Returns, per attack, the dummy with the smallest
    objective seen over its steps and restarts.
    """
    import torch

    restarts, label = effort.restarts, idlg_label(obs.gradient[-2])
    shape = (restarts, 1, IMAGE_SIDE, IMAGE_SIDE)
    dummies = [torch.rand(shape, dtype=torch.float64, generator=torch.Generator().manual_seed(
        _torch_seed(seed, _STREAM_DUMMY, ATTACKS.index(name)))).requires_grad_()
        for name in names]
    objectives = [ADAM_ATTACKS[name].objective(obs) for name in names]
    optimizer = torch.optim.Adam([{"params": [dummy], "lr": ADAM_ATTACKS[name].lr}
                                  for dummy, name in zip(dummies, names, strict=True)])
    steps = effort.adam_steps
    milestones = sorted({max(1, steps * k // 8) for k in (3, 5, 7)})
    schedule = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=milestones, gamma=0.1)
    labels = _one_hot(label, restarts * len(names))
    best_loss = torch.full((restarts * len(names),), math.inf, dtype=torch.float64)
    best_image = torch.cat(dummies).detach().clone()
    for step in range(steps + 1):
        optimizer.zero_grad()
        images = torch.cat(dummies)
        grads = _flat(batched_gradients(obs.params, images, labels))
        losses = torch.cat([objective(images[k * restarts:(k + 1) * restarts],
                                      grads[k * restarts:(k + 1) * restarts])
                            for k, objective in enumerate(objectives)])
        with torch.no_grad():  # the loss of the current (projected) dummy: keep the best
            better = torch.isfinite(losses) & (losses < best_loss)
            best_loss = torch.where(better, losses, best_loss)
            best_image[better] = images.detach()[better]
        if step == steps:
            break
        losses.sum().backward()  # dummies are independent: the sum's gradient is each one's
        for dummy, name in zip(dummies, names, strict=True):
            if ADAM_ATTACKS[name].signed and dummy.grad is not None:
                dummy.grad.sign_()
        optimizer.step()
        schedule.step()
        with torch.no_grad():
            for dummy in dummies:
                dummy.clamp_(0.0, 1.0)
    out = {}
    for k, name in enumerate(names):
        kept = k * restarts + int(torch.argmin(best_loss[k * restarts:(k + 1) * restarts]))
        out[name] = Reconstruction(best_image[kept, 0].numpy().copy(), label,
                                   float(best_loss[kept]))
    return out


def run_attacks(names: Sequence[str], obs: Observation, effort: Effort, seed: int
                ) -> dict[str, Reconstruction]:
    """Run the attacks ``names`` (of :data:`ATTACKS`) on ``obs``; ``seed`` seeds their dummies.

    The L-BFGS attacks run one after the other, the Adam attacks together (one batch).
    """
    for name in names:
        if name not in ATTACKS:
            raise ValueError(f"every attack must be one of {ATTACKS}, got attack={name!r}")
    out: dict[str, Reconstruction] = {}
    if "dlg" in names:
        out["dlg"] = attack_dlg(obs, effort, seed)
    if "idlg" in names:
        out["idlg"] = attack_idlg(obs, effort, seed)
    adam = [name for name in ATTACKS if name in names and name in ADAM_ATTACKS]
    if adam:
        out.update(_projected_adam(obs, adam, effort, seed))
    return {name: out[name] for name in dict.fromkeys(names)}


# --------------------------------------------------------------------------- one attack


@dataclass(frozen=True)
class Attack:
    """What the attacks give on one release: reconstructions next to the truth, and the cost.

    Attributes
    ----------
    image_id : int
        The victim.
    truth : numpy.ndarray
        The client's image.
    label : int
        The client's label.
    reconstructions : dict of str to Reconstruction
        Each attack's answer (pixels in [0, 1]), by name.
    label_read : int
        The label read off the gradient by iDLG (what every attack but ``"dlg"`` uses).
    cost : float
        The release's cost n/ν (``inf`` for ν = 0: no mechanism).
    seconds : float
        Time the attacks took together.
    """

    image_id: int
    truth: np.ndarray
    label: int
    reconstructions: dict[str, Reconstruction]
    label_read: int
    cost: float
    seconds: float


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


def attack(image: int, nu: float, mode: str, names: Sequence[str] = ATTACKS,
           effort: Effort = QUICK, *, learning_rate: float = LEARNING_RATE) -> Attack:
    """Run the attacks ``names`` on victim ``image``'s release at ν in noise ``mode``.

    Parameters
    ----------
    image : int
        The victim (see :class:`Digits`); also seeds its weights, noise and dummies.
    nu : float
        The noise multiplier; 0 releases θ_c as it is (the baseline where DLG must succeed).
    mode : {"per-layer", "whole-model"}
        How the noise is drawn (:data:`MODES`).
    names : sequence of str
        Attacks of :data:`ATTACKS`.
    effort : Effort
        Restarts and steps.
    learning_rate : float
        The client's step size s (public).

    Call it inside :func:`one_thread` for numbers that do not depend on the machine.
    """
    start = time.perf_counter()
    client = victim(image, learning_rate)
    released, cost = release(client, nu, mode)
    obs = observe(client.theta, released, nu=nu, mode=mode, learning_rate=learning_rate)
    results = run_attacks(names, obs, effort, image)
    return Attack(client.image_id, client.image, client.label, results,
                  idlg_label(obs.gradient[-2]), cost, time.perf_counter() - start)
