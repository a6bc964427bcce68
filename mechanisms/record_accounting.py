"""The record-level (ε, δ) of DP-SGD releases, composed by dp-accounting's RDP accountant.

One :class:`~mechanisms.events.RecordLevelEvent` is ``steps`` Poisson-sampled Gaussian queries
(``PoissonSampledDpEvent(q, GaussianDpEvent(ν))``, the DP-SGD analysis of Abadi et al. and
Mironov et al.) and, when the device chose among k >= 2 hypotheses with its records, one
unsampled ``GaussianDpEvent`` for that report-noisy-min. Releases compose by RDP; the result is
reported at the ledger's δ.

The accountant's Poisson analysis is stated for add/remove neighbours. Under replace-one the
L2 sensitivity of every clipped sum doubles (004 ch. 5): the same queries are composed at half
the noise multiplier, which is how gpfl charges a replace-one guarantee.

dp-accounting is imported inside the functions (it takes about a second).
"""

from __future__ import annotations

from collections.abc import Iterable

from mechanisms._validation import check_open_unit
from mechanisms.events import RecordLevelEvent

__all__ = ["record_dp_event", "record_epsilon"]


def record_dp_event(event: RecordLevelEvent) -> object:
    """Return the dp-accounting event that ``event`` charges (see the module notes)."""
    import dp_accounting

    s = event.sensitivity_factor
    step = dp_accounting.PoissonSampledDpEvent(
        event.sampling_rate, dp_accounting.GaussianDpEvent(event.noise_multiplier / s))
    parts: list[dp_accounting.DpEvent] = [dp_accounting.SelfComposedDpEvent(step, event.steps)]
    if event.selection_noise_multiplier > 0.0:
        parts.append(dp_accounting.GaussianDpEvent(event.selection_noise_multiplier / s))
    return dp_accounting.ComposedDpEvent(parts)


def record_epsilon(events: Iterable[RecordLevelEvent], delta: float) -> float:
    """Return the RDP-composed record-level ε of ``events`` at ``delta`` (0.0 for none).

    Equal events are grouped (``SelfComposedDpEvent``), so a ledger of hundreds of releases
    costs one RDP evaluation per distinct event.
    """
    delta = check_open_unit("delta", delta)
    counts: dict[RecordLevelEvent, int] = {}
    for e in events:
        counts[e] = counts.get(e, 0) + 1
    if not counts:
        return 0.0
    import dp_accounting
    from dp_accounting.rdp import RdpAccountant

    composed = dp_accounting.ComposedDpEvent([
        dp_accounting.SelfComposedDpEvent(record_dp_event(e), k)
        for e, k in counts.items()])
    return float(RdpAccountant().compose(composed).get_epsilon(delta))
