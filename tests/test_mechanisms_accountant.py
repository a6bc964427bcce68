"""The ledger's two parts on their own: the pure accountant, and the store's update contract."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from mechanisms import (
    BudgetExceededError,
    GaussianReleaseEvent,
    LedgerEntry,
    MetricPrivacyEvent,
    NeighbourhoodEvent,
    NonPrivateEvent,
    SignReleaseEvent,
    Spend,
    gaussian_epsilon,
)
from mechanisms.accountant import check_cap, check_cap_value, check_supported, compose
from mechanisms.ledger_store import EMPTY, LedgerState, LedgerStore

DELTA = 1e-5


def entry(event: object, round: int | None = None) -> LedgerEntry:
    return LedgerEntry(event, "2025-01-01T00:00:00+00:00", round)  # type: ignore[arg-type]


# -- the accountant: entries in, a Spend or a refusal out ----------------------------------------


def test_compose_reports_each_family_apart() -> None:
    # Prepare: 1570 + 0.35 of d-privacy, two Gaussian-like releases at z = 3.25.
    entries = [
        entry(NeighbourhoodEvent((7850,), 5.0)),
        entry(MetricPrivacyEvent(((0.1, 2.0), (0.3, 0.5)))),
        entry(GaussianReleaseEvent(3.25)),
        entry(SignReleaseEvent(3.25)),
        entry(NonPrivateEvent()),
    ]

    # Execute
    spend = compose(entries, declines=4, delta=DELTA)

    # Assert
    assert spend == Spend(
        d_privacy=math.fsum([1570.0, 0.2, 0.15]),
        epsilon=gaussian_epsilon(3.25, 2, DELTA),
        delta=DELTA,
        releases=5,
        declines=4,
    )


def test_compose_without_rdp_releases_reports_no_delta() -> None:
    assert compose([entry(NonPrivateEvent())], declines=0, delta=DELTA).delta == 0.0
    assert compose([], declines=0, delta=DELTA) == Spend(0.0, 0.0, 0.0, 0, 0)


def test_compose_checks_delta() -> None:
    with pytest.raises(ValueError, match=r"delta must be in the open interval \(0, 1\)"):
        compose([], declines=0, delta=1.0)


def test_check_cap_admits_what_fits_and_names_the_ledger_when_it_refuses() -> None:
    # Prepare: 2.0 of d-privacy spent.
    entries = [entry(MetricPrivacyEvent(((1.0, 2.0),)))]

    # Execute / Assert
    check_cap(entries, MetricPrivacyEvent(((0.5, 2.0),)), cap=3.0, delta=DELTA, ledger="L")
    with pytest.raises(BudgetExceededError, match=r"over the cap 2\.5; ledger L") as info:
        check_cap(entries, MetricPrivacyEvent(((0.5, 2.0),)), cap=2.5, delta=DELTA, ledger="L")
    assert (info.value.spent, info.value.would_spend, info.value.cap) == (2.0, 3.0, 2.5)
    assert info.value.cost == 1.0


def test_check_cap_compares_the_rdp_family_alone() -> None:
    # Prepare: a large d-privacy spend does not count against an RDP cap.
    entries = [entry(MetricPrivacyEvent(((100.0, 1.0),))), entry(GaussianReleaseEvent(8.0))]
    after = gaussian_epsilon(8.0, 2, DELTA)

    # Execute / Assert
    check_cap(entries, GaussianReleaseEvent(8.0), cap=after, delta=DELTA, ledger="L")
    with pytest.raises(BudgetExceededError, match=r"RDP ε at δ=1e-05") as info:
        check_cap(entries, SignReleaseEvent(8.0), cap=after * 0.99, delta=DELTA, ledger="L")
    assert info.value.would_spend == pytest.approx(after)


def test_check_cap_refuses_a_release_without_noise_under_any_cap() -> None:
    with pytest.raises(BudgetExceededError, match="no privacy guarantee") as info:
        check_cap([], NonPrivateEvent(), cap=1e9, delta=DELTA, ledger="L")
    assert info.value.would_spend == math.inf


@pytest.mark.parametrize(
    ("cap", "error", "pattern"),
    [(-1.0, ValueError, "cap must be non-negative and finite"),
     (math.inf, ValueError, "got cap=inf"), ("1", TypeError, "cap must be a real number")],
)
def test_check_cap_value_refuses_bad_caps(
    cap: object, error: type[Exception], pattern: str
) -> None:
    with pytest.raises(error, match=pattern):
        check_cap_value(cap)


def test_check_cap_value_keeps_no_cap_and_makes_floats() -> None:
    assert check_cap_value(None) is None
    assert check_cap_value(2) == 2.0 and type(check_cap_value(2)) is float


def test_check_supported_refuses_subclasses() -> None:
    class Cheaper(GaussianReleaseEvent):
        pass

    check_supported(GaussianReleaseEvent(1.0))
    with pytest.raises(TypeError, match="cannot charge"):
        check_supported(Cheaper(1.0))


# -- the store: the change is applied under the lock, numbered by the store ---------------------


def test_the_store_numbers_writes_itself(tmp_path: Path) -> None:
    # Prepare
    store = LedgerStore(tmp_path / "l.json")

    def add_decline(state: LedgerState) -> LedgerState:
        return LedgerState(state.entries, state.declines + 1, DELTA, generation=1000)

    # Execute
    first = store.update(add_decline)
    second = store.update(add_decline)

    # Assert: the generation the change returns is ignored.
    assert (first.generation, second.generation) == (1, 2)
    assert store.load() == second


def test_a_failing_change_writes_nothing(tmp_path: Path) -> None:
    # Prepare
    store = LedgerStore(tmp_path / "l.json")
    store.update(lambda state: LedgerState(state.entries, 1, DELTA, 0))
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}

    def refuse(state: LedgerState) -> LedgerState:
        raise BudgetExceededError("no", spent=0.0, would_spend=1.0, cap=0.0)

    # Execute / Assert
    with pytest.raises(BudgetExceededError):
        store.update(refuse)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_a_store_without_files_loads_as_none_and_creates_nothing(tmp_path: Path) -> None:
    store = LedgerStore(tmp_path / "sub" / "l.json")
    assert store.load() is None
    store.remove_stale_temporaries()
    assert not (tmp_path / "sub").exists()
    assert EMPTY == LedgerState((), 0, None, 0)
