"""The task `example-linear` as gpfl uses it: built from a run config, trained, scored."""

from __future__ import annotations

import numpy as np
from gpfl_task_example_linear import TRUE_WEIGHTS, ExampleLinearTask

from tasks import load_task


def test_gpfl_finds_the_task_by_its_name() -> None:
    # The entry point the package registers: what a run config's task names.
    assert isinstance(load_task({"task": "example-linear"}), ExampleLinearTask)


def test_local_training_lowers_the_loss() -> None:
    task = load_task({"task": "example-linear", "samples-per-user": 50})
    data = task.client_dataset(0, 2)
    start = task.init_parameters(np.random.default_rng(0))

    trained = task.train(start, data, epochs=5, learning_rate=0.05, batch_size=10,
                         rng=np.random.default_rng(1))

    assert task.loss(trained, data) < 0.5 * task.loss(start, data)


def test_each_group_is_served_best_by_its_own_weights() -> None:
    task = load_task({"task": "example-linear"})
    truth = [[w.astype(np.float32)] for w in TRUE_WEIGHTS]

    scores = task.evaluate(truth, task.validation_datasets())

    assert scores["hypothesis_0_users"] > 0 and scores["hypothesis_1_users"] > 0
