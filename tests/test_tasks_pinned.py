"""Pinned numbers: each task's data split, initial models, training and scores with fixed seeds.

The values were computed before the tasks shared their helpers (tasks/base.py,
tasks/torch_support.py) and must not move: a refactoring that changes the order of random draws,
a dtype or a loss changes them far beyond the tolerance. The tolerance (rtol 1e-5) leaves room
only for floating-point differences between BLAS builds and CPUs.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
import test_tasks_femnist
import test_tasks_hospital

import tasks
from tasks.base import Task

# The LEAF and CMS fixtures of the tasks' own test modules, shared rather than rebuilt.
leaf_dir = test_tasks_femnist.leaf_dir
cms_csv = test_tasks_hospital.cms_csv


def _checksum(arrays: Sequence[np.ndarray]) -> float:
    """A position-sensitive sum: moving, reordering or changing any value changes it."""
    flat = np.concatenate([np.asarray(a, dtype=np.float64).ravel() for a in arrays])
    return float(flat @ np.cos(np.arange(flat.size)))


def _fingerprint(task: Task, num_partitions: int, learning_rate: float) -> dict[str, float]:
    data = task.client_dataset(num_partitions - 1, num_partitions)
    validation = task.validation_datasets()
    rng = np.random.default_rng(2026)
    hypotheses = task.initial_hypotheses(2, rng)
    trained = task.train(
        hypotheses[0], data, epochs=2, learning_rate=learning_rate, batch_size=3, rng=rng,
        device="cpu",
    )
    scores = task.evaluate([*hypotheses, trained], validation)
    return {
        "x": _checksum([data.x]),
        "y": _checksum([data.y]),
        "group": _checksum([data.group]),
        "validation-x": _checksum([v.x for v in validation]),
        "validation-y": _checksum([v.y for v in validation]),
        "validation-group": _checksum([v.group for v in validation]),
        "init": _checksum([a for h in hypotheses for a in h]),
        "trained": _checksum(trained),
        "loss": task.loss(trained, data),
        # The headline scores; each hypothesis's own (from the same per-user fits) are checked
        # in tests/test_delivered.py.
        **{f"evaluate-{key}": value for key, value in scores.items()
           if not key.startswith("hypothesis_")},
    }


PINNED: dict[str, dict[str, float]] = {
    "synthetic": {
        "x": -5.143143681244044,
        "y": -6.307601737165445,
        "group": -0.4130220484678551,
        "validation-x": 1.4684933806272276,
        "validation-y": 31.62979675709284,
        "validation-group": -0.12789249155144278,
        "init": -1.2557946066887804,
        "trained": -0.5197655222806036,
        "loss": 5.285128364457733,
        "evaluate-loss": 7.617091050943642,
    },
    "fairness": {
        "x": -5.143143681244044,
        "y": 1.8843934114614247,
        "group": -0.4130220484678551,
        "validation-x": -0.005161947270811762,
        "validation-y": 3.8952972697612394,
        "validation-group": 0.11693180738393483,
        "init": -1.7558547262769215,
        "trained": 0.21346442606662608,
        "loss": 0.9702814118067131,
        "evaluate-loss": 0.4689235924383577,
        "evaluate-accuracy": 0.85,
        "evaluate-equal-opportunity-difference": 0.33333333333333337,
        "evaluate-equalized-odds-difference": 0.33333333333333337,
        "evaluate-demographic-parity-difference": 0.0,
    },
    "digits-logistic": {
        "x": -31.479758653324375,
        "y": -2.6057829625669315,
        "group": 0.0,
        "validation-x": 7.05728929237367,
        "validation-y": 15.763868601651183,
        "validation-group": 0.0,
        "init": 1.171444127090918,
        "trained": 5.010112495230191,
        "loss": 1.2201884984970093,
        "evaluate-loss": 1.3192163308461506,
        "evaluate-accuracy": 0.7243230740229288,
    },
    "digits-cnn-dirichlet-parity": {
        "x": 16.279631939654493,
        "y": -6.194188224175398,
        "group": 0.0,
        "validation-x": -31.502256290261826,
        "validation-y": 5.462025912979317,
        "validation-group": 1.0191824144845736,
        "init": -8.101294929661826,
        "trained": -0.8222077074127792,
        "loss": 0.42116641998291016,
        "evaluate-loss": 0.4854872077703476,
        "evaluate-accuracy": 0.5516853854060173,
        "evaluate-equal-opportunity-difference": 1.0,
        "evaluate-equalized-odds-difference": 1.0,
        "evaluate-demographic-parity-difference": 1.0,
    },
    "femnist": {
        "x": -15.685866966860232,
        "y": 11.952659093393535,
        "group": 0.0,
        "validation-x": 4.631124291924964,
        "validation-y": -28.450283368446144,
        "validation-group": -0.2358184626798337,
        "init": -4.456742526236594,
        "trained": 3.3302678324766917,
        "loss": 2.8897085189819336,
        "evaluate-loss": 4.085723400115967,
        "evaluate-accuracy": 0.0,
    },
    "hospital": {
        "x": -1.150506761763568,
        "y": -2.497776551104648,
        "group": -0.134162972720552,
        "validation-x": -3.660129698401968,
        "validation-y": -3.8268964137611534,
        "validation-group": 0.4130220484678551,
        "init": -1.1168090367269494,
        "trained": 0.5429707989983406,
        "loss": 7.527521133422852,
        "evaluate-loss": 7.258332093556722,
    },
}


def _check(name: str, got: dict[str, float]) -> None:
    expected = PINNED[name]
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, rel=1e-5, abs=1e-9, nan_ok=True), key


@pytest.mark.parametrize(
    ("name", "config"),
    [
        ("synthetic", {"task": "synthetic", "samples-per-user": 12, "validation-users": 3}),
        ("fairness", {"task": "fairness", "samples-per-user": 12, "validation-users": 5}),
        ("digits-logistic", {"task": "digits", "validation-users": 3, "model": "logistic"}),
        ("digits-cnn-dirichlet-parity", {"task": "digits", "validation-users": 4,
         "partition": "dirichlet", "labels": "parity", "rotate-probability": 0.5, "loss": "rmse"}),
    ],
)
def test_generated_tasks_are_pinned(name: str, config: dict[str, object]) -> None:
    task = tasks.load_task({**config, "data-seed": 5, "device": "cpu"})
    _check(name, _fingerprint(task, 6, 0.05))


def test_femnist_is_pinned(leaf_dir: Path) -> None:
    task = tasks.load_task({"task": "femnist", "data-path": str(leaf_dir), "validation-users": 1,
                            "rotate-probability": 0.5, "data-seed": 3, "device": "cpu"})
    _check("femnist", _fingerprint(task, 3, 0.05))


def test_hospital_is_pinned(cms_csv: Path) -> None:
    task = tasks.load_task({"task": "hospital", "data-path": str(cms_csv), "data-seed": 4,
                            "device": "cpu"})
    _check("hospital", _fingerprint(task, 7, 0.05))
