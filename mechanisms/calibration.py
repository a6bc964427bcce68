"""Noise calibration and (ε, δ) accounting for Gaussian releases, by Google's dp-accounting.

The noise multiplier z of a release is σ / Δ, with Δ the L2 sensitivity of the
clipped update (:func:`mechanisms.clipping.l2_sensitivity`); the release is then
dp-accounting's ``GaussianDpEvent(z)``, and ``k`` releases are
``SelfComposedDpEvent(GaussianDpEvent(z), k)``, composed with its RDP accountant.
Because Δ already covers replace-one neighbours, the accountant's neighbouring
relation does not enter (for an unsampled Gaussian the RDP curve is α/(2z²) either way).

dp-accounting takes about a second to import, so it is imported inside the
functions: the Laplace path never pays for it.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

from mechanisms._validation import check_open_unit, check_positive_finite, check_positive_int


def calibrate_gaussian_noise_multiplier(epsilon: float, delta: float, releases: int) -> float:
    """Smallest noise multiplier whose ``releases`` compositions stay within (ε, δ).

    Uses ``dp_accounting.calibrate_dp_mechanism`` with a fresh ``RdpAccountant``
    and ``SelfComposedDpEvent(GaussianDpEvent(z), releases)``; the result
    composes to an ε at most ``epsilon`` (and within a relative 1e-4 of it in
    practice). Results are memoised per (ε, δ, releases).

    Parameters
    ----------
    epsilon : float
        Target ε after all releases, > 0 and finite.
    delta : float
        Target δ, in (0, 1).
    releases : int
        Planned number of releases, >= 1.

    Returns
    -------
    float
        The noise multiplier z = σ / Δ.
    """
    return _calibrate(
        check_positive_finite("epsilon", epsilon),
        check_open_unit("delta", delta),
        check_positive_int("releases", releases),
    )


@functools.lru_cache(maxsize=256)
def _calibrate(epsilon: float, delta: float, releases: int) -> float:
    import dp_accounting
    from dp_accounting.rdp import RdpAccountant

    def make_event(z: float) -> dp_accounting.DpEvent:
        return dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(z), releases)

    z = dp_accounting.calibrate_dp_mechanism(RdpAccountant, make_event, epsilon, delta)
    return float(z)


def gaussian_epsilon(noise_multiplier: float, releases: int, delta: float) -> float:
    """Compute the ε, at ``delta``, of ``releases`` Gaussian releases (RDP).

    Parameters
    ----------
    noise_multiplier : float
        z = σ / Δ, > 0 and finite.
    releases : int
        Number of releases, >= 1.
    delta : float
        In (0, 1).

    Returns
    -------
    float
        ε from dp-accounting's ``RdpAccountant``.
    """
    z = check_positive_finite("noise_multiplier", noise_multiplier)
    k = check_positive_int("releases", releases)
    d = check_open_unit("delta", delta)
    return composed_gaussian_epsilon({z: k}, d)


def composed_gaussian_epsilon(releases: Mapping[float, int], delta: float) -> float:
    """ε at ``delta`` of Gaussian releases grouped as {noise multiplier: count} (RDP).

    Each group is one ``SelfComposedDpEvent``, so hundreds of releases cost one
    RDP evaluation per distinct noise multiplier. Returns 0.0 for no releases.
    """
    groups = {float(z): int(k) for z, k in releases.items() if k > 0}
    if not groups:
        return 0.0
    import dp_accounting
    from dp_accounting.rdp import RdpAccountant

    event = dp_accounting.ComposedDpEvent(
        [
            dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(z), k)
            for z, k in sorted(groups.items())
        ]
    )
    return float(RdpAccountant().compose(event).get_epsilon(delta))
