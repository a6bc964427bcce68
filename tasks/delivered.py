"""The models a run delivers: files in the task's own format, a manifest, and loading them back.

When a run ends, the ServerApp writes its delivered hypotheses (those of the best validation
round) into ``<run>/models/``: one file per hypothesis in the task's format (a torch
``state_dict``, ``hypothesis-<j>.pt``, for the torch tasks; ``hypothesis-<j>.npz`` of NumPy arrays
otherwise) and ``models.json``, which names the task and the settings that rebuild its model,
the task's metric and, per hypothesis, how many validation users it fit best and their metrics.

:func:`load_delivered` reads them back as a :class:`Delivered`: the task, the hypotheses, and the
method's own use of them. As in validation (paper 001, Eq. 15), a user's data is served by the
hypothesis with the lowest loss on it (:meth:`Delivered.assign`); :meth:`Delivered.predict` gives
that hypothesis's outputs. ``gpfl predict RUN --data FILE`` is the command-line form.

The files hold released information only: each hypothesis is the server's aggregate of
sanitized releases, which the server (and whoever starts the run) sees anyway.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tasks.base import Dataset, Params, Task

__all__ = ["MANIFEST", "MODELS_DIR", "Delivered", "Fit", "load_delivered", "validation_of",
           "write_delivered"]

#: The folder of a run that holds the delivered models.
MODELS_DIR = "models"
#: The manifest inside it.
MANIFEST = "models.json"


def validation_of(metrics: Mapping[str, Any], k: int) -> list[dict[str, float]]:
    """Return each hypothesis's validation entry from one round's flat ``val_metrics``.

    `tasks.base.per_hypothesis` writes ``hypothesis_<j>_users`` and ``hypothesis_<j>_<key>``;
    this gathers them per hypothesis (``users`` and each key). Empty entries where the round
    was not validated.
    """
    out: list[dict[str, float]] = []
    for j in range(k):
        prefix = f"hypothesis_{j}_"
        out.append({key.removeprefix(prefix): float(value) for key, value in metrics.items()
                    if key.startswith(prefix)})
    return out


def write_delivered(out_dir: Path, task: Task, task_config: Mapping[str, Any],
                    hypotheses: Sequence[Params], *, best_round: int | None,
                    validation: Sequence[Mapping[str, float]]) -> Path:
    """Write the delivered hypotheses and their manifest under ``out_dir/models``.

    Parameters
    ----------
    out_dir : Path
        The run's folder.
    task : Task
        The run's task: it writes each model in its own format.
    task_config : Mapping
        The settings that rebuild the task (`load_delivered` passes them to
        `tasks.load_task`); no data path is kept (the loader reads the user's own file).
    hypotheses : sequence of Params
        The delivered hypotheses.
    best_round : int or None
        The round they are from (None: never validated; the last ones).
    validation : sequence of mapping
        Per hypothesis, its validation users and metrics in that round (`validation_of`).

    Returns
    -------
    Path
        The manifest's path.
    """
    folder = Path(out_dir) / MODELS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    entries = []
    for j, params in enumerate(hypotheses):
        name = f"hypothesis-{j}{task.model_suffix}"
        task.save_model(params, folder / name)
        entries.append({"hypothesis": j, "file": name,
                        "validation": dict(validation[j]) if j < len(validation) else {}})
    config = {key: value for key, value in {**task_config, **task.model_settings()}.items()
              if key not in ("data-path", "server-data-path")}
    manifest = {
        "task": task.name,
        "task_config": config,
        "format": task.model_format,
        "metric": task.metric,
        "metric_higher_is_better": task.metric_higher_is_better,
        "num_parameters": task.num_parameters,
        "best_round": best_round,
        "models": entries,
    }
    path = folder / MANIFEST
    temporary = path.with_suffix(".json.tmp")
    temporary.write_text(json.dumps(manifest, indent=2, default=_plain) + "\n", encoding="utf-8")
    temporary.replace(path)
    return path


def _plain(value: Any) -> Any:
    return value.item() if hasattr(value, "item") else str(value)


@dataclass(frozen=True)
class Fit:
    """How the delivered hypotheses fit one user's data.

    Attributes
    ----------
    hypothesis : int
        The hypothesis with the lowest loss (the method's choice).
    metrics : list of dict
        Each hypothesis's metrics on the data (``loss``, and ``accuracy`` for a classifier).
    """

    hypothesis: int
    metrics: list[dict[str, float]]


@dataclass(frozen=True)
class Delivered:
    """A run's delivered models, loaded: the task, its hypotheses and the manifest.

    Attributes
    ----------
    task : Task
        The run's task, rebuilt from the manifest's settings.
    hypotheses : list of Params
        The delivered hypotheses, in order.
    manifest : dict
        ``models.json`` as written.
    """

    task: Task
    hypotheses: list[Params]
    manifest: dict[str, Any]

    @property
    def metric(self) -> str:
        """The task's headline metric (``accuracy`` for a classifier, else ``loss``)."""
        return str(self.manifest["metric"])

    def fit(self, data: Dataset) -> Fit:
        """Score every hypothesis on one user's data and name the one with the lowest loss."""
        metrics = [dict(self.task.user_metrics(params, data)) for params in self.hypotheses]
        losses = [m["loss"] if np.isfinite(m["loss"]) else np.inf for m in metrics]
        return Fit(hypothesis=int(np.argmin(losses)), metrics=metrics)

    def evaluate(self, datasets: Sequence[Dataset]) -> dict[str, float]:
        """Score users' data as validation does: each user by the hypothesis that fits it best.

        The task's `tasks.base.Task.evaluate`: the mean over users of the loss and metric, and
        each hypothesis's users and their metrics.
        """
        return self.task.evaluate(self.hypotheses, datasets)

    def assign(self, data: Dataset) -> int:
        """Return the hypothesis that fits ``data`` best (lowest loss), as validation does."""
        return self.fit(data).hypothesis

    def predict(self, x: np.ndarray, hypothesis: int) -> np.ndarray:
        """Return the outputs of one hypothesis on ``x``: logits of a classifier, else values."""
        if not 0 <= hypothesis < len(self.hypotheses):
            raise ValueError(f"hypothesis must be in [0, {len(self.hypotheses) - 1}], got "
                             f"{hypothesis}")
        return np.asarray(self.task.predict(self.hypotheses[hypothesis], x))

    def predict_labels(self, x: np.ndarray, hypothesis: int) -> list[Any]:
        """Return a classifier's predicted label per sample (its name where the task has one)."""
        if not self.task.is_classifier:
            raise ValueError(f"task {self.task.name!r} is not a classifier: use predict")
        outputs = self.predict(x, hypothesis)
        index = (outputs >= 0).astype(int).ravel() if outputs.ndim == 1 or outputs.shape[
            1] == 1 else outputs.argmax(axis=1)
        names = self.task.class_names()
        return [names[i] for i in index] if names is not None else [int(i) for i in index]


def load_delivered(run_dir: Path | str) -> Delivered:
    """Load a run's delivered models (``<run_dir>/models``) with the task that reads them.

    Raises
    ------
    FileNotFoundError
        If the run wrote no models (it ended before its first round, or predates them).
    ValueError
        If a model file does not hold the task's layers.
    """
    from tasks import load_task  # the registry imports every built-in task's module lazily

    folder = Path(run_dir) / MODELS_DIR
    path = folder / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: the run delivered no models (a run "
                                "writes them when it ends)")
    manifest = json.loads(path.read_text(encoding="utf-8"))
    task = load_task({**manifest["task_config"], "task": manifest["task"]})
    hypotheses = [task.load_model(folder / entry["file"]) for entry in manifest["models"]]
    return Delivered(task=task, hypotheses=hypotheses, manifest=manifest)
