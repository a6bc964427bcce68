"""The contract every Mechanism keeps, the events, and import weight."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from mechanisms import (
    FAMILIES,
    EuclideanLaplace,
    GaussianMechanism,
    GaussianReleaseEvent,
    Mechanism,
    MetricPrivacyEvent,
    NeighbourhoodEvent,
    NoMechanism,
    NonPrivateEvent,
    PrivacyEvent,
    SignReleaseEvent,
    StochasticSign,
    event_from_dict,
)
from mechanisms.events import EVENT_TYPES

ROOT = Path(__file__).resolve().parents[1]

MECHANISMS: dict[str, Callable[[], Mechanism]] = {
    "laplace-neighbourhood": lambda: EuclideanLaplace(noise_multiplier=2.0),
    "laplace-fixed-per-layer": lambda: EuclideanLaplace(
        calibration="fixed", epsilon=1.0, public_radius=0.5, per_layer=True
    ),
    "gaussian": lambda: GaussianMechanism(
        clip=1.0, epsilon=1.0, delta=1e-5, planned_releases=20
    ),
    "sign": lambda: StochasticSign(
        clip=0.5, clip_mode="elementwise", epsilon=1.0, delta=1e-5, planned_releases=20
    ),
    "none": NoMechanism,
}


def make_pair() -> tuple[list[np.ndarray], list[np.ndarray]]:
    """A small model with mixed dtypes and shapes, including a scalar layer."""
    rng = np.random.default_rng(123)
    reference: list[np.ndarray] = [
        rng.standard_normal((4, 3)).astype(np.float32),
        rng.standard_normal(5).astype(np.float32),
        np.array(0.5, dtype=np.float64),
    ]
    updated: list[np.ndarray] = [
        (reference[0] + 0.1).astype(np.float32),
        (reference[1] - 0.2).astype(np.float32),
        np.array(0.75, dtype=np.float64),
    ]
    return reference, updated


@pytest.fixture(params=sorted(MECHANISMS))
def mechanism(request: pytest.FixtureRequest) -> Mechanism:
    return MECHANISMS[request.param]()


class TestEveryMechanism:
    """What the client relies on, whichever mechanism it runs."""

    def test_release_keeps_shapes_is_float32_and_finite(self, mechanism: Mechanism) -> None:
        # Prepare
        reference, updated = make_pair()

        # Execute
        released = mechanism.sanitize(reference, updated, rng=np.random.default_rng(0))

        # Assert
        assert len(released) == len(updated)
        for out, upd in zip(released, updated, strict=True):
            assert isinstance(out, np.ndarray)
            assert out.shape == upd.shape
            assert out.dtype == np.float32  # the device's release dtype, whatever upd's
            assert np.isfinite(out).all()
            assert not np.shares_memory(out, upd)

    def test_event_comes_first_and_is_deterministic(self, mechanism: Mechanism) -> None:
        # Prepare
        reference, updated = make_pair()
        before = [a.copy() for a in updated]

        # Execute: the event needs no generator; two calls agree; it round-trips.
        first = mechanism.event(reference, updated)
        mechanism.sanitize(reference, updated, rng=np.random.default_rng(1))
        second = mechanism.event(reference, updated)

        # Assert
        assert first == second
        assert event_from_dict(first.to_dict()) == first
        for a, b in zip(updated, before, strict=True):
            np.testing.assert_array_equal(a, b)  # inputs are not modified

    def test_same_seed_same_release(self, mechanism: Mechanism) -> None:
        # Prepare
        reference, updated = make_pair()

        # Execute
        a = mechanism.sanitize(reference, updated, rng=np.random.default_rng(42))
        b = mechanism.sanitize(reference, updated, rng=np.random.default_rng(42))
        c = mechanism.sanitize(reference, updated, rng=np.random.default_rng(43))

        # Assert
        for x, y in zip(a, b, strict=True):
            np.testing.assert_array_equal(x, y)
        differs = any(not np.array_equal(x, z) for x, z in zip(a, c, strict=True))
        assert differs == (mechanism.name != "none")

    def test_public_metrics_are_the_three_documented_floats(self, mechanism: Mechanism) -> None:
        # Prepare
        reference, updated = make_pair()

        # Execute
        metrics = mechanism.public_metrics(reference, updated)

        # Assert
        assert set(metrics) == {"sigma", "budget-epsilon", "budget-delta"}
        assert all(isinstance(v, float) and math.isfinite(v) and v >= 0 for v in metrics.values())
        assert (metrics["sigma"] > 0) == (mechanism.name != "none")

    @pytest.mark.parametrize(
        ("mutate", "error", "pattern"),
        [
            (lambda r, u: (r, u[:2]), ValueError, "same number of layers"),
            (lambda r, u: (r, [u[0].reshape(3, 4), *u[1:]]), ValueError, "shapes differ"),
            (lambda r, u: (r, [u[0], np.full(5, np.nan, np.float32), u[2]]), ValueError,
             r"updated\[1\] contains non-finite"),
            (lambda r, u: ([np.full((4, 3), np.inf, np.float32), *r[1:]], u), ValueError,
             r"reference\[0\] contains non-finite"),
            (lambda r, u: (r, [u[0].astype(np.int64), *u[1:]]), TypeError, "floating-point"),
            (lambda r, u: ([], []), ValueError, "at least one layer"),
            (lambda r, u: (r[0], u[0]), TypeError, "sequence of arrays"),
        ],
    )
    def test_bad_models_are_refused_by_every_method(
        self, mechanism: Mechanism, mutate: Callable, error: type[Exception], pattern: str
    ) -> None:
        # Prepare
        reference, updated = mutate(*make_pair())

        # Execute / Assert
        with pytest.raises(error, match=pattern):
            mechanism.event(reference, updated)
        with pytest.raises(error, match=pattern):
            mechanism.public_metrics(reference, updated)
        with pytest.raises(error, match=pattern):
            mechanism.sanitize(reference, updated, rng=np.random.default_rng(0))

    def test_spread_zero_is_the_default(self, mechanism: Mechanism) -> None:
        # Prepare
        reference, updated = make_pair()

        # Execute
        implicit = mechanism.sanitize(reference, updated, rng=np.random.default_rng(5))
        explicit = mechanism.sanitize(reference, updated, rng=np.random.default_rng(5), spread=0)

        # Assert
        for a, b in zip(implicit, explicit, strict=True):
            np.testing.assert_array_equal(a, b)
        assert mechanism.public_metrics(reference, updated, spread=0.0) == (
            mechanism.public_metrics(reference, updated)
        )

    @pytest.mark.parametrize(
        ("spread", "error", "pattern"),
        [
            (-0.5, ValueError, "spread must be non-negative and finite, got spread=-0.5"),
            (math.nan, ValueError, "spread must be non-negative and finite, got spread=nan"),
            (math.inf, ValueError, "spread must be non-negative and finite, got spread=inf"),
            ("1", TypeError, "spread must be a real number, got spread='1'"),
        ],
    )
    def test_bad_spread_is_refused_naming_it(
        self, mechanism: Mechanism, spread: object, error: type[Exception], pattern: str
    ) -> None:
        reference, updated = make_pair()
        with pytest.raises(error, match=pattern):
            mechanism.sanitize(
                reference, updated, rng=np.random.default_rng(0), spread=spread  # type: ignore[arg-type]
            )
        with pytest.raises(error, match=pattern):
            mechanism.public_metrics(reference, updated, spread=spread)  # type: ignore[arg-type]

    def test_sanitize_needs_a_generator(self, mechanism: Mechanism) -> None:
        reference, updated = make_pair()
        with pytest.raises(TypeError, match=r"rng must be a numpy\.random\.Generator"):
            mechanism.sanitize(reference, updated, rng=0)  # type: ignore[arg-type]


# -- events ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "event",
    [
        MetricPrivacyEvent(((0.5, 2.0), (1.5, 0.0))),
        NeighbourhoodEvent((7850,), 5.0),
        NeighbourhoodEvent((3, 1, 12), 0.25),
        GaussianReleaseEvent(3.25),
        SignReleaseEvent(3.25),
        NonPrivateEvent(),
    ],
)
def test_events_round_trip_through_dicts(event: object) -> None:
    # Execute
    d = event.to_dict()  # type: ignore[attr-defined]
    back = event_from_dict(d)

    # Assert
    assert back == event
    assert type(back) is type(event)


def test_metric_cost_is_the_sum_of_epsilon_times_radius() -> None:
    assert MetricPrivacyEvent(((0.5, 2.0), (1.5, 3.0), (2.0, 0.0))).cost == pytest.approx(5.5)


def test_neighbourhood_cost_is_the_sum_of_n_over_nu() -> None:
    # Per-layer blocks of 3, 1 and 12 parameters at nu = 0.25: 12 + 4 + 48.
    assert NeighbourhoodEvent((3, 1, 12), 0.25).cost == 64.0
    assert NeighbourhoodEvent((7850,), 3.0).cost == 7850 / 3.0


def test_neighbourhood_event_keeps_ints_and_floats() -> None:
    # Prepare: NumPy integers (as sizes come from array.size) and an int nu.
    event = NeighbourhoodEvent((np.int64(4), 5), 2)  # type: ignore[arg-type]

    # Assert: plain Python numbers, so the JSON form and equality are stable.
    assert event.dimensions == (4, 5)
    assert [type(n) for n in event.dimensions] == [int, int]
    assert type(event.noise_multiplier) is float
    assert event.to_dict() == {"kind": "neighbourhood", "dimensions": [4, 5],
                               "noise_multiplier": 2.0, "relation": "device-replace"}


@pytest.mark.parametrize(
    ("cls", "family"),
    [
        (MetricPrivacyEvent, "d-privacy"),
        (NeighbourhoodEvent, "d-privacy"),
        (GaussianReleaseEvent, "rdp"),
        (SignReleaseEvent, "rdp"),
        (NonPrivateEvent, "none"),
    ],
)
def test_every_event_class_has_its_family(cls: type[PrivacyEvent], family: str) -> None:
    assert cls.family == family
    assert "family" in vars(cls)  # set on the class itself, not inherited by accident


def test_the_known_event_types_cover_every_family() -> None:
    assert {cls.family for cls in EVENT_TYPES} == set(FAMILIES)
    assert len({cls.kind for cls in EVENT_TYPES}) == len(EVENT_TYPES)


def test_sign_and_gaussian_events_are_distinct() -> None:
    assert SignReleaseEvent(1.0) != GaussianReleaseEvent(1.0)
    assert event_from_dict({"kind": "sign", "noise_multiplier": 1.0}) == SignReleaseEvent(1.0)


def test_events_are_immutable() -> None:
    event = GaussianReleaseEvent(2.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.noise_multiplier = 0.1  # type: ignore[misc]


@pytest.mark.parametrize(
    ("d", "error", "pattern"),
    [
        ({"kind": "laplace-ish"}, ValueError, "unknown privacy event kind 'laplace-ish'"),
        ({}, ValueError, "unknown privacy event kind None"),
        ([("kind", "none")], TypeError, "an event must be a dict"),
        ({"kind": "gaussian"}, ValueError, r"needs exactly the fields \['noise_multiplier'\]"),
        ({"kind": "none", "extra": 1}, ValueError, "needs exactly the fields"),
        ({"kind": "gaussian", "noise_multiplier": float("nan")}, ValueError,
         "noise_multiplier must be positive and finite"),
        ({"kind": "sign", "noise_multiplier": -1.0}, ValueError,
         "noise_multiplier must be positive"),
        ({"kind": "gaussian", "noise_multiplier": "2"}, TypeError, "must be a real number"),
        ({"kind": "metric", "layers": []}, ValueError, "at least one"),
        ({"kind": "metric", "layers": [[1.0, -2.0]]}, ValueError, "radius must be non-negative"),
        ({"kind": "metric", "layers": [[float("inf"), 1.0]]}, ValueError,
         "epsilon must be positive and finite"),
        ({"kind": "metric", "layers": [[1.0]]}, TypeError, "pairs"),
        ({"kind": "metric", "layers": [1.0]}, TypeError, "pairs"),
        ({"kind": "metric", "layers": "1,2"}, TypeError, "list of"),
        ({"kind": "neighbourhood", "dimensions": [4]}, ValueError,
         r"needs exactly the fields \['dimensions', 'noise_multiplier'\]"),
        ({"kind": "neighbourhood", "dimensions": [], "noise_multiplier": 1.0}, ValueError,
         "dimensions must hold at least one block size"),
        ({"kind": "neighbourhood", "dimensions": [0], "noise_multiplier": 1.0}, ValueError,
         "dimensions must be a positive integer, got dimensions=0"),
        ({"kind": "neighbourhood", "dimensions": [4.0], "noise_multiplier": 1.0}, TypeError,
         "dimensions must be an integer"),
        ({"kind": "neighbourhood", "dimensions": [True], "noise_multiplier": 1.0}, TypeError,
         "dimensions must be an integer"),
        ({"kind": "neighbourhood", "dimensions": 4, "noise_multiplier": 1.0}, TypeError,
         "dimensions must be a list"),
        ({"kind": "neighbourhood", "dimensions": [4], "noise_multiplier": 0.0}, ValueError,
         "noise_multiplier must be positive and finite"),
    ],
)
def test_bad_event_dicts_are_refused(d: object, error: type[Exception], pattern: str) -> None:
    with pytest.raises(error, match=pattern):
        event_from_dict(d)  # type: ignore[arg-type]


# -- import weight -----------------------------------------------------------------------------


def test_importing_and_using_laplace_stays_light(tmp_path: Path) -> None:
    # Prepare: a client process that sanitizes with Laplace and charges its ledger
    # must not pay for dp-accounting or SciPy, and nothing may pull in Flower or torch.
    code = (
        "import sys, numpy as np, mechanisms as m\n"
        "mech = m.EuclideanLaplace(noise_multiplier=5.0)\n"
        "ref, upd = [np.zeros(3)], [np.ones(3)]\n"
        f"ledger = m.PrivacyLedger({str(tmp_path / 'l.json')!r}, delta=1e-5)\n"
        "ledger.charge(mech.event(ref, upd), cap=10.0)\n"
        "mech.sanitize(ref, upd, rng=m.device_rng(), spread=m.hypotheses_diameter([ref, upd]))\n"
        "ledger.spent()\n"
        "heavy = ('dp_accounting', 'scipy', 'flwr', 'torch')\n"
        "print(sorted(k for k in sys.modules if k.split('.')[0] in heavy))\n"
    )

    # Execute
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )

    # Assert
    assert result.stdout.strip() == "[]"
