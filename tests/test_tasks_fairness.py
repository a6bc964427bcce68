"""Tests of the fairness task and metrics (thesis 004, section 2.5.2)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import tasks
from tasks.fairness import FairnessTask, fairness_metrics, is_minority, logistic_loss

THETA_1 = np.array([5.0, 6.0])
THETA_2 = np.array([4.0, -4.5])


def _task(**config: object) -> FairnessTask:
    task = tasks.load_task({"task": "fairness", **config})
    assert isinstance(task, FairnessTask)
    return task


# -- metrics ------------------------------------------------------------------------------------
def test_metrics_by_hand() -> None:
    # S=1: y=[1,1,0,0], ŷ=[1,0,0,1]: TPR 1/2, FPR 1/2, P(ŷ=1) 2/4
    # S=0: y=[1,1,0,0], ŷ=[1,1,1,0]: TPR 1,   FPR 1/2, P(ŷ=1) 3/4
    y_true = np.array([1, 1, 0, 0, 1, 1, 0, 0])
    y_pred = np.array([1, 0, 0, 1, 1, 1, 1, 0])
    group = np.array([1, 1, 1, 1, 0, 0, 0, 0])
    assert fairness_metrics(y_true, y_pred, group) == pytest.approx(
        {
            "equal-opportunity-difference": 0.5,
            "equalized-odds-difference": 0.5,
            "demographic-parity-difference": 0.25,
        }
    )


def test_equalized_odds_takes_the_larger_gap() -> None:
    # S=1: y=[1,0,0,0], ŷ=[1,0,0,0]: TPR 1, FPR 0,   P 1/4
    # S=0: y=[1,0,0,0], ŷ=[1,1,1,0]: TPR 1, FPR 2/3, P 3/4
    y_true = np.array([1, 0, 0, 0, 1, 0, 0, 0])
    y_pred = np.array([1, 0, 0, 0, 1, 1, 1, 0])
    group = np.array([1, 1, 1, 1, 0, 0, 0, 0])
    result = fairness_metrics(y_true, y_pred, group)
    assert result["equal-opportunity-difference"] == 0.0
    assert result["equalized-odds-difference"] == pytest.approx(2 / 3)
    assert result["demographic-parity-difference"] == pytest.approx(0.5)


def test_metrics_are_nan_when_a_rate_is_undefined() -> None:
    # no positive label in S=0: its TPR is undefined
    result = fairness_metrics(
        np.array([1, 0, 0, 0]), np.array([1, 1, 1, 0]), np.array([1, 1, 0, 0])
    )
    assert math.isnan(result["equal-opportunity-difference"])
    assert math.isnan(result["equalized-odds-difference"])
    assert result["demographic-parity-difference"] == pytest.approx(0.5)


def test_metrics_reject_bad_input() -> None:
    with pytest.raises(ValueError, match="same length"):
        fairness_metrics(np.array([1, 0]), np.array([1]), np.array([1, 0]))
    with pytest.raises(ValueError, match="group"):
        fairness_metrics(np.array([1, 0]), np.array([1, 0]), np.array([2, 0]))


def test_logistic_loss_is_stable() -> None:
    assert logistic_loss(np.array([0.0]), np.array([1])) == pytest.approx(math.log(2))
    assert logistic_loss(np.array([1000.0, -1000.0]), np.array([1, 0])) == pytest.approx(0.0)
    assert logistic_loss(np.array([-1000.0]), np.array([1])) == pytest.approx(1000.0)


# -- data ---------------------------------------------------------------------------------------
def test_minority_share_is_exact_for_the_thesis_population() -> None:
    flags = [is_minority(u, 0.2) for u in range(1000)]
    assert sum(flags) == 200
    assert flags[:10] == [False] * 4 + [True] + [False] * 4 + [True]
    for n in (7, 33, 250):
        assert sum(flags[:n]) == math.floor(n * 0.2)
    assert not any(is_minority(u, 0.0) for u in range(50))
    assert all(is_minority(u, 1.0) for u in range(50))


def test_labels_follow_the_sigmoid_rule() -> None:
    task = _task(**{"samples-per-user": 200, "users": 10})
    for user in range(10):
        data = task.client_dataset(user, 10)
        s = task.sensitive_attribute(user)
        np.testing.assert_array_equal(data.group, np.full(200, s))
        assert data.x.shape == (200, 2) and data.y.dtype == np.int64
        if s == 1:  # majority: 1 iff xᵀθ1 + u >= 0, u in [0, 1)
            score = data.x @ THETA_1
            assert np.all(data.y[score >= 0] == 1) and np.all(data.y[score < -1] == 0)
        else:  # minority: 1 iff xᵀθ2 + u <= 0
            score = data.x @ THETA_2
            assert np.all(data.y[score <= -1] == 1) and np.all(data.y[score > 0] == 0)
    assert [task.sensitive_attribute(u) for u in range(5)] == [1, 1, 1, 1, 0]


def test_data_are_deterministic() -> None:
    a, b = _task(), _task()
    assert a.client_dataset(4, 10).x.tobytes() == b.client_dataset(4, 10).x.tobytes()
    assert a.client_dataset(4, 10).y.tobytes() == b.client_dataset(4, 10).y.tobytes()
    assert [d.y.tobytes() for d in a.validation_datasets()] == [
        d.y.tobytes() for d in b.validation_datasets()
    ]
    other = _task(**{"data-seed": 5}).client_dataset(4, 10)
    assert other.x.tobytes() != a.client_dataset(4, 10).x.tobytes()


def test_validation_users_hold_both_groups() -> None:
    groups = [int(d.group[0]) for d in _task().validation_datasets()]
    assert len(groups) == 20 and groups.count(0) == 4


@pytest.mark.parametrize(
    ("config", "key"),
    [
        ({"minority-fraction": 1.5}, "minority-fraction"),
        ({"minority-fraction": "lots"}, "minority-fraction"),
        ({"optima": "1,2"}, "optima"),
        ({"optima": "1,2;3,4;5,6"}, "optima"),
        ({"samples-per-user": 0}, "samples-per-user"),
    ],
)
def test_bad_settings_name_the_key(config: dict[str, object], key: str) -> None:
    # The message starts with the key and quotes the value received as key=value.
    with pytest.raises(ValueError, match=rf"^{key} .*{key}="):
        _task(**config)


# -- model --------------------------------------------------------------------------------------
def test_parameters_and_training() -> None:
    task = _task()
    assert task.parameter_shapes == [(2,), (1,)] and task.num_parameters == 3
    rng = np.random.default_rng(0)
    params = task.initial_hypotheses(1, rng)[0]
    assert all(p.dtype == np.float32 for p in params)
    data = task.client_dataset(0, 10)
    before = task.loss(params, data)
    for _ in range(20):
        params = task.train(params, data, epochs=1, learning_rate=0.5, batch_size=5, rng=rng)
    assert [p.shape for p in params] == [(2,), (1,)]
    assert all(p.dtype == np.float32 for p in params)
    assert task.loss(params, data) < 0.5 * before


def test_evaluate_adds_fairness_and_personalization_helps() -> None:
    task = _task(**{"validation-users": 40})
    users = task.validation_datasets()
    majority = [THETA_1.astype(np.float32), np.array([0.5], np.float32)]
    minority = [(-THETA_2).astype(np.float32), np.array([-0.5], np.float32)]
    single = task.evaluate([majority], users)
    personal = task.evaluate([majority, minority], users)
    assert {k for k in single if not k.startswith("hypothesis_")} == {
        "loss",
        "accuracy",
        "equal-opportunity-difference",
        "equalized-odds-difference",
        "demographic-parity-difference",
    }
    assert personal["accuracy"] > 0.95 > single["accuracy"]
    assert personal["equal-opportunity-difference"] < single["equal-opportunity-difference"]
    assert personal["equalized-odds-difference"] < single["equalized-odds-difference"]
    # the metrics come from each user's best hypothesis
    predictions = np.concatenate(
        [
            task.predict([majority, minority][task.best_hypothesis([majority, minority], d)], d.x)
            for d in users
        ]
    )
    expected = fairness_metrics(
        np.concatenate([d.y for d in users]), predictions, np.concatenate([d.group for d in users])
    )
    for key, value in expected.items():
        assert personal[key] == pytest.approx(value)
