"""Fairness synthetic data: a privileged majority and an unprivileged minority (thesis 004, 2.5.2).

Data (the thesis's rule; θ from the ``optima`` setting, default θ_1 = [5, 6], θ_2 = [4, -4.5] as
in its section 2.5.1, which 2.5.2 builds on)::

    x ~ N(0, I_2),  u ~ Uniform[0, 1)
    majority g_1 (S = 1):  Y = xᵀθ_1 + u        label 1  iff  Sigmoid(Y) >= 0.5       (Y >= 0)
    minority g_2 (S = 0):  Y = xᵀθ_2 + 15 + u   label 1  iff  Sigmoid(Y - 15) <= 0.5  (Y <= 15)

so the minority's labels follow the opposite orientation of a different boundary: a model fitted
to the pooled data serves the majority and fails the minority. ``Dataset.group`` holds the
sensitive attribute S (1 = privileged majority, 0 = unprivileged minority), one per sample.

Users: ``users`` in total (thesis: 1000; 0 = one per Flower partition), a ``minority-fraction``
(thesis: 0.2, i.e. 800 + 200) of them minority, ``samples-per-user`` each (10). Minority users
are spread evenly: user ``u`` is a minority user iff ⌊(u+1)·f⌋ > ⌊u·f⌋ (users 4, 9, 14, … for
f = 0.2), so any first N users hold ⌊N·f⌋ minority users. Validation users follow the same rule.

Gaps in the thesis, and what this module does instead:

* The distribution of x is not given; a standard normal, as in `tasks.synthetic`.
* The model is not stated precisely. The thesis applies the labelling rule to the regression
  output ŷ of the section 2.5.1 linear model. Here the model is a logistic regression (weights
  w ∈ R², bias b) trained on the labels with mean binary cross-entropy, predicting 1 iff
  wᵀx + b >= 0; it needs no group attribute at prediction time.
* "Similarly for the equalized odds difference": `fairness_metrics` takes the larger of the
  true-positive-rate and false-positive-rate gaps (as fairlearn does).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from fractions import Fraction

import numpy as np

from settings import SETTINGS
from tasks.base import Dataset, Params, Schedule, best_fits, per_hypothesis
from tasks.config import TaskSettingsError
from tasks.generated import GeneratedTask

__all__ = [
    "MINORITY_OFFSET",
    "FairnessTask",
    "evaluate_with_fairness",
    "fairness_metrics",
    "is_minority",
    "logistic_loss",
]

#: The thesis's shift of the minority's regression target.
MINORITY_OFFSET = 15.0
PRIVILEGED = 1
UNPRIVILEGED = 0


def is_minority(user: int, fraction: float) -> bool:
    """Whether user ``user`` is a minority user: ⌊(u+1)·f⌋ > ⌊u·f⌋, in exact arithmetic."""
    f = Fraction(str(fraction))
    return math.floor((user + 1) * f) > math.floor(user * f)


def _rate(hits: np.ndarray) -> float:
    return float(np.mean(hits)) if hits.size else math.nan


def fairness_metrics(y_true: np.ndarray, y_pred: np.ndarray, group: np.ndarray) -> dict[str, float]:
    """Group-fairness gaps of binary predictions (thesis 004, section 2.2.4).

    Parameters
    ----------
    y_true, y_pred : np.ndarray
        Labels and predictions in {0, 1}.
    group : np.ndarray
        Sensitive attribute S in {0, 1} (1 = privileged).

    Returns
    -------
    dict[str, float]
        ``demographic-parity-difference`` = |P(Ŷ=1|S=1) − P(Ŷ=1|S=0)|;
        ``equal-opportunity-difference`` = |TPR(S=1) − TPR(S=0)| (TPR = P(Ŷ=1|Y=1, S));
        ``equalized-odds-difference`` = max(|TPR gap|, |FPR gap|) (FPR = P(Ŷ=1|Y=0, S)).
        A rate whose condition never occurs (e.g. a group with no positive label) is NaN, and so
        is every gap that uses it.

    Raises
    ------
    ValueError
        If the arrays differ in length or hold values other than 0 and 1.
    """
    arrays = {
        "y_true": np.asarray(y_true).ravel(),
        "y_pred": np.asarray(y_pred).ravel(),
        "group": np.asarray(group).ravel(),
    }
    lengths = {name: a.shape[0] for name, a in arrays.items()}
    if len(set(lengths.values())) != 1:
        raise ValueError(f"y_true, y_pred and group must have the same length, got {lengths}")
    for name, a in arrays.items():
        if not np.all(np.isin(a, (0, 1))):
            raise ValueError(f"{name} must hold only 0 and 1, got values {np.unique(a)[:10]}")
    truth = arrays["y_true"].astype(bool)
    pred = arrays["y_pred"].astype(bool)
    s = arrays["group"].astype(bool)

    def gap(condition: np.ndarray) -> float:
        return abs(_rate(pred[condition & s]) - _rate(pred[condition & ~s]))

    everyone = np.ones_like(truth)
    tpr_gap = gap(truth)
    fpr_gap = gap(~truth)
    odds = math.nan if math.isnan(tpr_gap) or math.isnan(fpr_gap) else max(tpr_gap, fpr_gap)
    return {
        "equal-opportunity-difference": tpr_gap,
        "equalized-odds-difference": odds,
        "demographic-parity-difference": gap(everyone),
    }


def evaluate_with_fairness(
    user_metrics: Callable[[Params, Dataset], dict[str, float]],
    predict_labels: Callable[[Params, np.ndarray], np.ndarray],
    params_list: Sequence[Params],
    datasets: Sequence[Dataset],
    *,
    privileged: Callable[[Dataset], np.ndarray],
) -> dict[str, float]:
    """Score each user with its best hypothesis and add the pooled group-fairness gaps.

    Parameters
    ----------
    user_metrics : callable
        ``(params, data) -> {"loss", "accuracy", ...}`` of one user; picks the best hypothesis.
    predict_labels : callable
        ``(params, x) -> labels in {0, 1}``.
    params_list : Sequence[Params]
        The k hypotheses.
    datasets : Sequence[Dataset]
        One dataset per user.
    privileged : callable
        ``data -> S`` per sample (1 = privileged).

    Returns
    -------
    dict[str, float]
        ``"loss"`` and ``"accuracy"`` averaged over users, and `fairness_metrics` over all
        samples pooled, each predicted by its own user's best hypothesis.
    """
    fits = best_fits(user_metrics, params_list, datasets)
    result = {
        key: float(np.mean([fit.metrics[key] for fit in fits])) for key in ("loss", "accuracy")
    }
    result.update(per_hypothesis(fits, len(params_list), ("loss", "accuracy")))
    y_pred = np.concatenate(
        [predict_labels(params_list[fit.index], d.x) for fit, d in zip(fits, datasets, strict=True)]
    )
    y_true = np.concatenate([d.y for d in datasets])
    attribute = np.concatenate([privileged(d) for d in datasets])
    result.update(fairness_metrics(y_true, y_pred, attribute))
    return result


def logistic_loss(logits: np.ndarray, labels: np.ndarray) -> float:
    """Mean binary cross-entropy of ``logits`` against 0/1 ``labels`` (stable for any logit)."""
    if logits.size == 0:
        return 0.0
    # -log σ(z) = log(1 + e^{-z}); -log(1 - σ(z)) = log(1 + e^{z})
    per_sample = np.where(labels > 0, np.logaddexp(0.0, -logits), np.logaddexp(0.0, logits))
    return float(np.mean(per_sample))


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return np.exp(-np.logaddexp(0.0, -z))


class FairnessTask(GeneratedTask):
    """Logistic regression on a majority and a minority group with opposite labelling rules.

    Parameters
    ----------
    optima : array-like or str
        θ_1 (majority) and θ_2 (minority), shape (2, n), or ``"5,6;4,-4.5"``.
    minority_fraction : float
        Share of minority users, in [0, 1].
    users, samples_per_user, validation_users, data_seed : int
        As in `tasks.generated.GeneratedTask`, and checked by the settings schema alike.
    """

    name = "fairness"
    is_classifier = True
    run_config_keys = (
        "optima", "users", "minority-fraction", "samples-per-user", "validation-users",
        "data-seed",
    )

    def __init__(
        self,
        optima: str | Sequence[Sequence[float]] | np.ndarray = SETTINGS["optima"].default,
        *,
        users: int = SETTINGS["users"].default,
        minority_fraction: float = SETTINGS["minority-fraction"].default,
        samples_per_user: int = SETTINGS["samples-per-user"].default,
        validation_users: int = SETTINGS["validation-users"].default,
        data_seed: int = SETTINGS["data-seed"].default,
    ) -> None:
        super().__init__(
            optima, users=users, samples_per_user=samples_per_user,
            validation_users=validation_users, data_seed=data_seed,
        )
        self.minority_fraction: float = SETTINGS["minority-fraction"].parse(minority_fraction)

    def _check_optima(
        self, theta: np.ndarray, optima: str | Sequence[Sequence[float]] | np.ndarray
    ) -> np.ndarray:
        """Require exactly two optima: the majority's and the minority's."""
        if theta.shape[0] != 2:
            raise TaskSettingsError(
                "optima must give exactly two optima (majority; minority) for task fairness, "
                f"got {theta.shape[0]} in optima={optima!r}"
            )
        return theta

    # -- model ------------------------------------------------------------------------------
    @property
    def parameter_shapes(self) -> list[tuple[int, ...]]:
        """Two layers: weights (n,) and bias (1,)."""
        return [(self.dimension,), (1,)]

    def init_parameters(self, rng: np.random.Generator) -> Params:
        """Weights and bias ~ N(0, 1), like the synthetic task's hypotheses."""
        return [
            rng.standard_normal(self.dimension).astype(np.float32),
            rng.standard_normal(1).astype(np.float32),
        ]

    def logits(self, params: Params, x: np.ndarray) -> np.ndarray:
        """wᵀx + b for every row of ``x`` (float64)."""
        self._check(params)
        w = np.asarray(params[0], dtype=np.float64)
        b = float(np.asarray(params[1], dtype=np.float64)[0])
        return np.asarray(x, dtype=np.float64) @ w + b

    def predict(self, params: Params, x: np.ndarray) -> np.ndarray:
        """Predicted labels (int64): 1 iff σ(wᵀx + b) >= 0.5."""
        return (self.logits(params, x) >= 0.0).astype(np.int64)

    # -- data -------------------------------------------------------------------------------
    def sensitive_attribute(self, user: int) -> int:
        """S of training or validation user ``user``: 0 for minority users, 1 otherwise."""
        return UNPRIVILEGED if is_minority(user, self.minority_fraction) else PRIVILEGED

    def _dataset(self, purpose: str, index: int) -> Dataset:
        """User ``index``'s data; minority users (`is_minority`) follow the minority's rule."""
        s = self.sensitive_attribute(index)
        x, noise = self._features_and_noise(purpose, index)
        if s == PRIVILEGED:
            target = x @ self._optima[0] + noise
            labels = _sigmoid(target) >= 0.5
        else:
            target = x @ self._optima[1] + MINORITY_OFFSET + noise
            labels = _sigmoid(target - MINORITY_OFFSET) <= 0.5
        return Dataset(
            x=x,
            y=labels.astype(np.int64),
            group=np.full(len(labels), s, dtype=np.int64),
            user=f"{purpose}-{index}",
        )

    # -- scoring ----------------------------------------------------------------------------
    def loss(self, params: Params, data: Dataset) -> float:
        """Mean binary cross-entropy."""
        return logistic_loss(self.logits(params, data.x), data.y)

    def user_metrics(self, params: Params, data: Dataset) -> dict[str, float]:
        """``"loss"`` (binary cross-entropy) and ``"accuracy"``."""
        z = self.logits(params, data.x)
        accuracy = float(np.mean((z >= 0.0) == (data.y > 0))) if len(data) else math.nan
        return {"loss": logistic_loss(z, data.y), "accuracy": accuracy}

    def evaluate(
        self, params_list: Sequence[Params], datasets: Sequence[Dataset]
    ) -> dict[str, float]:
        """Score each user with its best hypothesis, and add the fairness gaps.

        ``"loss"`` and ``"accuracy"`` are averaged over users; `fairness_metrics` is computed
        over all samples pooled, each predicted by its own user's best hypothesis.
        """
        return evaluate_with_fairness(
            self.user_metrics, self.predict, params_list, datasets,
            privileged=lambda data: data.group,
        )

    # -- training ---------------------------------------------------------------------------
    def _fit(self, params: Params, data: Dataset, schedule: Schedule, device: str) -> Params:
        """Mini-batch gradient descent on the mean binary cross-entropy; ``device`` is ignored."""
        w = np.array(params[0], dtype=np.float64)
        b = float(np.asarray(params[1], dtype=np.float64)[0])
        x = np.asarray(data.x, dtype=np.float64)
        y = np.asarray(data.y, dtype=np.float64)
        learning_rate = schedule.learning_rate
        for batch in schedule.batches(len(data)):
            error = _sigmoid(x[batch] @ w + b) - y[batch]
            w -= learning_rate * (x[batch].T @ error) / batch.shape[0]
            b -= learning_rate * float(np.mean(error))
        return [w.astype(np.float32), np.array([b], dtype=np.float32)]
