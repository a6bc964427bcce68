"""The victim of the DLG audit: the digits, the network, one client's step and its release.

The setting of 000 (Section 5.4, Fig. 5) and 001 (Fig. 5, Table 2), on
scikit-learn's bundled 8×8 digits. An honest-but-curious server sends a client the model θ;
the client takes **one** SGD step on **one** image (batch size 1, learning rate s), so that
θ_c = θ − s·∇ℓ(θ; x, y), and releases

    θ̂_c = EuclideanLaplace(calibration="neighbourhood", noise_multiplier=ν,
                            per_layer=<mode>).sanitize(θ, θ_c, rng)

in one of two noise modes (:data:`MODES`): ``"per-layer"`` (each weight and bias array has its
own ε_l = n_l/(ν‖δ_l‖), as in the paper's DLG test) and ``"whole-model"`` (one draw over the
flattened update, ε = n/(ν‖δ‖): what a gpfl client releases by default, ``per-layer = false``).
Both cost n/ν. The server knows θ, s and ν (ν is in the release's public cost n/ν) and
estimates the gradient as ĝ = (θ − θ̂_c)/s (:func:`observe`); the attacks on that estimate are
`experiments.audits.dlg_attacks`.

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
`experiments.audits.dlg_audit`, and the class means) and 450 private ones; victim ``i`` is the
``i // 10``-th private image of class ``i % 10`` that the recogniser reads correctly, so
victims 0-9 are ten different digits.

Reproducible: the weights, the noise and the dummy starts are derived from the victim's index
(the noise also from the mode and ν, so adding a ν leaves the other results as they were).
torch runs on one thread during an attack (:func:`one_thread`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
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
    "CLIENT_DEFAULT_MODE",
    "IMAGE_SIDE",
    "LEARNING_RATE",
    "MODES",
    "NUM_CLASSES",
    "Digits",
    "Observation",
    "Victim",
    "batched_gradients",
    "digits",
    "dlg_lenet",
    "mechanism",
    "observe",
    "release",
    "victim",
]

#: Local learning rate s of the client's single SGD step (public: the server divides by it).
LEARNING_RATE = 0.1
NUM_CLASSES = 10
IMAGE_SIDE = 8
#: Noise modes: one Laplace draw per layer (the paper's DLG test) or over the whole model.
MODES = ("per-layer", "whole-model")
#: The noise a gpfl client adds by default (the ``per-layer`` setting is false).
CLIENT_DEFAULT_MODE = "whole-model"
#: Share of the digits kept private (victims); the rest is public.
PRIVATE_SHARE = 0.25
#: Ridge added to the public digits' pixel covariance before inverting it (pixel² units).
PRIOR_RIDGE = 0.01

# Tags that separate the random streams derived from one victim.
_STREAM_WEIGHTS, _STREAM_NOISE, _STREAM_DUMMY, _STREAM_SPLIT = 2, 3, 4, 5
_ENTROPY = 0x646C67  # "dlg"


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
