"""Gradient inversion against one Laplace-sanitized update: the attacks of the DLG audit.

The server observes a release of the victim (`experiments.audits.dlg_victim`: θ, ĝ = (θ − θ̂_c)/s, ν
and the noise blocks) and reconstructs the client's image.

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

Conditions favour the attacker, as in the paper: sigmoid activations, batch size 1, one local
step, float64 throughout (the wire format is float32; its rounding acts as extra noise).

Reproducible: the dummy starts are derived from the victim's index; torch runs on one thread
during an attack (:func:`one_thread`).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from experiments.audits.dlg_objectives import (
    Objective,
    _l2_matching,
    flat_gradients,
    geiping_objective,
    idlg_label,
    likelihood_objective,
    prior_objective,
)
from experiments.audits.dlg_victim import (
    _STREAM_DUMMY,
    IMAGE_SIDE,
    LEARNING_RATE,
    NUM_CLASSES,
    Observation,
    _torch_seed,
    batched_gradients,
    observe,
    release,
    victim,
)

if TYPE_CHECKING:
    import torch

__all__ = [
    "ATTACKS",
    "FULL",
    "QUICK",
    "SMOKE",
    "Attack",
    "Effort",
    "Reconstruction",
    "attack",
    "idlg_label",
    "one_hot_labels",
    "one_thread",
    "run_attacks",
]

#: The attacks, in the order the audit runs them.
ATTACKS = ("dlg", "idlg", "geiping", "likelihood", "prior")


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


def one_hot_labels(label: int, batch: int) -> torch.Tensor:
    """(batch, NUM_CLASSES) float64: ``label`` one-hot, repeated for each image of a batch."""
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
        soft = (one_hot_labels(label, 1) if label is not None
                else torch.softmax(dummy_label, dim=-1))
        loss = _l2_matching(obs, flat_gradients(batched_gradients(obs.params, dummy, soft)))[0]
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
    labels = one_hot_labels(label, restarts * len(names))
    best_loss = torch.full((restarts * len(names),), math.inf, dtype=torch.float64)
    best_image = torch.cat(dummies).detach().clone()
    for step in range(steps + 1):
        optimizer.zero_grad()
        images = torch.cat(dummies)
        grads = flat_gradients(batched_gradients(obs.params, images, labels))
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
