"""DP-SGD on tensors against the float64 NumPy path it replaced, end to end; the ε it is charged.

The reference below is the previous implementation's arithmetic, step by step: per-record
gradients copied to float64, their float64 norms, ḡ_i = g_i·min(1, C/‖g_i‖), the float64 sum,
the same noise draws from the same seeded generator, the exact sum on the public grid, the
strategy's extra query. With q = 1 every record is in every batch, so both paths see the same
batches. The new path clips at C·(1 − 2⁻¹⁶) with float32 factors (tasks.clipped_sum): its
noiseless sum differs from the old one's by at most 2⁻¹⁶·C per clipped record plus float32
rounding, so the grid values agree except where a noisy sum falls within that of a half-step
(one grid step then); the schedule's C and ρ agree exactly.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from client.app import device_task
from client.numpy_client import GpflClient
from client.policy import DevicePolicy
from mechanisms import PrivacyLedger, RecordLevelEvent
from mechanisms.grid import grid_spacing, on_grid
from mechanisms.record_accounting import record_epsilon
from mechanisms.record_clipping import ClipSchedule, split_noise
from settings import federation_defaults
from tasks import Task
from tasks.clipped_sum import CLIP_SLACK
from tasks.digits import DigitsTask
from tasks.dpsgd import RecordTraining, train_record_level
from tasks.torch_support import from_arrays

NU, CLIP, M, STEPS, RATE = 1.5, 0.5, 32, 2, 0.2


def per_record_gradients(task: DigitsTask, params: list[np.ndarray], data: Any) -> np.ndarray:
    """Plain autograd, one record at a time, copied to float64 (the old path's matrix)."""
    module = from_arrays(task.model(), params)
    rows = []
    for i in range(len(data)):
        module.zero_grad()
        x = torch.as_tensor(np.asarray(data.x[i:i + 1], dtype=np.float32))
        F.cross_entropy(module(x), torch.as_tensor(data.y[i:i + 1]), reduction="sum").backward()
        grads = [p.grad for p in module.parameters()]
        assert all(g is not None for g in grads)
        rows.append(torch.cat([g.reshape(-1) for g in grads if g is not None]))
    return torch.stack(rows).double().numpy()


def old_path(task: DigitsTask, params: list[np.ndarray], data: Any, training: RecordTraining,
             seed: int, *, slack: float = 0.0) -> tuple[list[np.ndarray], list[float]]:
    """The previous implementation's release at q = 1 (every record in every batch).

    ``slack`` clips at C·(1 − slack) instead of C (the new path's margin, in float64).
    """
    rng = np.random.default_rng(seed)
    rng.integers(0, 2**63 - 1)  # the batch sampler's seed, drawn first
    schedule = ClipSchedule(training.strategy, training.clip, training.learning_rate,
                            clip_rate=training.clip_rate, lr_rate=training.lr_rate)
    theta = [a.copy() for a in params]
    dims = sum(a.size for a in theta)
    for _ in range(training.steps):
        grads = per_record_gradients(task, theta, data)
        norms = np.linalg.norm(grads, axis=1)
        clip = schedule.clip
        factors = np.minimum(1.0, clip * (1.0 - slack) / norms)
        clipped_sum = (grads * factors[:, None]).sum(axis=0)
        sigma = training.split.gradient * clip
        noise = rng.standard_normal(dims) * sigma
        g_tilde = on_grid([clipped_sum, noise], grid_spacing(sigma, dims)) / M
        step = g_tilde.astype(np.float32)
        offset = 0
        for i, a in enumerate(theta):
            theta[i] = a - np.float32(schedule.learning_rate) * step[offset:offset + a.size
                                                                      ].reshape(a.shape)
            offset += a.size
        secondary = training.split.secondary
        if training.strategy == "quantile":
            bits = (norms <= clip).astype(np.float64) - 0.5
            count = on_grid([np.array([bits.sum()]), np.array([rng.normal(0.0, secondary)])],
                            grid_spacing(secondary, 1))
            schedule.step_quantile(float(count[0]) / M + 0.5)
        elif training.strategy == "oso":
            mask = norms > clip
            units = (grads[mask] / norms[mask, None]).sum(axis=0)
            q_noise = rng.standard_normal(dims) * secondary
            schedule.step_oso(g_tilde, on_grid([units, q_noise],
                                               grid_spacing(secondary, dims)) / M)
        else:
            schedule.step_fixed()
    return theta, list(schedule.clips)


@pytest.fixture(scope="module")
def setting() -> tuple[DigitsTask, list[np.ndarray], Any]:
    task = DigitsTask(model="logistic")
    return task, task.init_parameters(np.random.default_rng(0)), task.client_dataset(0, 8)


@pytest.mark.parametrize("strategy", ["fixed", "quantile", "oso"])
def test_the_tensor_path_releases_what_the_float64_path_released(setting, strategy: str) -> None:
    task, params, data = setting
    training = RecordTraining(strategy, split_noise(strategy, NU), sampling_rate=1.0,
                              steps=STEPS, expected_batch=M, clip=CLIP, learning_rate=1.0,
                              clip_rate=RATE, lr_rate=RATE)
    new, trace = train_record_level(task, params, data, training, np.random.default_rng(5))
    new_flat = flat(new)
    sigma = training.split.gradient * min(trace.clips)
    step = (spacing := grid_spacing(sigma, new_flat.size)) / M * max(trace.learning_rates)
    for slack, share in ((0.0, 0.99), (CLIP_SLACK, 0.999)):
        old, old_clips = old_path(task, params, data, training, seed=5, slack=slack)
        assert trace.clips == pytest.approx(old_clips, rel=1e-12)
        if strategy != "fixed":
            assert old_clips[-1] != CLIP  # the strategy's query moved C: it is compared too
        old_flat = flat(old)
        gap = np.abs(new_flat - old_flat)
        # Coordinates land on the same grid value, or one step (ρ·g/m a step) away where a
        # noisy sum fell that close to a half-step; beside float32 rounding of θ. Against the
        # old path at the new path's margin, only float rounding remains.
        rounding = 2.0**-22 * np.abs(old_flat).max()
        assert np.mean(gap <= rounding) >= share, (slack, np.mean(gap <= rounding))
        assert gap.max() <= STEPS * step * 1.01 + rounding, (slack, gap.max() / spacing)


def flat(arrays: list[np.ndarray]) -> np.ndarray:
    return np.concatenate([a.ravel() for a in arrays]).astype(np.float64)


def test_the_record_epsilon_of_pinned_events_is_unchanged() -> None:
    # Values of the commit before the tensor path (the accountant is untouched; these pin it).
    events = {
        RecordLevelEvent(0.1, 2.0, 5, "replace-one", 0.0): 2.9021155032398074,
        RecordLevelEvent(32 / 360, 1.0, 12, "add-remove", 1.0): 5.5766105512522275,
    }
    for event, epsilon in events.items():
        assert record_epsilon([event], 1e-5) == pytest.approx(epsilon, rel=1e-12)


def test_a_device_release_is_charged_the_epsilon_it_was_charged_before(tmp_path: Path) -> None:
    # The whole client path with the tensor clipping: plan, charge, train, the release check.
    policy = DevicePolicy.load({"partition-id": 0, "num-partitions": 4,
                                "ledger-dir": str(tmp_path), "mechanisms": "dpsgd"}, environ={})
    run = {**federation_defaults(), "task": "digits", "model": "logistic",
           "mechanism": "dpsgd", "batch-size": 8, "record-steps": 5,
           "record-sampling-rate": 0.1, "record-noise-multiplier": 2.0}

    def build() -> Task:
        return device_task(run, policy)

    task = DigitsTask(model="logistic")
    hypotheses = task.init_parameters(np.random.default_rng(0))
    released, _, metrics = GpflClient(build, run, policy).fit(
        hypotheses, {"num-hypotheses": 1, "server-round": 1})
    assert metrics["declined"] == 0 and len(released) == len(hypotheses)
    assert all(r.dtype == np.float32 and np.isfinite(r).all() for r in released)
    assert metrics["spend-record-epsilon"] == pytest.approx(2.9021155032398074, rel=1e-12)
    entries = PrivacyLedger(tmp_path / "client-0.json", delta=1e-5).entries()
    assert [e.event for e in entries] == [RecordLevelEvent(0.1, 2.0, 5, "replace-one", 0.0)]


def test_an_empty_batch_is_a_step_of_noise_alone(setting) -> None:
    # q tiny: every batch is empty, the step is the noise alone, and the release check passes
    # on its trace as on any other.
    task, params, data = setting
    training = RecordTraining("oso", split_noise("oso", NU), sampling_rate=1e-12, steps=2,
                              expected_batch=M, clip=CLIP, learning_rate=1.0)
    released, trace = train_record_level(task, params, data, training,
                                         np.random.default_rng(2))
    assert len(trace.noise_energy) == 2 and len(trace.clips) == 3
    assert all(np.isfinite(r).all() and r.dtype == np.float32 for r in released)
    assert not np.array_equal(flat(released), flat(params))


def test_the_benchmark_runs_both_epochs_through_the_production_function(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import tasks.dpsgd as dpsgd
    from experiments.benchmarks import bench_dpsgd

    calls: list[int] = []
    production = dpsgd.train_record_level

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return production(*args, **kwargs)

    monkeypatch.setattr(bench_dpsgd, "train_record_level", counted)
    (result,) = bench_dpsgd.benchmark(["fixed"], users=16, batch=32, repeats=1)
    assert calls == [1, 1]  # the warm-up and the timed epoch
    assert result.steps == 3 and result.records == 90
    assert result.ours > 0 and result.opacus > 0 and result.plain > 0
    assert "| fixed | 90 | 32 | 3 |" in bench_dpsgd.markdown([result])
