"""The clipping strategies' rules (Algorithm 3 of the thesis, Andrew et al.) and the event."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mechanisms import RecordLevelEvent, event_from_dict
from mechanisms.events import RECORD_RELATIONS as EVENT_RELATIONS
from mechanisms.record_clipping import CLIPPING_STRATEGIES, ClipSchedule, split_noise
from settings.declarations import RECORD_CLIPPING, RECORD_RELATIONS


def test_the_settings_and_the_mechanisms_name_the_same_choices() -> None:
    assert RECORD_CLIPPING == CLIPPING_STRATEGIES
    assert RECORD_RELATIONS == EVENT_RELATIONS


def test_oso_follows_algorithm_3() -> None:
    s = ClipSchedule("oso", 1.0, 0.1, clip_rate=0.01, lr_rate=0.02)
    g1, q1 = np.array([1.0, 0.0]), np.array([0.0, 1.0])
    s.step_oso(g1, q1)  # q̃_0 = g̃_0 = 0: sign 0, nothing moves
    assert (s.clip, s.learning_rate) == (1.0, 0.1)
    s.step_oso(np.array([1.0, 1.0]), np.array([1.0, 0.0]))  # g̃ᵀq̃_prev > 0, g̃ᵀg̃_prev > 0
    assert s.clip == pytest.approx(math.exp(0.01))
    assert s.learning_rate == pytest.approx(0.1 * math.exp(0.02))
    s.step_oso(np.array([-1.0, -1.0]), np.array([0.0, 0.0]))  # both dot products < 0
    assert s.clip == pytest.approx(1.0)
    assert s.learning_rate == pytest.approx(0.1)
    assert s.clips == pytest.approx([1.0, 1.0, math.exp(0.01), 1.0])


def test_the_quantile_rule_moves_c_towards_the_target() -> None:
    s = ClipSchedule("quantile", 1.0, 0.1, target_quantile=0.5, clip_rate=0.2)
    s.step_quantile(1.0)  # every record unclipped: C shrinks
    assert s.clip == pytest.approx(math.exp(-0.1))
    s.step_quantile(0.0)
    assert s.clip == pytest.approx(1.0)
    assert s.learning_rate == 0.1


def test_a_noisy_fraction_far_outside_0_1_or_a_long_run_one_way_keeps_c_finite() -> None:
    # A noise multiplier of 1e6 puts b̃ ~ ±1e5: before, exp(10 · 1e5) raised OverflowError
    # after the release was charged. b̃ is clamped to [0, 1] (post-processing), so one step
    # moves C by at most exp(η_C · max(γ, 1 − γ)).
    schedule = ClipSchedule("quantile", 1.0, 0.1, target_quantile=0.5, clip_rate=10.0)
    schedule.step_quantile(1e5)
    assert schedule.clip == pytest.approx(math.exp(-5.0))
    schedule.step_quantile(-1e308)
    assert schedule.clip == pytest.approx(1.0)
    # A thousand oso steps that all agree (sign +1 at rate 10) stop at the range's end
    # instead of reaching inf (and NaN in the training).
    oso = ClipSchedule("oso", 1.0, 0.1, clip_rate=10.0, lr_rate=10.0)
    ones = np.ones(3)
    for _ in range(1000):
        oso.step_oso(ones, ones)
    assert oso.clip == pytest.approx(1e300) and oso.learning_rate == pytest.approx(1e300)
    assert all(math.isfinite(c) and c > 0 for c in oso.clips)


@pytest.mark.parametrize("strategy", CLIPPING_STRATEGIES)
def test_every_split_is_one_query_of_the_charged_multiplier(strategy: str) -> None:
    for nu in (0.3, 1.0, 7.0):
        assert split_noise(strategy, nu).combined(strategy) == pytest.approx(nu, rel=1e-12)
    if strategy != "fixed":
        # The thesis's rule of thumb: ν_q = 7.124·ν makes ν_g 1 % larger than ν.
        assert split_noise(strategy, 1.0).gradient == pytest.approx(1.01, abs=1e-4)
        with pytest.raises(ValueError, match="ratio"):
            split_noise(strategy, 1.0, ratio=1.0)


def test_the_event_round_trips_and_refuses_bad_fields() -> None:
    event = RecordLevelEvent(0.1, 1.2, 30, "add-remove", 1.2)
    assert event_from_dict(event.to_dict()) == event
    assert event.to_dict()["relation"] == "add-remove" and event.family == "record"
    for bad in [(0.0, 1.0, 1, "add-remove"), (1.5, 1.0, 1, "add-remove"),
                (0.1, math.inf, 1, "add-remove"), (0.1, 1.0, 0, "add-remove"),
                (0.1, 1.0, 1, "swap")]:
        with pytest.raises((ValueError, TypeError)):
            RecordLevelEvent(*bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        event_from_dict({**event.to_dict(), "steps": 3.0})
