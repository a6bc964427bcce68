"""A run whose validations keep its hypotheses far beyond the initial loss ends "diverged".

In process: the rule alone (:class:`strategies.divergence.Divergence` on hand-made records), then
the strategy driven by hand-built replies, with a rogue that stays under every device's
``max-parameter`` (no device refuses anything). tests/test_integration_robust.py drives the same
over real processes.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from server.results import RunRecorder
from settings import SettingError
from strategies import ClusteredStrategy
from strategies.divergence import Divergence
from strategies.records import ClientRecord, RoundRecord
from tests.test_strategies_clustered import PLAIN_MEAN, FakeManager, FakeProxy, hyp
from tests.test_strategies_faults import res
from tests.test_strategies_quorum import NONE


def records(*losses: float | None) -> list[RoundRecord]:
    """Round 0, 1, ... validated at ``losses`` (None: not validated that round)."""
    return [RoundRecord(round=t, val_loss=loss, val_metrics={}, cluster_sizes=[0], replies=0,
                        declined=0, dropped=[], failures=0) for t, loss in enumerate(losses)]


# ---------------------------------------------------------------------------- the rule alone


def test_three_validations_in_a_row_beyond_100_x_the_initial_loss_end_the_run() -> None:
    rule = Divergence()  # the declared defaults: 100 x, 3 validations
    # A spike of two (honest noise can do that) does not; the third in a row does.
    assert rule.check(records(2.0, 500.0, 500.0, 3.0, 201.0, 250.0), {}) is None
    reason = rule.check(records(2.0, 500.0, 500.0, 3.0, 201.0, 250.0, 300.0), {})
    assert reason is not None
    assert reason.startswith("round 6: the hypotheses left the range the validation data "
                             "supports: the last 3 validation losses were not finite or above "
                             "100 x the initial hypotheses' loss 2")
    assert "201 (round 4), 250 (round 5), 300 (round 6)" in reason


def test_a_loss_at_the_bound_is_not_beyond_it_and_a_non_finite_one_is() -> None:
    rule = Divergence(factor=10.0, validations=2)
    assert rule.check(records(1.0, 10.0, 10.0), {}) is None
    assert rule.check(records(1.0, 10.0, 10.001), {}) is None
    assert rule.check(records(1.0, 10.001, 10.001), {}) is not None
    assert rule.check(records(1.0, math.nan, math.inf), {}) is not None
    assert rule.check(records(1.0, math.nan, 1.0), {}) is None


def test_rounds_not_validated_neither_count_nor_break_the_streak() -> None:
    rule = Divergence(factor=10.0, validations=2)
    assert rule.check(records(1.0, 50.0, None, 60.0), {}) is not None
    # Checked after a validation only: the last record must be one.
    assert rule.check(records(1.0, 50.0, 60.0, None), {}) is None


def test_without_a_positive_finite_initial_loss_only_non_finite_losses_count() -> None:
    rule = Divergence(factor=10.0, validations=2)
    for initial in (0.0, -1.0, math.nan):
        assert rule.check(records(initial, 1e30, 1e30), {}) is None
        reason = rule.check(records(initial, math.nan, math.inf), {})
        assert reason is not None and "losses were not finite (" in reason


def test_factor_0_turns_the_rule_off_and_a_factor_of_1_or_less_is_refused() -> None:
    assert Divergence(factor=0.0, validations=1).check(records(1.0, math.nan), {}) is None
    for factor in (0.5, 1.0, -1.0, math.inf):
        with pytest.raises(SettingError, match="divergence-factor"):
            Divergence(factor=factor)
    with pytest.raises(SettingError, match="divergence-validations"):
        Divergence(validations=0)


def test_the_reason_names_the_devices_that_pulled_hardest() -> None:
    clients = {"1": ClientRecord("1", name="dev-a", participations=4, pull=4.2),
               "2": ClientRecord("2", name="dev-b", participations=4, pull=3.9),
               "3": ClientRecord("3", name="rogue", participations=4, pull=1200.0),
               "4": ClientRecord("4", participations=2, pull=2.0)}
    reason = Divergence(factor=10.0, validations=1).check(records(1.0, 11.0), clients) or ""
    assert reason.endswith("came from rogue (300 x the median distance on average)")


# ---------------------------------------------------------------------------- the strategy


def _rogue_round(strategy: ClusteredStrategy, manager: FakeManager, t: int) -> None:
    """Honest devices release near their hypothesis; "r" 300 further along the first axis.

    300 x the honest distance of about 1 passes the screening (1000 x the round's median),
    and no device refuses anything: the hypothesis walks away by ~75 a round.
    """
    strategy.configure_fit(t, NONE, manager)
    x, y = strategy.hypotheses[0][0].tolist()
    strategy.aggregate_fit(t, [
        (FakeProxy("a"), res([x + 0.9, y], name="dev-a")),
        (FakeProxy("b"), res([x, y + 1.1], name="dev-b")),
        (FakeProxy("c"), res([x - 1.0, y], name="dev-c")),
        (FakeProxy("r"), res([x + 300.0, y], name="rogue"))], [])
    strategy.evaluate(t, NONE)


def _distance_loss(hypotheses: list[list[np.ndarray]]) -> dict[str, float]:
    """An RMSE-like loss: 1 + the distance of the nearest hypothesis to the origin."""
    return {"loss": 1.0 + min(float(np.linalg.norm(h[0])) for h in hypotheses)}


def test_a_rogue_under_every_max_parameter_ends_the_run_diverged_naming_it(
    tmp_path: Path,
) -> None:
    # Prepare: 4 devices, one hypothesis at the origin (initial loss 1), the default rule.
    manager = FakeManager(["a", "b", "c", "r"])
    recorder = RunRecorder(tmp_path, {}, 10, "laplace")
    strategy = ClusteredStrategy(
        initial_hypotheses=hyp([0.0, 0.0]), clients_per_round=4, rng=np.random.default_rng(0),
        evaluate_fn=_distance_loss, patience=0, on_round=recorder.on_round, round_timeout=0.2,
        **PLAIN_MEAN)
    recorder.attach(strategy)
    strategy.evaluate(0, NONE)

    # Execute: the loss passes 100 in round 2 (hypothesis at ~150); rounds 2, 3, 4 are beyond.
    for t in (1, 2, 3):
        _rogue_round(strategy, manager, t)
        assert not strategy.diverged, t  # round 3: two validations beyond, not three
    _rogue_round(strategy, manager, 4)

    # Assert: diverged (not resumable), naming the rogue and only it; no device refused
    # anything, so the refusal trigger had nothing to go on (before: "complete" at round 10).
    assert [r.failures for r in strategy.history] == [0] * 5
    assert strategy.diverged and strategy.configure_fit(5, NONE, manager) == []
    reason = strategy.incomplete_reason or ""
    assert reason.startswith("round 4: the hypotheses left the range the validation data")
    assert "came from rogue (" in reason and "dev-" not in reason.split("came from")[1]
    # The round's own summary already says so (the rule runs before the round is recorded).
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "diverged" and summary["incomplete_reason"] == reason
    assert summary["last_round"] == 4


def test_the_count_of_bad_validations_survives_a_restore(tmp_path: Path) -> None:
    # Prepare: rounds 1-3 as above (2 validations beyond), saved; a new strategy restores them.
    manager = FakeManager(["a", "b", "c", "r"])

    def fresh() -> ClusteredStrategy:
        return ClusteredStrategy(
            initial_hypotheses=hyp([0.0, 0.0]), clients_per_round=4,
            rng=np.random.default_rng(0), evaluate_fn=_distance_loss, patience=0,
            round_timeout=0.2, **PLAIN_MEAN)

    first = fresh()
    first.evaluate(0, NONE)
    for t in (1, 2, 3):
        _rogue_round(first, manager, t)
    state, arrays = first.state()
    resumed = fresh()
    resumed.restore(json.loads(json.dumps(state)), arrays)

    # Execute: Flower's round 1 of the resumed run is the run's round 4.
    _rogue_round(resumed, manager, 1)

    # Assert: the streak counted from the checkpoint's history, not from zero.
    assert resumed.diverged
    assert (resumed.incomplete_reason or "").startswith("round 4: the hypotheses left")
