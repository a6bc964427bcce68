"""Record-level DP-SGD of a torch model: per-record clipping, Gaussian noise, Poisson batches.

Opacus gives the per-sample gradients (``GradSampleModule``) and the Poisson sampling of the
device's own records (``UniformWithReplacementSampler``); the clipping strategies
(:mod:`mechanisms.record_clipping`: fixed, Andrew et al.'s quantile, OSO-DPSGD) and the noise
are here, because Opacus has no OSO and its optimizers draw noise from torch's generator rather
than the device's.

One step t of :func:`train_record_level` (``m`` is the public expected batch size, the request's
``batch-size``; the device's record count is never used):

1. the batch B_t: each record independently with probability q (the sampler's generator is
   seeded from the device's noise generator: the batch is as secret as the noise);
2. per-record gradients g_i of the per-record loss (float32, Opacus's tensors); ḡ_i = f_i·g_i
   with a float32 factor f_i just under min(1, C_t/‖g_i‖), conservative so that ‖ḡ_i‖ ≤ C_t
   holds exactly for the float32 gradients, and Σ ḡ_i in float64 (:mod:`tasks.clipped_sum`);
3. g̃_t = (Σ ḡ_i + N(0, (ν_g·C_t)² I)) / m, the noisy sum rounded exactly onto the public grid
   of its σ (:mod:`mechanisms.grid`), and θ ← θ − ρ_t·g̃_t;
4. the strategy's extra query, on the same batch and from the same generator, then C_{t+1} and
   ρ_{t+1} from the sanitized values alone.

The trace keeps C_t, ρ_t and the energy of every gradient-noise draw, so that the release check
(:func:`client.record_release.verify_record_release`) can test the noise against the charge.
Only classifiers with a cross-entropy objective are supported (a per-record loss must exist).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np
import torch
from opacus import GradSampleModule
from opacus.utils.uniform_sampler import UniformWithReplacementSampler
from torch.nn import functional as F

from mechanisms.grid import grid_spacing, on_grid
from mechanisms.record_clipping import ClipSchedule, NoiseSplit
from tasks.base import Dataset, Params
from tasks.clipped_sum import BatchClipping, scale_factors
from tasks.device import resolve_device
from tasks.torch_support import TorchTask, from_arrays, to_arrays

__all__ = ["RecordTrace", "RecordTraining", "supports_record_level", "train_record_level"]


def supports_record_level(task: object) -> bool:
    """Whether ``task`` can be trained with record-level DP-SGD (a torch cross-entropy model)."""
    return (isinstance(task, TorchTask) and task.is_classifier
            and task.objective == "cross-entropy")


@dataclass(frozen=True)
class RecordTraining:
    """The public parameters of one record-level release (all from the request and policy)."""

    strategy: str
    split: NoiseSplit
    sampling_rate: float
    steps: int
    expected_batch: int
    clip: float
    learning_rate: float
    target_quantile: float = 0.5
    clip_rate: float = 2.5e-3
    lr_rate: float = 2.5e-3


@dataclass
class RecordTrace:
    """What a release did, for the release check and the public metrics.

    ``clips`` and ``learning_rates`` hold C_t and ρ_t for t = 0..T (post-processing of
    sanitized values, publishable); ``noise_energy`` and ``noise_sigma`` the ‖noise‖² and σ of
    each step's gradient noise (kept on the device); ``dimension`` the model's size.
    """

    clips: list[float] = field(default_factory=list)
    learning_rates: list[float] = field(default_factory=list)
    noise_energy: list[float] = field(default_factory=list)
    noise_sigma: list[float] = field(default_factory=list)
    dimension: int = 0


def train_record_level(
    task: TorchTask, params: Params, data: Dataset, training: RecordTraining,
    rng: np.random.Generator, *, device: str = "cpu",
) -> tuple[Params, RecordTrace]:
    """Train ``params`` on ``data`` with DP-SGD; return the model and its trace.

    Parameters
    ----------
    task : TorchTask
        A classifier with a cross-entropy objective (:func:`supports_record_level`).
    params : list of numpy.ndarray
        The starting model (the chosen hypothesis).
    data : Dataset
        The device's records.
    training : RecordTraining
        The public parameters of the release.
    rng : numpy.random.Generator
        The device's noise generator: every noise draw and the batches come from it.
    """
    if not supports_record_level(task):
        raise ValueError("record-level DP-SGD needs a torch classifier with a cross-entropy loss")
    target = resolve_device(device)
    module = from_arrays(task.model(), params).to(target)
    module.train()
    names = list(module.state_dict())
    trainable = [n for n, _ in module.named_parameters()]
    if names != trainable:
        raise ValueError("record-level DP-SGD needs a model whose state is its parameters")
    sample_module = GradSampleModule(module, loss_reduction="sum")
    x_all, y_all = task._tensors(data, target)
    dims = sum(p.numel() for p in module.parameters())
    schedule = ClipSchedule(training.strategy, training.clip, training.learning_rate,
                            target_quantile=training.target_quantile,
                            clip_rate=training.clip_rate, lr_rate=training.lr_rate)
    trace = RecordTrace(dimension=dims)
    generator = torch.Generator().manual_seed(int(rng.integers(0, 2**63 - 1)))
    sampler = UniformWithReplacementSampler(num_samples=len(data),
                                            sample_rate=training.sampling_rate,
                                            generator=generator, steps=training.steps)
    m = float(training.expected_batch)
    clipping = BatchClipping([p.numel() for p in module.parameters()])
    for batch in sampler:
        rows = _per_sample_gradients(sample_module, module, x_all, y_all, batch, target)
        clip = schedule.clip
        # Clipping and the batch sum where the per-record gradients are (tasks.clipped_sum):
        # each clipped record has norm <= C exactly; no float64 copy of the batch.
        squared = clipping.squared_norms(rows)
        clipped_sum = clipping.clipped_sum(rows, scale_factors(squared, clip))
        sigma = training.split.gradient * clip
        noise = rng.standard_normal(dims)
        noise *= sigma
        trace.noise_energy.append(float(np.dot(noise, noise)))
        trace.noise_sigma.append(sigma)
        # Every noisy query is the exact sum rounded onto the public grid of its σ
        # (mechanisms.grid): what follows is post-processing of values on a fixed lattice.
        g_tilde = on_grid([clipped_sum, noise], grid_spacing(sigma, dims)) / m
        _apply_step(module, g_tilde, schedule.learning_rate)
        if training.strategy == "quantile":
            bits = (np.sqrt(squared) <= clip).astype(np.float64) - 0.5
            secondary = training.split.secondary
            count = on_grid([np.array([bits.sum()]), np.array([rng.normal(0.0, secondary)])],
                            grid_spacing(secondary, 1))
            schedule.step_quantile(float(count[0]) / m + 0.5)
        elif training.strategy == "oso":
            # Unit vectors of the clipped records (norm <= 1 exactly, as for the clipping).
            above = np.sqrt(squared) > clip
            units = clipping.clipped_sum(rows, scale_factors(squared, 1.0, cap=False) * above)
            secondary = training.split.secondary
            q_noise = rng.standard_normal(dims) * secondary
            q_tilde = on_grid([units, q_noise], grid_spacing(secondary, dims)) / m
            schedule.step_oso(g_tilde, q_tilde)
        else:
            schedule.step_fixed()
        # Opacus's per-record gradients are freed before the next batch allocates its own:
        # held across the next backward pass, they doubled the memory and made the allocator
        # map fresh, page-faulting memory every step (its zeroing took 2.5 times as long).
        del rows
    trace.clips = list(schedule.clips)
    trace.learning_rates = list(schedule.learning_rates)
    return to_arrays(module), trace


def _per_sample_gradients(
    sample_module: GradSampleModule, module: torch.nn.Module, x_all: torch.Tensor,
    y_all: torch.Tensor, batch: list[int], target: torch.device,
) -> list[torch.Tensor]:
    """Return the batch's per-record gradients: one float32 (B, n_p) view per parameter.

    No copy into one matrix and no float64: the clipping (:mod:`tasks.clipped_sum`) reads
    Opacus's per-sample gradients where they are.
    """
    if len(batch) == 0:
        return [torch.zeros(0, p.numel(), dtype=p.dtype, device=target)
                for p in module.parameters()]
    index = torch.as_tensor(batch, device=target)
    sample_module.zero_grad(set_to_none=True)
    for p in module.parameters():
        p.grad_sample = None  # type: ignore[attr-defined]
    loss = F.cross_entropy(sample_module(x_all[index]), y_all[index], reduction="sum")
    with warnings.catch_warnings():
        # Opacus's hooks on the first layer, whose input (the data) needs no gradient.
        warnings.filterwarnings("ignore", message="Full backward hook is firing")
        loss.backward()
    return [p.grad_sample.detach().reshape(len(batch), -1)  # type: ignore[attr-defined]
            for p in module.parameters()]


def _apply_step(module: torch.nn.Module, step: np.ndarray, learning_rate: float) -> None:
    """θ ← θ − ρ·step, in float32: ρ·step rounded to float32, then the subtraction."""
    if not np.isfinite(step).all():
        raise FloatingPointError("a DP-SGD step is not finite")
    params = list(module.parameters())
    if any(p.dtype != torch.float32 for p in params):
        raise TypeError("record-level DP-SGD trains float32 models")
    # One conversion and one product for the whole model (per layer they cost more than the
    # arithmetic); the same roundings as ρ·step computed per layer in float32.
    scaled = step.astype(np.float32)
    scaled *= np.float32(learning_rate)
    update = torch.from_numpy(scaled).to(params[0].device)
    offset = 0
    with torch.no_grad():
        for p in params:
            size = p.numel()
            p.sub_(update[offset:offset + size].view(p.shape))
            offset += size


def per_record_losses(task: TorchTask, hypotheses: list[Params], data: Dataset,
                      *, device: str = "cpu") -> np.ndarray:
    """Return each record's cross-entropy under each hypothesis, shape (k, records)."""
    if not supports_record_level(task):
        raise ValueError("per-record losses need a torch classifier with a cross-entropy loss")
    target = resolve_device(device)
    x, y = task._tensors(data, target)
    rows = []
    for params in hypotheses:
        module = from_arrays(task.model(), params).to(target)
        module.eval()
        with torch.no_grad():
            rows.append(F.cross_entropy(module(x), y, reduction="none").to("cpu").numpy())
    return np.asarray(rows, dtype=np.float64).reshape(len(hypotheses), len(data))
