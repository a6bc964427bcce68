"""The ledger's two parts on their own: the pure accountant, and the store's update contract."""

from __future__ import annotations

import math
from pathlib import Path

import dp_accounting
import pytest
from dp_accounting.pld import PLDAccountant
from dp_accounting.rdp import RdpAccountant
from scipy import optimize, stats

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
from mechanisms.calibration import pld_discretization
from mechanisms.ledger_store import EMPTY, LedgerState, LedgerStore

DELTA = 1e-5


def gaussian_groups_event(groups: dict[float, int]) -> dp_accounting.DpEvent:
    return dp_accounting.ComposedDpEvent([
        dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(z), k)
        for z, k in sorted(groups.items())])


def rdp_epsilon(groups: dict[float, int], delta: float = DELTA) -> float:
    """dp-accounting's RDP epsilon of the groups, computed here without gpfl's code."""
    return float(RdpAccountant().compose(gaussian_groups_event(groups)).get_epsilon(delta))


def pld_epsilon(groups: dict[float, int], delta: float = DELTA) -> float:
    """dp-accounting's PLD epsilon, at the interval PRIVACY.md states, without gpfl's code."""
    width = 0.0
    for z, k in sorted(groups.items()):
        mu = math.sqrt(k) / z
        width += mu * mu + 28.0 * mu
    accountant = PLDAccountant(value_discretization_interval=max(1e-4, width / 20_000))
    return float(accountant.compose(gaussian_groups_event(groups)).get_epsilon(delta))


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

    # Assert: the Gaussian-like pair is charged the smaller of its RDP and PLD epsilons.
    rdp, pld = rdp_epsilon({3.25: 2}), pld_epsilon({3.25: 2})
    assert spend == Spend(
        d_privacy=math.fsum([1570.0, 0.2, 0.15]),
        epsilon=min(rdp, pld),
        delta=DELTA,
        releases=5,
        declines=4,
        epsilon_rdp=rdp,
        epsilon_pld=pld,
    )
    assert spend.epsilon == gaussian_epsilon(3.25, 2, DELTA)


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
    with pytest.raises(BudgetExceededError, match=r"RDP's and PLD's\) at δ=1e-05") as info:
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


# -- Gaussian and sign releases: the smaller of two upper bounds, RDP and PLD --------------------


@pytest.mark.parametrize(
    ("groups", "delta"),
    [({1.0: 1}, 1e-5), ({1.0: 10}, 1e-5), ({1.0: 100}, 1e-5), ({5.0: 30}, 1e-5),
     ({3.25: 2, 8.0: 1}, 1e-5), ({20.0: 100, 21.0: 100, 22.0: 100}, 1e-6), ({2.0: 7}, 0.01)],
)
def test_the_charge_is_the_smaller_of_dp_accountings_rdp_and_pld_epsilons(
    groups: dict[float, int], delta: float
) -> None:
    # Prepare: the releases as ledger entries, Gaussian and sign alternating.
    events = [cls(z) for z, k in groups.items() for cls in [GaussianReleaseEvent, SignReleaseEvent]
              for _ in range((k + (cls is GaussianReleaseEvent)) // 2)]
    assert len(events) == sum(groups.values())

    # Execute
    spend = compose([entry(e) for e in events], declines=0, delta=delta)

    # Assert: both figures equal dp-accounting's, to the bit; the charge is their minimum.
    assert spend.epsilon_rdp == rdp_epsilon(groups, delta)
    assert spend.epsilon_pld == pld_epsilon(groups, delta)
    assert spend.epsilon == min(spend.epsilon_rdp, spend.epsilon_pld)
    assert spend.to_dict()["epsilon_pld"] == spend.epsilon_pld


@pytest.mark.parametrize(("z", "k"), [(1.0, 1), (1.0, 10), (1.0, 100), (5.0, 1), (5.0, 30),
                                      (0.8, 3), (20.0, 300)])
def test_the_pld_epsilon_is_an_upper_bound_within_a_hair_of_the_exact_one(z: float, k: int) -> None:
    # Prepare: k Gaussian releases at z are exactly one Gaussian of μ = √k / z, whose
    # δ(ε) = Φ(μ/2 − ε/μ) − e^ε Φ(−μ/2 − ε/μ) (Balle and Wang 2018): the exact ε at DELTA.
    mu = math.sqrt(k) / z

    def excess(eps: float) -> float:
        tail = math.exp(eps + float(stats.norm.logcdf(-mu / 2 - eps / mu)))
        return float(stats.norm.cdf(mu / 2 - eps / mu)) - tail - DELTA

    exact = optimize.brentq(excess, 0.0, 10.0 * (mu * mu + 10.0 * mu), xtol=1e-12, rtol=1e-14)

    # Execute
    spend = compose([entry(GaussianReleaseEvent(z)) for _ in range(k)], declines=0, delta=DELTA)

    # Assert: PLD (pessimistic) stays above the exact ε, and much closer to it than RDP.
    assert exact <= spend.epsilon_pld <= exact * (1 + 1e-4) + 1e-6
    assert spend.epsilon_pld < spend.epsilon_rdp
    assert spend.epsilon == spend.epsilon_pld


def test_the_pld_interval_grows_with_the_composition_and_stays_fine_for_small_ones() -> None:
    assert pld_discretization({}) == 1e-4
    assert pld_discretization({100.0: 1}) == 1e-4
    assert pld_discretization({1.0: 1000}) == pytest.approx((1000 + 28 * math.sqrt(1000)) / 2e4)
    assert pld_discretization({1.0: 1000, 2.0: 0}) == pld_discretization({1.0: 1000})


def test_check_cap_admits_what_pld_admits_and_rdp_would_refuse() -> None:
    # Prepare: 29 releases at z = 5 spent; a cap of 5 lies between the PLD (4.87) and the RDP
    # (5.25) epsilons of 30 releases.
    entries = [entry(GaussianReleaseEvent(5.0)) for _ in range(29)]
    assert pld_epsilon({5.0: 30}) < 5.0 < rdp_epsilon({5.0: 30})

    # Execute / Assert: the 30th fits; with a cap below its PLD epsilon, it does not.
    check_cap(entries, SignReleaseEvent(5.0), cap=5.0, delta=DELTA, ledger="L")
    with pytest.raises(BudgetExceededError) as info:
        check_cap(entries, SignReleaseEvent(5.0), cap=4.8, delta=DELTA, ledger="L")
    assert info.value.spent == min(pld_epsilon({5.0: 29}), rdp_epsilon({5.0: 29}))
    assert info.value.would_spend == pld_epsilon({5.0: 30})
