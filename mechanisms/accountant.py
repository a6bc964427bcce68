"""The accountant: what a sequence of charged releases has spent, and whether one more fits.

Pure functions over immutable records: a :class:`LedgerEntry` (one charged
:class:`~mechanisms.events.PrivacyEvent`, when and in which round) goes in, a
:class:`Spend` or a :class:`BudgetExceededError` comes out. Nothing here reads or
writes a file; :mod:`mechanisms.ledger_store` keeps the entries on disk and
:class:`~mechanisms.ledger.PrivacyLedger` puts the two together.

Composition, by the event's family (:mod:`mechanisms.events`); a family's spend is
compared only with a cap in its own unit:

* ``"d-privacy"`` (``neighbourhood`` and ``metric`` events, Euclidean Laplace):
  costs add, Σ ε·r (Theorem 3.1 of Galli et al.), reported as ``Spend.d_privacy``;
* ``"rdp"`` (``gaussian`` and ``sign`` events; a sign release is post-processing of
  a Gaussian one): composed by dp-accounting's ``RdpAccountant`` and by its
  ``PLDAccountant`` (events grouped by noise multiplier as ``SelfComposedDpEvent``) into
  ``Spend.epsilon_rdp`` and ``Spend.epsilon_pld`` at the ledger's δ; both are upper
  bounds, so the smaller, ``Spend.epsilon``, is what is charged and capped
  (:mod:`mechanisms.calibration`). The family keeps its name ``"rdp"`` (it is in every
  ledger file);
* ``"record"`` (``dpsgd`` events, record-level DP-SGD on the device): composed by the same
  accountant (:mod:`mechanisms.record_accounting`) into ``Spend.record_epsilon`` at the
  ledger's δ, never mixed with the device-level figures;
* ``"none"`` (``none`` events, no noise): counted as releases; they carry no
  guarantee, so no cap admits them, only ``cap=None``.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from mechanisms._validation import check_open_unit, check_real
from mechanisms.calibration import composed_gaussian_epsilon_rdp, composed_gaussian_epsilons
from mechanisms.events import (
    EVENT_TYPES,
    DistributedGaussianEvent,
    GaussianReleaseEvent,
    MetricPrivacyEvent,
    NeighbourhoodEvent,
    PrivacyEvent,
    RecordLevelEvent,
)
from mechanisms.record_accounting import record_epsilon

# A cap is compared with a sum of floats: 6 releases of 0.4 sum to 2.4000000000000004.
# This relative slack keeps such a release inside a cap of 2.4; it is far below any
# meaningful privacy difference.
_CAP_RTOL = 1e-9

#: The event classes the accountant composes; any other is refused before anything changes.
SUPPORTED_EVENTS: tuple[type[PrivacyEvent], ...] = EVENT_TYPES


class BudgetExceededError(Exception):
    """The next release would pass the client's cap; nothing was changed.

    Attributes
    ----------
    spent : float
        The current spend in the cap's unit (d-privacy Σ ε·r, the Gaussian/sign ε charged,
        or the record-level RDP ε).
    would_spend : float
        The spend after the release (``inf`` for a release without noise).
    cost : float
        ``would_spend - spent``.
    cap : float
        The cap.
    """

    def __init__(self, message: str, *, spent: float, would_spend: float, cap: float) -> None:
        super().__init__(message)
        self.spent = spent
        self.would_spend = would_spend
        self.cost = would_spend - spent
        self.cap = cap


@dataclass(frozen=True)
class Spend:
    """What a client has spent so far, one figure per family (never added together).

    Attributes
    ----------
    d_privacy : float
        Σ ε·r over its d-privacy (Euclidean Laplace) releases.
    epsilon, delta : float
        The (ε, δ) charged for its Gaussian and sign releases (0, 0 if none): ε is
        ``min(epsilon_rdp, epsilon_pld)``.
    releases : int
        Releases charged, of every kind.
    declines : int
        Rounds declined because of the cap.
    record_epsilon : float
        The RDP-composed record-level ε, at the ledger's δ, of its DP-SGD releases (0 if none);
        each release's relation (add/remove or replace-one) is in its ledger entry.
    epsilon_rdp, epsilon_pld : float
        The ε at δ of its Gaussian and sign releases by dp-accounting's RDP accountant and by
        its PLD accountant (pessimistic); each an upper bound, ``epsilon`` the smaller (0 if none).
        Once a discrete Gaussian share (``distributed-gaussian``) is among them, RDP alone
        composes (the PLD accountant models the continuous Gaussian) and both fields hold it.
    central_epsilon : float
        With ``distributed-gaussian`` releases (secure clusters): the ε at δ of what the server
        learns from the sums, each such release at its central multiplier (conditional on its
        cohort of honest devices), every other Gaussian or sign release at its own; 0 if none.
    """

    d_privacy: float
    epsilon: float
    delta: float
    releases: int
    declines: int
    record_epsilon: float = 0.0
    epsilon_rdp: float = 0.0
    epsilon_pld: float = 0.0
    central_epsilon: float = 0.0

    def to_dict(self) -> dict[str, float | int]:
        """Return the fields as a dict (snake_case keys)."""
        return asdict(self)


@dataclass(frozen=True)
class LedgerEntry:
    """One charged release: the event, when (UTC, ISO 8601), in which round and federation.

    ``federation`` tags the release with the federation it was made for (``None`` for
    releases recorded before tags existed), so that a device can report a federation its
    spend there without telling it about its other federations.
    """

    event: PrivacyEvent
    time: str
    round: int | None
    federation: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form stored in the ledger file (``federation`` only when tagged)."""
        out: dict[str, Any] = {"time": self.time, "round": self.round,
                               "event": self.event.to_dict()}
        if self.federation is not None:
            out["federation"] = self.federation
        return out


def check_supported(event: PrivacyEvent) -> None:
    """Refuse an event this accountant cannot compose, or one with out-of-range fields.

    Raises
    ------
    TypeError
        ``event`` is not an instance of exactly one of :data:`SUPPORTED_EVENTS` (a
        subclass could change the cost without the accountant knowing).
    ValueError
        A field is out of range (e.g. a non-finite noise multiplier).
    """
    if type(event) not in SUPPORTED_EVENTS:
        raise TypeError(
            f"cannot charge {event!r}: not one of "
            f"{', '.join(cls.__name__ for cls in SUPPORTED_EVENTS)}"
        )
    event.validate()


def check_cap_value(cap: object) -> float | None:
    """Return ``cap`` as a float that is >= 0 and finite, or ``None`` (no cap)."""
    if cap is None:
        return None
    value = check_real("cap", cap)
    if not (value >= 0.0 and math.isfinite(value)):
        raise ValueError(
            f"cap must be non-negative and finite (None for no cap), got cap={value!r}"
        )
    return value


def compose(entries: Sequence[LedgerEntry], *, declines: int, delta: float) -> Spend:
    """Return the spend of ``entries`` (see the module notes), with ``declines`` declines.

    Parameters
    ----------
    entries : sequence of LedgerEntry
        Every charged release.
    declines : int
        The rounds declined, reported as they are.
    delta : float
        The δ, in (0, 1), at which the Gaussian and sign releases are reported as (ε, δ).
    """
    delta = check_open_unit("delta", delta)
    groups = _gaussian_groups(entries)
    records = _record_events(entries)
    discrete = _has_discrete(entries)
    epsilon_rdp, epsilon_pld = _gaussian_epsilons(groups, delta, discrete=discrete)
    central = (composed_gaussian_epsilon_rdp(_central_groups(entries), delta) if discrete
               else 0.0)
    return Spend(
        d_privacy=_d_privacy(entries),
        epsilon=min(epsilon_rdp, epsilon_pld),
        delta=delta if groups or records else 0.0,
        releases=len(entries),
        declines=declines,
        record_epsilon=record_epsilon(records, delta),
        epsilon_rdp=epsilon_rdp,
        epsilon_pld=epsilon_pld,
        central_epsilon=central,
    )


def check_cap(
    entries: Sequence[LedgerEntry],
    event: PrivacyEvent,
    *,
    cap: float,
    delta: float,
    ledger: object,
) -> None:
    """Raise :class:`BudgetExceededError` if charging ``event`` after ``entries`` passes ``cap``.

    Only the spend of ``event``'s family is compared with ``cap`` (see
    :meth:`mechanisms.ledger.PrivacyLedger.charge`); a ``"none"`` event passes no
    cap. ``ledger`` names the ledger in the error message.
    """
    if event.family == "none":
        raise BudgetExceededError(
            f"a release without noise (mechanism 'none') has no privacy guarantee and "
            f"cannot fit under any cap (cap={cap!r}); ledger {ledger}",
            spent=0.0,
            would_spend=math.inf,
            cap=cap,
        )
    if event.family == "d-privacy":
        costs = [_d_cost(e.event) for e in entries if e.event.family == "d-privacy"]
        before = math.fsum(costs)
        # The same fsum the spend will report once the entry is written.
        after = math.fsum([*costs, _d_cost(event)])
        unit = "d-privacy Σ ε·r"
    elif event.family == "record":
        assert isinstance(event, RecordLevelEvent)
        records = _record_events(entries)
        before = record_epsilon(records, delta)
        after = record_epsilon([*records, event], delta)
        unit = f"record-level RDP ε at δ={delta:g}"
    else:
        # The ε charged: the smaller of the RDP and PLD bounds. The spend before the release
        # is composed only for a refusal (a PLD composition costs tens of milliseconds).
        groups = _gaussian_groups(entries)
        with_release = groups.copy()
        with_release[_noise_multiplier(event)] += 1
        discrete = _has_discrete(entries) or isinstance(event, DistributedGaussianEvent)
        after = min(_gaussian_epsilons(with_release, delta, discrete=discrete))
        if after <= cap * (1.0 + _CAP_RTOL):
            return
        before = min(_gaussian_epsilons(groups, delta, discrete=discrete))
        unit = f"ε (the smaller of RDP's and PLD's) at δ={delta:g}"
    if after > cap * (1.0 + _CAP_RTOL):
        raise BudgetExceededError(
            f"release refused: {unit} spent {before:.6g}, this release would bring it to "
            f"{after:.6g} (cost {after - before:.6g}), over the cap {cap:.6g}; "
            f"ledger {ledger}",
            spent=before,
            would_spend=after,
            cap=cap,
        )


def _d_cost(event: PrivacyEvent) -> float:
    if not isinstance(event, (MetricPrivacyEvent, NeighbourhoodEvent)):
        raise TypeError(f"{event!r} is not a d-privacy event")
    return event.cost


def _d_privacy(entries: Sequence[LedgerEntry]) -> float:
    return math.fsum(_d_cost(e.event) for e in entries if e.event.family == "d-privacy")


def _noise_multiplier(event: PrivacyEvent) -> float:
    assert isinstance(event, GaussianReleaseEvent)
    return event.noise_multiplier


def _has_discrete(entries: Sequence[LedgerEntry]) -> bool:
    return any(isinstance(e.event, DistributedGaussianEvent) for e in entries)


def _gaussian_epsilons(groups: Counter[float], delta: float, *,
                       discrete: bool) -> tuple[float, float]:
    """Return (ε_RDP, ε_PLD); with a discrete Gaussian share among them, RDP's twice."""
    if not discrete:
        return composed_gaussian_epsilons(groups, delta)
    rdp = composed_gaussian_epsilon_rdp(groups, delta)
    return rdp, rdp


def _central_groups(entries: Sequence[LedgerEntry]) -> Counter[float]:
    # What the server learns: a secure share at its central multiplier, a plain Gaussian or
    # sign release (seen whole) at its own.
    return Counter(e.event.central_noise_multiplier
                   if isinstance(e.event, DistributedGaussianEvent)
                   else _noise_multiplier(e.event)
                   for e in entries if e.event.family == "rdp")


def _record_events(entries: Sequence[LedgerEntry]) -> list[RecordLevelEvent]:
    return [e.event for e in entries if isinstance(e.event, RecordLevelEvent)]


def _gaussian_groups(entries: Sequence[LedgerEntry]) -> Counter[float]:
    return Counter(_noise_multiplier(e.event) for e in entries if e.event.family == "rdp")
