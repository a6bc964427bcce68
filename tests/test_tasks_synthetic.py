"""Tests of the synthetic linear-regression task (paper 001, section 4.1)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import tasks
from settings import SettingError
from tasks.config import TaskSettingsError
from tasks.synthetic import SyntheticTask, optima_array, rmse_gradient

PAPER = {"task": "synthetic", "optima": "5,6;4,-4.5"}
THETA = np.array([[5.0, 6.0], [4.0, -4.5]])


def _task(**config: object) -> SyntheticTask:
    task = tasks.load_task({**PAPER, **config})
    assert isinstance(task, SyntheticTask)
    return task


def test_optima_array() -> None:
    np.testing.assert_array_equal(optima_array("5,6;4,-4.5"), THETA)
    np.testing.assert_array_equal(optima_array(" 1 , 2 , 3 "), [[1.0, 2.0, 3.0]])
    np.testing.assert_array_equal(optima_array(THETA.tolist()), THETA)
    assert not optima_array("5,6;4,-4.5").flags.writeable
    np.testing.assert_array_equal(_task().optima, THETA)


def test_optima_repeat_tiles_each_optimum() -> None:
    # Prepare: two groups of length 2, repeated 3 times -> a model of 6 parameters.
    task = _task(**{"optima-repeat": 3})
    # Assert: each row is its optimum three times over; the model and the data follow.
    np.testing.assert_array_equal(task.optima, [[5, 6, 5, 6, 5, 6], [4, -4.5, 4, -4.5, 4, -4.5]])
    assert not task.optima.flags.writeable
    assert task.parameter_shapes == [(6,)] and task.num_parameters == 6
    assert task.client_dataset(0, 2).x.shape == (10, 6)
    np.testing.assert_array_equal(_task(**{"optima-repeat": 1}).optima, THETA)


def test_optima_repeat_is_bounded() -> None:
    with pytest.raises(SettingError, match=r"^optima-repeat must be .*, got optima-repeat=0$"):
        _task(**{"optima-repeat": 0})
    with pytest.raises(TaskSettingsError, match=r"optima-repeat=5000000 for vectors of length 3"):
        SyntheticTask("1,2,3", optima_repeat=5_000_000)


@pytest.mark.parametrize("text", ["5,6;4", "a,b", "1,inf", "", "1,,2"])
def test_bad_optima_name_the_key(text: str) -> None:
    with pytest.raises(SettingError, match=rf"^optima: .*, got optima={text!r}$"):
        tasks.load_task({"task": "synthetic", "optima": text})
    with pytest.raises(SettingError, match=rf"^optima: .*, got optima={text!r}$"):
        SyntheticTask(text)


@pytest.mark.parametrize(
    ("optima", "message"),
    [([1.0, 2.0], r"shape \(groups, n\)"), ([[1.0, np.inf]], "finite")],
)
def test_bad_optima_arrays_name_the_key(optima: object, message: str) -> None:
    with pytest.raises(TaskSettingsError, match=f"optima must .*{message}"):
        SyntheticTask(optima)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("users", -1),
        ("samples-per-user", 0),
        ("validation-users", 0),
        ("data-seed", -3),
        ("users", "many"),
    ],
)
def test_bad_settings_name_the_key(key: str, value: object) -> None:
    with pytest.raises(SettingError, match=f"{key}.*got {key}={value!r}"):
        tasks.load_task({**PAPER, key: value})


def test_validation_users_zero_is_refused_by_the_task() -> None:
    # The schema allows 0 (the hospital task's "all"); the synthetic task needs a user.
    with pytest.raises(TaskSettingsError, match="validation-users must be >= 1 for task synthetic"):
        SyntheticTask(validation_users=0)


def test_data_are_deterministic_across_instances() -> None:
    a, b = _task(), _task()
    for p in (0, 1, 7):
        da, db = a.client_dataset(p, 10), b.client_dataset(p, 10)
        assert da.x.tobytes() == db.x.tobytes()
        assert da.y.tobytes() == db.y.tobytes()
    va, vb = a.validation_datasets(), b.validation_datasets()
    assert [v.x.tobytes() for v in va] == [v.x.tobytes() for v in vb]


def test_seed_split_and_user_change_the_data() -> None:
    base = _task().client_dataset(0, 10).x
    assert not np.array_equal(base, _task(**{"data-seed": 1}).client_dataset(0, 10).x)
    assert not np.array_equal(base, _task().client_dataset(2, 10).x)
    assert not np.array_equal(base, _task().validation_datasets()[0].x)


def test_group_assignment_and_generation_rule() -> None:
    task = _task(**{"samples-per-user": 50})
    for user in range(6):
        data = task.client_dataset(user, 6)
        group = user % 2
        assert data.x.shape == (50, 2)
        np.testing.assert_array_equal(data.group, np.full(50, group))
        noise = data.y - data.x @ THETA[group]
        assert noise.min() >= 0.0 and noise.max() < 1.0
    assert [v.group[0] for v in task.validation_datasets()[:4]] == [0, 1, 0, 1]
    assert len(task.validation_datasets()) == 20


def test_users_setting_must_match_partitions() -> None:
    task = _task(users=100)
    assert len(task.client_dataset(99, 100)) == 10
    with pytest.raises(ValueError, match=r"users=100.*num-partitions=50"):
        task.client_dataset(0, 50)
    with pytest.raises(ValueError, match="partition-id"):
        _task().client_dataset(10, 10)
    # The same checks from the public settings alone, before any data is generated.
    task.check_partition(99, 100)
    with pytest.raises(TaskSettingsError, match=r"users=100.*num-partitions=50"):
        task.check_partition(0, 50)
    with pytest.raises(TaskSettingsError, match="partition-id"):
        _task().check_partition(10, 10)


def test_parameters_shape_and_dtype() -> None:
    task = _task()
    assert task.num_parameters == 2
    hypotheses = task.initial_hypotheses(3, np.random.default_rng(0))
    assert len(hypotheses) == 3
    for h in hypotheses:
        assert len(h) == 1 and h[0].shape == (2,) and h[0].dtype == np.float32
    assert not np.array_equal(hypotheses[0][0], hypotheses[1][0])
    three = SyntheticTask("1,2,3;4,5,6;7,8,9")
    assert three.num_parameters == 3 and three.num_groups == 3


def test_loss_at_optimum_is_the_rms_of_the_noise() -> None:
    task = _task(**{"samples-per-user": 2000, "validation-users": 4})
    for data in task.validation_datasets():
        theta = [THETA[data.group[0]].astype(np.float32)]
        assert task.loss(theta, data) == pytest.approx(math.sqrt(1 / 3), abs=0.02)


def test_rmse_gradient_matches_finite_differences() -> None:
    rng = np.random.default_rng(3)
    x, y, w = rng.standard_normal((7, 3)), rng.standard_normal(7), rng.standard_normal(3)

    def f(v: np.ndarray) -> float:
        return float(np.sqrt(np.mean((x @ v - y) ** 2)))

    numeric = [(f(w + 1e-6 * e) - f(w - 1e-6 * e)) / 2e-6 for e in np.eye(3)]
    np.testing.assert_allclose(rmse_gradient(w, x, y), numeric, rtol=1e-6)


def test_gradient_is_zero_not_nan_at_zero_loss() -> None:
    x = np.random.default_rng(0).standard_normal((4, 2))
    w = np.array([1.0, -2.0])
    np.testing.assert_array_equal(rmse_gradient(w, x, x @ w), [0.0, 0.0])


def test_one_paper_round_moves_theta_by_about_a_step() -> None:
    task = _task()
    rng = np.random.default_rng(0)
    start = task.initial_hypotheses(1, rng)[0]
    out = task.train(
        start, task.client_dataset(0, 100), epochs=1, learning_rate=0.1, batch_size=10, rng=rng
    )
    assert out[0].dtype == np.float32 and out[0].shape == (2,)
    # one batch of 10: the step is s * ||x̄ᵀr|| / RMSE, at most s * max||x||
    assert 0.02 < float(np.linalg.norm(out[0] - start[0])) < 0.3


def test_training_from_far_away_approaches_the_group_optimum() -> None:
    task = _task(**{"samples-per-user": 40})
    rng = np.random.default_rng(1)
    for user in (0, 1):
        data = task.client_dataset(user, 2)
        params = [np.array([-10.0, 10.0], np.float32)]
        before = task.loss(params, data)
        distance = np.linalg.norm(params[0] - THETA[user])
        for _ in range(60):
            params = task.train(params, data, epochs=1, learning_rate=0.5, batch_size=10, rng=rng)
        assert task.loss(params, data) < 0.1 * before
        assert np.linalg.norm(params[0] - THETA[user]) < 0.2 * distance


def test_train_is_reproducible_and_leaves_input_alone() -> None:
    task = _task(**{"samples-per-user": 25})
    data = task.client_dataset(3, 5)
    params = [np.array([0.5, 0.5], np.float32)]
    kwargs = {"epochs": 3, "learning_rate": 0.1, "batch_size": 4}
    a = task.train(params, data, rng=np.random.default_rng(9), **kwargs)  # type: ignore[arg-type]
    b = task.train(params, data, rng=np.random.default_rng(9), **kwargs)  # type: ignore[arg-type]
    c = task.train(params, data, rng=np.random.default_rng(10), **kwargs)  # type: ignore[arg-type]
    assert a[0].tobytes() == b[0].tobytes()
    assert a[0].tobytes() != c[0].tobytes()
    np.testing.assert_array_equal(params[0], [0.5, 0.5])


def test_train_and_loss_validate_inputs() -> None:
    task = _task()
    data = task.client_dataset(0, 1)
    with pytest.raises(ValueError, match="shape"):
        task.loss([np.zeros(3, np.float32)], data)
    with pytest.raises(ValueError, match="epochs"):
        task.train(
            [np.zeros(2, np.float32)],
            data,
            epochs=0,
            learning_rate=0.1,
            batch_size=10,
            rng=np.random.default_rng(0),
        )


def test_evaluate_takes_the_best_hypothesis_per_user() -> None:
    task = _task()
    users = task.validation_datasets()
    optimal = [[THETA[0].astype(np.float32)], [THETA[1].astype(np.float32)]]
    both = task.evaluate(optimal, users)
    assert {k for k in both if not k.startswith("hypothesis_")} == {"loss"}
    expected = np.mean([min(task.loss(h, d) for h in optimal) for d in users])
    assert both["loss"] == pytest.approx(expected)
    assert both["loss"] < 0.65
    assert task.evaluate(optimal[::-1], users)["loss"] == both["loss"]
    # one optimum only: the other group's users pay a large loss
    assert task.evaluate(optimal[:1], users)["loss"] > 3.0
