"""Shared machinery of the torch tasks: parameter conversion, seeded init, train and score loops.

Importing this module imports torch; only the torch tasks (digits, femnist, hospital) do.
"""

from __future__ import annotations

import math
from abc import abstractmethod
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from settings import SETTINGS
from tasks.base import Dataset, Params, Schedule, Task, check_params
from tasks.device import configure_torch_threads, resolve_device

__all__ = [
    "TorchTask",
    "count_parameters",
    "draw_rotation",
    "from_arrays",
    "image_dataset",
    "rmse_loss",
    "seeded_module",
    "table3_cnn",
    "to_arrays",
]


def to_arrays(module: nn.Module) -> Params:
    """Return the module's ``state_dict`` as float32 NumPy arrays, in ``state_dict`` order."""
    return [
        tensor.detach().to("cpu", torch.float32).numpy().copy()
        for tensor in module.state_dict().values()
    ]


def from_arrays(module: nn.Module, arrays: Sequence[np.ndarray]) -> nn.Module:
    """Copy ``arrays`` (``state_dict`` order) into ``module`` in place and return it.

    Raises
    ------
    ValueError
        If the number of arrays or a shape does not match the module.
    """
    state = module.state_dict()
    check_params(list(arrays), [tuple(t.shape) for t in state.values()])
    with torch.no_grad():
        for target, array in zip(state.values(), arrays, strict=True):
            target.copy_(torch.as_tensor(_writable(np.asarray(array)), dtype=target.dtype))
    return module


def _writable(array: np.ndarray) -> np.ndarray:
    # torch warns on read-only NumPy memory (Flower's arrays are np.frombuffer views).
    return array if array.flags.writeable else array.copy()


def seeded_module(build: Callable[[], nn.Module], seed: int) -> nn.Module:
    """Build a module with torch's default init from ``seed``; global RNGs stay untouched."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()


def table3_cnn(image_size: int, num_classes: int, kernel_size: int = 2) -> nn.Sequential:
    """Build the CNN of Table 3 of paper 001 for square one-channel ``image_size`` inputs.

    Conv(1→32, k) ReLU, Conv(32→64, k) ReLU, MaxPool(2), Flatten, Linear(→128) ReLU,
    Linear(128→num_classes). Table 3 also lists a ReLU after the pooling (a no-op on ReLU
    outputs) and on the last layer; the last layer gives logits for the cross-entropy, so it has
    none here.
    """
    side = (image_size - 2 * (kernel_size - 1)) // 2
    if side < 1:
        raise ValueError(f"image_size={image_size} is too small for kernel_size={kernel_size}")
    return nn.Sequential(
        nn.Conv2d(1, 32, kernel_size),
        nn.ReLU(),
        nn.Conv2d(32, 64, kernel_size),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(64 * side * side, 128),
        nn.ReLU(),
        nn.Linear(128, num_classes),
    )


def draw_rotation(seed: np.random.SeedSequence, probability: float) -> bool:
    """Whether a user's images are rotated: one uniform draw from the user's own ``seed``.

    The digits and FEMNIST tasks rotate all or none of a user's images (paper 001's protocol),
    so the draw is made once per user, from a seed of `tasks.base.user_seed`.
    """
    return bool(np.random.default_rng(seed).random() < probability)


def image_dataset(images: np.ndarray, labels: np.ndarray, *, rotated: bool, user: str) -> Dataset:
    """One user's square one-channel images as the CNN takes them.

    Parameters
    ----------
    images : np.ndarray
        Shape (m, side, side).
    labels : np.ndarray
        One label per image.
    rotated : bool
        Rotate every image 90° counter-clockwise (as paper 001 does); ``group`` is 1 then, else 0.
    user : str
        The user's name.

    Returns
    -------
    Dataset
        ``x`` float32 (m, 1, side, side), C-contiguous.
    """
    x = np.rot90(images, k=1, axes=(1, 2)) if rotated else images
    return Dataset(
        x=np.ascontiguousarray(x[:, None, :, :], dtype=np.float32),
        y=labels,
        group=np.full(images.shape[0], int(rotated), dtype=np.int64),
        user=user,
    )


def rmse_loss(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """sqrt(mean squared error), with a zero (not NaN) gradient when the error is exactly 0."""
    mse = torch.mean(torch.square(prediction - target))
    # clamp_min passes no gradient below the floor, so d sqrt / d mse never meets 0 * inf.
    return torch.sqrt(mse.clamp_min(torch.finfo(mse.dtype).tiny))


class TorchTask(Task):
    """A task whose model is a torch module; subclasses provide `model` and the data.

    Parameters
    ----------
    device : str
        The setting ``device``: where `loss`, `user_metrics` and `evaluate` run (``"auto"``,
        ``"cpu"``, ``"cuda"``); `train` takes its own ``device``.
    """

    objective: Literal["cross-entropy", "rmse"] = "cross-entropy"

    def __init__(self, *, device: str = SETTINGS["device"].default) -> None:
        configure_torch_threads()
        # Only the spelling: whether CUDA exists is checked where the device is used.
        self.device: str = SETTINGS["device"].parse(device)
        self._modules: dict[str, nn.Module] = {}
        self._shapes: list[tuple[int, ...]] | None = None

    @abstractmethod
    def model(self) -> nn.Module:
        """Build a fresh, randomly initialised model (torch's default init)."""

    # -- model ------------------------------------------------------------------------------
    @property
    def parameter_shapes(self) -> list[tuple[int, ...]]:
        """Shapes of the model's ``state_dict`` entries, in order."""
        if self._shapes is None:
            self._shapes = [tuple(t.shape) for t in self.model().state_dict().values()]
        return list(self._shapes)

    def init_parameters(self, rng: np.random.Generator) -> Params:
        """Torch's default init of `model`, seeded by a draw from ``rng``."""
        seed = int(rng.integers(0, 2**63 - 1))
        return to_arrays(seeded_module(self.model, seed))

    def _module(self, device: torch.device, params: Params) -> nn.Module:
        # One module per device per task object, reused: building the CNN costs more than
        # copying the parameters in.
        key = str(device)
        module = self._modules.get(key)
        if module is None:
            module = self.model().to(device)
            self._modules[key] = module
        return from_arrays(module, params)

    def _tensors(self, data: Dataset, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.as_tensor(_writable(np.asarray(data.x, dtype=np.float32)), device=device)
        dtype = np.int64 if self.is_classifier else np.float32
        y = torch.as_tensor(_writable(np.asarray(data.y, dtype=dtype)), device=device)
        return x, y

    def _objective(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if self.objective == "cross-entropy":
            return F.cross_entropy(output, target)
        if self.is_classifier:
            # RMSE for a classifier (001 Table 2's second column): between the predicted class
            # probabilities and the one-hot labels.
            one_hot = F.one_hot(target, num_classes=output.shape[1]).to(output.dtype)
            return rmse_loss(torch.softmax(output, dim=1), one_hot)
        return rmse_loss(output.reshape(target.shape), target)

    # -- scoring ----------------------------------------------------------------------------
    def user_metrics(self, params: Params, data: Dataset) -> dict[str, float]:
        """``"loss"`` (mean cross-entropy or RMSE) and, for classifiers, ``"accuracy"``."""
        self._check(params)
        if len(data) == 0:
            raise ValueError(f"user {data.user!r} has no samples")
        device = resolve_device(self.device)
        module = self._module(device, params)
        module.eval()
        x, y = self._tensors(data, device)
        with torch.no_grad():
            output = module(x)
            metrics = {"loss": float(self._objective(output, y))}
            if self.is_classifier:
                metrics["accuracy"] = float((output.argmax(dim=1) == y).float().mean())
        return metrics

    def loss(self, params: Params, data: Dataset) -> float:
        """Mean cross-entropy (classifiers) or RMSE (regression) of ``params`` on ``data``."""
        return self.user_metrics(params, data)["loss"]

    def predict(self, params: Params, x: np.ndarray) -> np.ndarray:
        """Model outputs (logits, or predictions of a regression) on ``x`` as a NumPy array."""
        self._check(params)
        device = resolve_device(self.device)
        module = self._module(device, params)
        module.eval()
        with torch.no_grad():
            output = module(
                torch.as_tensor(_writable(np.asarray(x, dtype=np.float32)), device=device)
            )
        return output.to("cpu").numpy()

    # -- delivered models -------------------------------------------------------------------
    model_format = "torch"
    model_suffix = ".pt"

    def save_model(self, params: Params, path: Path) -> Path:
        """Write one model as the module's ``state_dict`` (``torch.save``; load it into `model`).

        ``task.model().load_state_dict(torch.load(path, weights_only=True))`` gives the torch
        module, as any PyTorch user loads one.
        """
        self._check(params)
        names = list(self.model().state_dict())
        state = {name: torch.from_numpy(np.array(a, copy=True))
                 for name, a in zip(names, params, strict=True)}
        torch.save(state, path)
        return path

    def load_model(self, path: Path) -> Params:
        """Read a ``state_dict`` that `save_model` wrote, as the task's layers in order.

        Raises
        ------
        ValueError
            If the file's entries are not the model's (names or shapes).
        """
        state = torch.load(path, map_location="cpu", weights_only=True)
        names = list(self.model().state_dict())
        if not isinstance(state, dict) or list(state) != names:
            found = list(state) if isinstance(state, dict) else type(state).__name__
            raise ValueError(f"{path} holds {found}, not the entries of this task's model "
                             f"({names})")
        params = [state[name].numpy() for name in names]
        check_params(params, self.parameter_shapes)
        return params

    # -- training ---------------------------------------------------------------------------
    def _fit(self, params: Params, data: Dataset, schedule: Schedule, device: str) -> Params:
        """Plain SGD (no momentum, no weight decay) on ``device``.

        The model and the whole dataset move to the device once per call; the batches are index
        slices on the device. Shuffling uses ``schedule.rng`` alone; the models have no dropout,
        so no torch RNG is involved and torch's global seed is left alone.
        """
        target = resolve_device(device)
        module = self._module(target, params)
        module.train()
        x, y = self._tensors(data, target)
        optimizer = torch.optim.SGD(module.parameters(), lr=float(schedule.learning_rate))
        for batch in schedule.batches(len(data)):
            index = torch.as_tensor(batch, device=target)
            optimizer.zero_grad(set_to_none=True)
            loss = self._objective(module(x[index]), y[index])
            loss.backward()
            optimizer.step()
        return to_arrays(module)


def count_parameters(module: nn.Module) -> int:
    """Count the scalars in the module's ``state_dict``."""
    return sum(math.prod(t.shape) for t in module.state_dict().values())
