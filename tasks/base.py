"""The task contract: data partitioning, model, loss and local training.

A task knows how the data of one user (one Flower partition) is made or loaded, which model the
federation trains, how a model is scored on a user's data and how a user trains it locally. A
model travels as a list of float32 NumPy arrays (its layers); k hypotheses are k such lists.

Validation follows the paper's protocol (Eq. 15 of paper 001): each held-out user is scored with
the hypothesis that fits it best (lowest loss), and the reported loss is the mean of these
per-user losses. Classifiers report the accuracy of that same hypothesis, averaged over users.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import numpy as np

import settings
from settings import SETTINGS, Setting, SettingError
from settings.pairs import parse_pairs
from tasks.config import TaskDataError, TaskSettingsError, require_at_least
from tasks.partitions import SPLIT_CODES, UNLIMITED_USERS, resolve_users, user_seed
from tasks.training import Schedule, check_training_args, minibatches

__all__ = [
    "SPLIT_CODES",
    "UNLIMITED_USERS",
    "BestFit",
    "Dataset",
    "Params",
    "Schedule",
    "Task",
    "TaskDataError",
    "TaskSettingsError",
    "best_fits",
    "check_params",
    "check_training_args",
    "evaluate_best_hypothesis",
    "minibatches",
    "per_hypothesis",
    "resolve_users",
    "user_seed",
]

Params = list[np.ndarray]
"""One model: its layers as NumPy arrays (float32 on the wire)."""



@dataclass(frozen=True, eq=False)
class Dataset:
    """The data of one user.

    Attributes
    ----------
    x : np.ndarray
        Features; the first axis indexes samples.
    y : np.ndarray
        Targets (regression) or integer labels (classification), one per sample.
    group : np.ndarray
        int64, one per sample: the group the sample was generated from, as the task documents it
        (the synthetic task's optimum index, 1 for a rotated image, the fairness task's
        sensitive attribute S). -1 where the task has no notion of group.
    user : str
        Who holds the data, e.g. ``"train-3"``, ``"validation-0"``, a LEAF user id or a CMS
        provider id.
    """

    x: np.ndarray
    y: np.ndarray
    group: np.ndarray
    user: str

    def __post_init__(self) -> None:
        m = self.x.shape[0]
        if self.y.shape[0] != m or self.group.shape != (m,):
            raise ValueError(
                f"x, y and group must have one entry per sample, got shapes "
                f"x={self.x.shape}, y={self.y.shape}, group={self.group.shape}"
            )

    def __len__(self) -> int:
        return int(self.x.shape[0])


@dataclass(frozen=True)
class BestFit:
    """The hypothesis that fits one user best, and the user's metrics under it."""

    index: int
    metrics: dict[str, float]


class Task(ABC):
    """A learning task: data of every user, model, loss and local training.

    Subclasses set `name`, `is_classifier` and `run_config_keys`, and implement
    `parameter_shapes`, `init_parameters`, `client_dataset`, `validation_datasets`, `loss` and
    `_fit` (the training loop; `train` checks its arguments first). Classifiers override
    `user_metrics` to add ``"accuracy"``.

    A subclass's constructor argument named after a setting (``validation_users``:
    ``validation-users``) takes the default of `settings.schema` and is checked by it, so a bad
    value gets the same message from the constructor as from a run config.
    """

    name: str = ""
    is_classifier: bool = False
    #: The settings `from_run_config` reads, each passed to the constructor as the keyword
    #: argument of the same name with ``_`` for ``-`` (``validation-users``: ``validation_users``).
    run_config_keys: tuple[str, ...] = ()
    #: A plugin's own settings, declared as gpfl declares its own (`settings.Setting`: type,
    #: default, bounds, help; owner ``federation``). A run gives them in ``task-settings``
    #: (``"noise-level=0.2"``); each is checked here and passed to the constructor like
    #: `run_config_keys`. ``gpfl tasks`` lists them.
    settings: tuple[Setting, ...] = ()

    # The settings every task has, set by `_set_user_settings`.
    users: int
    validation_users: int
    data_seed: int

    @classmethod
    def from_run_config(cls, config: Mapping[str, Any]) -> Self:
        """Build the task from the run config's `run_config_keys`.

        Each key is read with `settings.read`, so an absent key takes its schema default and a
        bad value is reported as the run config spells it; the plugin's own `settings` are
        read from ``task-settings`` (`own_settings`).
        """
        return cls(
            **{key.replace("-", "_"): settings.read(config, key) for key in cls.run_config_keys},
            **{key.replace("-", "_"): value for key, value in cls.own_settings(config).items()},
        )

    @classmethod
    def own_settings(cls, config: Mapping[str, Any]) -> dict[str, Any]:
        """Return the plugin's own settings from the run config's ``task-settings``, checked.

        Every declared setting is present (its default where ``task-settings`` does not give
        it).

        Raises
        ------
        settings.SettingError
            For a key the task does not declare (naming those it does) or a bad value (naming
            the key, the value and what is allowed), or pairs that cannot be read.
        """
        text = settings.read(config, "task-settings")
        try:
            given = parse_pairs(text, "task-settings") if text else {}
        except ValueError as err:
            raise SettingError(str(err)) from None
        declared = {s.name: s for s in cls.settings}
        unknown = sorted(set(given) - set(declared))
        if unknown:
            known = ", ".join(sorted(declared)) or "none"
            raise SettingError(f"task-settings: task {cls.name!r} has no setting(s) "
                               f"{unknown}; its own settings: {known}")
        return {name: s.parse(given.get(name, s.default)) for name, s in declared.items()}

    @classmethod
    def declared_shapes(cls, config: Mapping[str, Any]) -> list[tuple[int, ...]] | None:
        """Return the model's layer shapes from the run config alone, or None if unknown.

        A device whose task reads its own file (``data-path``) charges a round before it
        builds the task (building may read the records), so it can refuse an instruction of
        the wrong shape before the charge only if the task class says its shapes here, from
        the run config and at most the file's metadata, never its records. ``None`` (the
        default) leaves the check to the charged path. Tasks that read a device file should
        override it; gpfl's own do.
        """
        return None

    def _set_user_settings(
        self, users: int, validation_users: int, data_seed: int, *, min_validation_users: int = 1
    ) -> None:
        """Check and set the settings ``users``, ``validation-users`` and ``data-seed``.

        The schema allows ``validation-users`` = 0 (the hospital task's "all of them"); the
        other tasks need at least one held-out user, hence ``min_validation_users``.
        """
        self.users = SETTINGS["users"].parse(users)
        self.validation_users = require_at_least(
            "validation-users", SETTINGS["validation-users"].parse(validation_users),
            min_validation_users, task=self.name,
        )
        self.data_seed = SETTINGS["data-seed"].parse(data_seed)

    # -- model ------------------------------------------------------------------------------
    @property
    @abstractmethod
    def parameter_shapes(self) -> list[tuple[int, ...]]:
        """Shapes of the model's layers, in wire order."""

    @property
    def num_parameters(self) -> int:
        """Number of scalar parameters of one model (one hypothesis)."""
        return sum(math.prod(shape) for shape in self.parameter_shapes)

    @abstractmethod
    def init_parameters(self, rng: np.random.Generator) -> Params:
        """Draw one model's initial parameters (float32 arrays) using ``rng`` alone."""

    def initial_hypotheses(self, k: int, rng: np.random.Generator) -> list[Params]:
        """Return ``k`` independently initialised models.

        Parameters
        ----------
        k : int
            Number of hypotheses, at least 1.
        rng : np.random.Generator
            The only source of randomness.

        Returns
        -------
        list[Params]
            ``k`` lists of float32 arrays shaped as `parameter_shapes`.
        """
        if isinstance(k, bool) or not isinstance(k, int | np.integer) or k < 1:
            raise ValueError(f"k must be a positive integer, got k={k!r}")
        return [self.init_parameters(rng) for _ in range(int(k))]

    # -- data -------------------------------------------------------------------------------
    @classmethod
    def preflight(cls, config: Mapping[str, Any], partition_id: int, num_partitions: int) -> None:
        """Check, before the round is charged, that this device's data can serve the run.

        The device calls it before it charges its ledger and before it builds the task, with
        the mapping `from_run_config` would receive (the run config and the device's own
        ``data-path`` and ``device``). It must be cheap and must not read the data's records:
        it may look only at what does not depend on their values — whether the device's file
        exists and can be opened, its format, its header or schema against the columns the
        run config names, and whether it (or this device's partition, where that follows
        from the row count alone) has any rows. Whether it raises is the one thing the server
        learns uncharged: the device declines the round (``declined-by = "task-data"``) with a
        fixed reason, and the message stays in the device's log.

        Anything that needs the records (a value that does not parse, a label not among the
        classes) is left to `client_dataset`, after the charge, where a failure reaches the
        server as the fixed failure text and the round stays charged.

        The default checks nothing (tasks that generate their data, plugins written before
        this method existed).

        Raises
        ------
        TaskDataError
            Naming the file, the setting and the column: the device declines the round. Any
            other exception is logged by the device and the round goes on (to the charge).
        """
        return None  # the default: nothing to check

    @abstractmethod
    def client_dataset(self, partition_id: int, num_partitions: int) -> Dataset:
        """Return the training data of the user on Flower partition ``partition_id``.

        One partition is one user. Raises `TaskSettingsError` (a ``ValueError``) naming
        ``users`` / ``num-partitions`` when the partition does not fit the task's settings.
        """

    def check_partition(self, partition_id: int, num_partitions: int) -> None:
        """Refuse a partition that the task's public settings do not fit; read no data.

        A device whose task reads no file of its own calls this before its round is charged,
        so that a run config whose ``users`` does not fit the device's partition is refused
        up front instead of charged and then failed in `client_dataset`. The default checks
        ``users`` against ``num-partitions``; a task that knows its count of training users
        from public values alone overrides it to check that count too. Checks that need the
        data stay in `client_dataset`.

        Raises
        ------
        TaskSettingsError
            Naming ``users`` / ``num-partitions`` / ``partition-id`` (public values only).
        """
        resolve_users(getattr(self, "users", 0), partition_id, num_partitions,
                      available=UNLIMITED_USERS)

    @abstractmethod
    def validation_datasets(self) -> list[Dataset]:
        """Return the data of the held-out validation users (who never train)."""

    # -- scoring ----------------------------------------------------------------------------
    @abstractmethod
    def loss(self, params: Params, data: Dataset) -> float:
        """Return the loss of the model ``params`` on ``data`` (lower is better)."""

    def predict(self, params: Params, x: np.ndarray) -> np.ndarray:
        """Return the model's outputs on ``x``: a classifier's logits, a regression's values.

        Raises
        ------
        NotImplementedError
            For a task that does not say how its model predicts.
        """
        raise NotImplementedError(f"task {self.name!r} does not implement predict")

    def user_metrics(self, params: Params, data: Dataset) -> dict[str, float]:
        """Return the metrics of ``params`` on one user's data; ``"loss"`` is always present."""
        return {"loss": self.loss(params, data)}

    @property
    def metric(self) -> str:
        """The task's headline metric: ``"accuracy"`` for a classifier, else ``"loss"``.

        The round lines, ``summary.json`` and the delivered models' manifest name it; higher
        is better for accuracy, lower for a loss (`metric_higher_is_better`).
        """
        return "accuracy" if self.is_classifier else "loss"

    @property
    def metric_higher_is_better(self) -> bool:
        """Whether a larger `metric` is better."""
        return self.metric != "loss"

    # -- delivered models -------------------------------------------------------------------
    #: How `save_model` writes a model: ``"numpy"`` (an ``.npz`` of the layers, in order).
    model_format = "numpy"
    #: The file suffix of that format.
    model_suffix = ".npz"

    def save_model(self, params: Params, path: Path) -> Path:
        """Write one model in the task's own format (NumPy: ``layer_0``, ``layer_1``, ...)."""
        self._check(params)
        layers: dict[str, Any] = {f"layer_{i}": np.asarray(a) for i, a in enumerate(params)}
        with open(path, "wb") as fh:
            np.savez(fh, **layers)
        return path

    def load_model(self, path: Path) -> Params:
        """Read a model that `save_model` wrote; its shapes must be this task's.

        Raises
        ------
        ValueError
            If the file holds other layers or shapes than the task's model.
        """
        with np.load(path, allow_pickle=False) as saved:
            names = sorted(saved.files, key=lambda n: int(n.split("_")[-1]))
            params = [np.asarray(saved[n]) for n in names]
        check_params(params, self.parameter_shapes)
        return params

    def model_settings(self) -> dict[str, Any]:
        """Return settings that rebuild this task's model where the run config does not say.

        The delivered models' manifest keeps them (the tabular task's feature columns as its
        patterns resolved); default: none.
        """
        return {}

    def class_names(self) -> list[str] | None:
        """Return the label of each output of a classifier where it has names (None: its index)."""
        return None

    def file_dataset(self, path: Path) -> Dataset:
        """Read a user's data from a file, for scoring and predicting with delivered models.

        The default reads an ``.npz`` with arrays ``x`` (features, the model's input shape per
        sample) and ``y`` (labels or targets); a task whose users hold files of another kind
        (the tabular task's CSV) overrides it.
        """
        with np.load(path, allow_pickle=False) as saved:
            missing = sorted({"x", "y"} - set(saved.files))
            if missing:
                raise TaskDataError(f"{path} must hold arrays x and y, lacks {missing}")
            x, y = np.asarray(saved["x"]), np.asarray(saved["y"])
        return Dataset(x=x, y=y, group=np.full(len(y), -1, dtype=np.int64), user=Path(path).name)

    def best_hypothesis(self, params_list: Sequence[Params], data: Dataset) -> int:
        """Return the index of the hypothesis with the lowest loss on ``data`` (first on ties)."""
        if len(params_list) == 0:
            raise ValueError("params_list must hold at least one hypothesis, got 0")
        losses = [self.loss(params, data) for params in params_list]
        return int(np.argmin(losses))

    def evaluate(
        self, params_list: Sequence[Params], datasets: Sequence[Dataset]
    ) -> dict[str, float]:
        """Score k hypotheses on users, each user with the hypothesis that fits it best.

        Parameters
        ----------
        params_list : Sequence[Params]
            The k hypotheses.
        datasets : Sequence[Dataset]
            One dataset per user (usually `validation_datasets`).

        Returns
        -------
        dict[str, float]
            ``"loss"``: mean over users of each user's lowest loss (the paper's Eq. 15 per
            user, then averaged); ``"accuracy"`` for classifiers: mean over users of the accuracy
            of that same hypothesis.
        """
        return evaluate_best_hypothesis(self.user_metrics, params_list, datasets)

    # -- training ---------------------------------------------------------------------------
    def train(
        self,
        params: Params,
        data: Dataset,
        *,
        epochs: int,
        learning_rate: float,
        batch_size: int,
        rng: np.random.Generator,
        device: str = "auto",
    ) -> Params:
        """Train ``params`` locally and return the new parameters.

        Mini-batch SGD: ``epochs`` passes over ``data``, each shuffled with ``rng`` and cut into
        batches of ``batch_size`` (the last one may be smaller), step ``learning_rate``.
        Returns float32 arrays shaped like ``params``; ``params`` is not modified.

        Raises
        ------
        ValueError
            Naming the argument, if ``params`` does not fit the model or a training argument
            is out of range (checked here, before the task's `_fit` runs).
        """
        self._check(params)
        check_training_args(epochs, learning_rate, batch_size)
        return self._fit(params, data, Schedule(epochs, learning_rate, batch_size, rng), device)

    @abstractmethod
    def _fit(self, params: Params, data: Dataset, schedule: Schedule, device: str) -> Params:
        """Run the task's training loop over ``schedule.batches(len(data))`` (arguments checked).

        ``device`` is the setting ``device`` (the NumPy tasks ignore it).
        """

    # -- helpers for subclasses --------------------------------------------------------------
    def _check(self, params: Params) -> None:
        check_params(params, self.parameter_shapes)


def check_params(params: Sequence[np.ndarray], shapes: Sequence[tuple[int, ...]]) -> None:
    """Raise ``ValueError`` unless ``params`` has one finite array per shape in ``shapes``."""
    if len(params) != len(shapes):
        raise ValueError(f"params must have {len(shapes)} layers, got {len(params)}")
    for i, (array, shape) in enumerate(zip(params, shapes, strict=True)):
        if tuple(np.shape(array)) != tuple(shape):
            raise ValueError(
                f"params layer {i} must have shape {tuple(shape)}, got {tuple(np.shape(array))}"
            )


def best_fits(
    metrics_fn: Callable[[Params, Dataset], Mapping[str, float]],
    params_list: Sequence[Params],
    datasets: Sequence[Dataset],
) -> list[BestFit]:
    """For each user, the hypothesis with the lowest ``"loss"`` and the user's metrics under it.

    Ties go to the lowest index.
    """
    if len(params_list) == 0:
        raise ValueError("params_list must hold at least one hypothesis, got 0")
    if len(datasets) == 0:
        raise ValueError("datasets must hold at least one user, got 0")
    fits = []
    for data in datasets:
        scored = [dict(metrics_fn(params, data)) for params in params_list]
        losses = [m["loss"] for m in scored]
        # NaN losses (a diverged hypothesis) never win unless all are NaN.
        finite = [v if math.isfinite(v) else math.inf for v in losses]
        j = int(np.argmin(finite))
        fits.append(BestFit(index=j, metrics=scored[j]))
    return fits


def evaluate_best_hypothesis(
    metrics_fn: Callable[[Params, Dataset], Mapping[str, float]],
    params_list: Sequence[Params],
    datasets: Sequence[Dataset],
) -> dict[str, float]:
    """Mean over users of each user's metrics under its best hypothesis (see `best_fits`).

    Adds `per_hypothesis`: how many users each hypothesis serves and their mean metrics.
    """
    fits = best_fits(metrics_fn, params_list, datasets)
    keys = fits[0].metrics.keys()
    return {**{key: float(np.mean([fit.metrics[key] for fit in fits])) for key in keys},
            **per_hypothesis(fits, len(params_list), keys)}


def per_hypothesis(fits: Sequence[BestFit], k: int, keys: Iterable[str]) -> dict[str, float]:
    """Each hypothesis's users and the mean of their ``keys`` under it, as flat entries.

    ``hypothesis_<j>_users`` (how many validation users it fits best) and, where it serves
    any, ``hypothesis_<j>_<key>``: flat floats, so that they travel where Flower's metrics do.
    """
    out: dict[str, float] = {}
    listed = list(keys)
    for j in range(k):
        served = [fit.metrics for fit in fits if fit.index == j]
        out[f"hypothesis_{j}_users"] = float(len(served))
        for key in listed if served else []:
            out[f"hypothesis_{j}_{key}"] = float(np.mean([m[key] for m in served]))
    return out
