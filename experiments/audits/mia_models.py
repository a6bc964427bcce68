"""The models a membership-inference audit attacks: trained and released by gpfl's own client.

Every model, target and shadow alike, is one device's release after one round: a
:class:`client.numpy_client.GpflClient` (the ClientApp's client, called in process) receives
one hypothesis (the same seeded initialisation for all), loads its local data set, trains it
with the task's own SGD, charges its ledger and sanitizes with the requested mechanism. The
only thing replaced is where the local data set comes from: :class:`MemberData` hands the
client the records the audit chose as members, so that membership is known.

Two offline tasks:

* ``digits``: scikit-learn's 1797 8×8 digits (`tasks.digits.DigitsTask`, the Table 3 CNN,
  83,562 parameters, upright images only);
* ``breast-cancer``: scikit-learn's Wisconsin breast-cancer table (569 records, 30 features,
  standardised), with a two-layer perceptron (:class:`BreastCancerTask`, 30·64 + 64 + 64·2 + 2
  = 2,114 parameters), a small tabular model that can memorise its training records.

:func:`per_record_loss` and :func:`neighbour_confidence` score records: the second runs the
model with Gaussian noise added to the output of its first layer (thesis 004 eq. 4.6), the
noisy-neighbour calibration.
"""

from __future__ import annotations

import functools
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from client.numpy_client import GpflClient
from client.policy import DevicePolicy
from experiments.core.common import experiment_policy
from settings import federation_defaults
from tasks.base import Dataset, Params, Task
from tasks.digits import DigitsTask
from tasks.torch_support import TorchTask, from_arrays, image_dataset

__all__ = ["TASKS", "BreastCancerTask", "MemberData", "Pool", "TrainingPlan",
           "first_layer_scale", "logit_confidence", "neighbour_confidence", "per_record_loss",
           "pool", "release"]


class BreastCancerTask(TorchTask):
    """Binary classification of scikit-learn's breast-cancer table with a small MLP.

    Used by the membership-inference audit only; its data come from the audit (`MemberData`),
    so it has no users of its own.
    """

    name = "breast-cancer"
    is_classifier = True

    def __init__(self) -> None:
        super().__init__(device="cpu")

    def model(self) -> nn.Module:
        """Build the 30-64-2 perceptron."""
        return nn.Sequential(nn.Linear(30, 64), nn.ReLU(), nn.Linear(64, 2))

    def client_dataset(self, partition_id: int, num_partitions: int) -> Dataset:
        """Refuse: the audit hands the client its data (`MemberData`)."""
        raise NotImplementedError("breast-cancer has data only through the audit")

    def validation_datasets(self) -> list[Dataset]:
        """Return no held-out users."""
        return []


class MemberData:
    """A task whose every client holds ``data``: the members the audit chose.

    Everything else (model, loss, training) is the wrapped task's.
    """

    def __init__(self, task: Task, data: Dataset) -> None:
        self._task, self._data = task, data

    def client_dataset(self, partition_id: int, num_partitions: int) -> Dataset:
        """Return the members, whatever the partition."""
        return self._data

    def check_partition(self, partition_id: int, num_partitions: int) -> None:
        """Accept any partition: each holds the members, whatever the wrapped task's ``users``."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self._task, name)


@dataclass(frozen=True)
class Pool:
    """All records of a task: candidates for membership and the shadows' data alike."""

    task: TorchTask
    x: np.ndarray
    y: np.ndarray

    def __len__(self) -> int:
        return int(self.y.shape[0])

    def subset(self, index: np.ndarray, user: str) -> Dataset:
        """Return the records at ``index`` as one user's data set."""
        return Dataset(self.x[index], self.y[index],
                       np.zeros(index.size, dtype=np.int64), user)


@functools.cache
def pool(name: str) -> Pool:
    """Return the task ``name`` (``digits`` or ``breast-cancer``) and every one of its records."""
    if name == "digits":
        from sklearn.datasets import load_digits

        bunch = load_digits()
        images = np.asarray(bunch.images, dtype=np.float32) / np.float32(16.0)
        data = image_dataset(images, np.asarray(bunch.target, np.int64), rotated=False,
                             user="pool")
        task: TorchTask = DigitsTask(users=2, validation_users=1, rotate_probability=0.0,
                                     device="cpu")
        return Pool(task, data.x, data.y)
    if name == "breast-cancer":
        from sklearn.datasets import load_breast_cancer

        bunch = load_breast_cancer()
        x = np.asarray(bunch.data, dtype=np.float64)
        # Standardised with the whole table's statistics: public knowledge about the population.
        x = ((x - x.mean(axis=0)) / x.std(axis=0)).astype(np.float32)
        return Pool(BreastCancerTask(), x, np.asarray(bunch.target, np.int64))
    raise ValueError(f"task must be one of {TASKS}, got task={name!r}")


TASKS = ("digits", "breast-cancer")


@dataclass(frozen=True)
class TrainingPlan:
    """How a device trains and releases (the run config's request)."""

    epochs: int
    learning_rate: float
    batch_size: int
    mechanism: str = "none"
    noise_multiplier: float = 1.0
    epsilon: float = 1.0

    def run_config(self, seed: int) -> dict[str, Any]:
        """Return the run config a server would send for this plan."""
        return {**federation_defaults(), "mechanism": self.mechanism,
                "calibration": "neighbourhood", "noise-multiplier": self.noise_multiplier,
                "epsilon": self.epsilon, "planned-releases": 1, "clip": 1.0,
                "local-epochs": self.epochs, "learning-rate": self.learning_rate,
                "batch-size": self.batch_size, "seed": seed}


def release(p: Pool, members: np.ndarray, plan: TrainingPlan, *, seed: int,
            ledger_dir: Path | None = None) -> Params:
    """One device's release after training on ``members`` from a seeded initialisation.

    The client is gpfl's own, with the experiments' device policy (every mechanism allowed,
    noise seeded by ``seed`` so that reruns agree); its ledger lives in a temporary folder.
    """
    run = plan.run_config(seed)
    with tempfile.TemporaryDirectory() as folder:
        node = {**experiment_policy(run), "partition-id": 0, "num-partitions": 1,
                "ledger-dir": str(ledger_dir or folder)}
        policy = DevicePolicy.load(node, environ={})
        task = cast(Task, MemberData(p.task, p.subset(members, "member")))
        client = GpflClient(task, run, policy)
        # The same initial hypothesis for every model of a seed: the server's, public.
        theta = p.task.init_parameters(np.random.default_rng(np.random.SeedSequence([seed, 7])))
        released, _, metrics = client.fit(theta, {"num-hypotheses": 1, "server-round": 1})
    if metrics.get("declined"):
        raise RuntimeError(f"the client declined: {metrics.get('decline-reason')}")
    return released


def _module(p: Pool, params: Params) -> nn.Sequential:
    module = from_arrays(p.task.model(), params)
    module.eval()
    return cast(nn.Sequential, module)


def per_record_loss(p: Pool, params: Params, index: np.ndarray) -> np.ndarray:
    """Cross-entropy of each record at ``index`` under the model ``params``."""
    module = _module(p, params)
    with torch.no_grad():
        out = module(torch.as_tensor(p.x[index]))
        return F.cross_entropy(out, torch.as_tensor(p.y[index]), reduction="none").numpy()


def logit_confidence(loss: np.ndarray) -> np.ndarray:
    """φ = log(p / (1 − p)) of the true label's probability p = exp(−loss) (Carlini et al.).

    A decreasing function of the loss that spreads the near-zero losses of confident records
    apart, so that differences between models (or neighbours) are comparable across records.
    """
    loss = np.maximum(np.asarray(loss, dtype=np.float64), 1e-30)
    return -loss - np.log(-np.expm1(-loss))


def neighbour_confidence(p: Pool, params: Params, index: np.ndarray, sigmas: Sequence[float],
                         *, neighbours: int, rng: np.random.Generator) -> np.ndarray:
    """Mean `logit_confidence` of ``neighbours`` noisy neighbours of each record, for each σ.

    A neighbour is the record with N(0, σ²) added to the output of the model's first layer
    (thesis 004 eq. 4.6). Returns shape (len(sigmas), len(index)).
    """
    module = _module(p, params)
    first, rest = module[0], module[1:]
    y = torch.as_tensor(p.y[index])
    out = np.empty((len(sigmas), index.size))
    with torch.no_grad():
        hidden = first(torch.as_tensor(p.x[index]))
        for i, sigma in enumerate(sigmas):
            total = np.zeros(index.size)
            for _ in range(neighbours):
                noise = torch.as_tensor(rng.standard_normal(tuple(hidden.shape)),
                                        dtype=hidden.dtype)
                loss = F.cross_entropy(rest(hidden + sigma * noise), y, reduction="none")
                total += logit_confidence(loss.numpy())
            out[i] = total / neighbours
    return out


def first_layer_scale(p: Pool, params: Params, index: np.ndarray) -> float:
    """Return the std of the first layer's output over the records: σ's natural unit."""
    module = _module(p, params)
    with torch.no_grad():
        return float(module[0](torch.as_tensor(p.x[index])).std())
