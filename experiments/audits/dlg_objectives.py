"""What the attacks of the DLG audit minimise: the objectives over a batch of dummy images.

Each objective compares the gradients of dummies
(:func:`experiments.audits.dlg_victim.batched_gradients`) with the server's estimate ĝ of an
observed release (`experiments.audits.dlg_victim.Observation`): DLG's squared distance, Geiping et
al.'s cosine distance plus total variation, the Laplace noise's own negative log-likelihood, and
that likelihood with a Gaussian prior over digits. iDLG's label reading is here too.
`experiments.audits.dlg_attacks` runs the optimizers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from experiments.audits.dlg_victim import Observation, digits

if TYPE_CHECKING:
    import torch

__all__ = [
    "TV_WEIGHT",
    "Objective",
    "flat_gradients",
    "geiping_objective",
    "idlg_label",
    "likelihood_objective",
    "prior_objective",
]

#: Weight of the total-variation term of ``"geiping"``: the best of 0, 0.005 and 0.02 (with
#: signed or plain Adam, step 0.1 or 0.03) on victims 10-15, outside the quick profile's, at
#: ν = 1 and 3; 0 is better without noise, where the other attacks reconstruct anyway.
TV_WEIGHT = 0.005


def idlg_label(last_weight_gradient: np.ndarray | torch.Tensor) -> int:
    """Return the iDLG label: the last layer's weight-gradient row with the most negative sum.

    For a softmax cross-entropy on a linear layer over positive inputs h (sigmoid outputs),
    row c of ∂ℓ/∂W is (p_c − y_c)·hᵀ: negative for the true class only.
    """
    rows = np.asarray(last_weight_gradient, dtype=np.float64)
    if rows.ndim != 2:
        raise ValueError(f"expected a 2-D weight gradient, got shape {rows.shape}")
    return int(np.argmin(rows.sum(axis=1)))


def flat_gradients(grads: Sequence[torch.Tensor]) -> torch.Tensor:
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
