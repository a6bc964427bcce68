"""Noise calibration and (ε, δ) accounting for Gaussian releases, by Google's dp-accounting.

The noise multiplier z of a release is σ / Δ, with Δ the L2 sensitivity of the
clipped update (:func:`mechanisms.clipping.l2_sensitivity`); the release is then
dp-accounting's ``GaussianDpEvent(z)``, and ``k`` releases are
``SelfComposedDpEvent(GaussianDpEvent(z), k)``. Because Δ already covers replace-one
neighbours, the accountant's neighbouring relation does not enter (for an unsampled
Gaussian of sensitivity 1 both directions of the privacy loss are the same).

Two of dp-accounting's accountants compose these events, and each gives an ε that is a
valid upper bound at δ for their adaptive composition (dp-accounting's
``ComposedDpEvent`` and ``SelfComposedDpEvent`` are defined as possibly adaptive):

* ``RdpAccountant`` (Rényi DP, Mironov 2017), converted to (ε, δ):
  :func:`composed_gaussian_epsilon_rdp`;
* ``PLDAccountant`` (privacy loss distributions, Koskela et al.; Doroshenko et al.'s
  connect-the-dots discretisation) in its pessimistic mode, whose ε at δ is an upper
  bound ("when the rounding is pessimistic, the returned value corresponds to an epsilon
  for which the mechanism is (epsilon, delta)-differentially private", dp-accounting's
  ``PrivacyLossDistribution.get_epsilon_for_delta``): :func:`composed_gaussian_epsilon_pld`.
  The accountant builds ``k`` releases at z as one Gaussian of noise z/√k (exact for
  Gaussians), so a ledger of 1,000 releases costs one distribution, not 1,000
  compositions. Its discretisation interval is :func:`pld_discretization` (coarser for
  larger compositions, so that the cost stays bounded; still an upper bound).

The ledger charges the smaller of the two (:func:`composed_gaussian_epsilon`); the noise
multiplier is calibrated with RDP alone (:func:`calibrate_gaussian_noise_multiplier`), so a
release calibrated for a target ε is charged at most that ε.

dp-accounting takes about a second to import, so it is imported inside the
functions: the Laplace path never pays for it.
"""

from __future__ import annotations

import functools
import math
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
    """Compute the ε, at ``delta``, that a ledger charges for ``releases`` Gaussian releases.

    The smaller of the RDP and PLD bounds (:func:`composed_gaussian_epsilon`).

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
        min(ε_RDP, ε_PLD) from dp-accounting's ``RdpAccountant`` and ``PLDAccountant``.
    """
    z = check_positive_finite("noise_multiplier", noise_multiplier)
    k = check_positive_int("releases", releases)
    d = check_open_unit("delta", delta)
    return composed_gaussian_epsilon({z: k}, d)


def composed_gaussian_epsilon(releases: Mapping[float, int], delta: float) -> float:
    """ε at ``delta`` charged for Gaussian releases grouped as {noise multiplier: count}.

    ``min(ε_RDP, ε_PLD)``: both are upper bounds on the ε of the (adaptive) composition, so
    the smaller is too. Returns 0.0 for no releases.
    """
    return min(composed_gaussian_epsilons(releases, delta))


def composed_gaussian_epsilons(releases: Mapping[float, int], delta: float) -> tuple[float, float]:
    """Return ``(ε_RDP, ε_PLD)`` at ``delta`` of releases grouped as {noise multiplier: count}.

    ``(0.0, 0.0)`` for no releases.
    """
    groups = _groups(releases)
    d = check_open_unit("delta", delta)
    return _rdp_epsilon(groups, d), _pld_epsilon(groups, d)


def composed_gaussian_epsilon_rdp(releases: Mapping[float, int], delta: float) -> float:
    """ε at ``delta`` of Gaussian releases grouped as {noise multiplier: count}, by RDP.

    Each group is one ``SelfComposedDpEvent``, so hundreds of releases cost one
    RDP evaluation per distinct noise multiplier. Returns 0.0 for no releases.
    """
    return _rdp_epsilon(_groups(releases), check_open_unit("delta", delta))


def composed_gaussian_epsilon_pld(releases: Mapping[float, int], delta: float) -> float:
    """ε at ``delta`` of Gaussian releases grouped as {noise multiplier: count}, by PLD.

    dp-accounting's ``PLDAccountant`` (pessimistic estimate, the accountant's default) with
    the discretisation interval :func:`pld_discretization` of the groups, composing
    ``ComposedDpEvent([SelfComposedDpEvent(GaussianDpEvent(z), k), ...])`` (z ascending).
    Results are memoised (a charge asks for the same composition twice). Returns 0.0 for
    no releases.
    """
    return _pld_epsilon(_groups(releases), check_open_unit("delta", delta))


#: The finest PLD discretisation interval (dp-accounting's default).
PLD_FINEST_INTERVAL = 1e-4

#: About how many points a composed privacy loss distribution is discretised into.
PLD_POINTS = 20_000


def pld_discretization(releases: Mapping[float, int]) -> float:
    """Return the PLD discretisation interval for releases grouped as {z: count}.

    A Gaussian of sensitivity 1 and noise z/√k has privacy loss μX − μ²/2 with μ = √k/z,
    and dp-accounting truncates X at about ±14 (a mass of e⁻⁵⁰): its support is about
    μ² + 28μ wide. The interval is that width, summed over the groups, over
    :data:`PLD_POINTS`, and never below :data:`PLD_FINEST_INTERVAL`: the cost of a
    composition stays about the same however many releases it holds. Pessimistic
    rounding keeps every interval an upper bound; it adds at most about one interval per
    group to ε, which is below 0.05 % of ε here.
    """
    width = 0.0
    for z, k in _groups(releases):
        mu = math.sqrt(k) / z
        width += mu * mu + 28.0 * mu
    return max(PLD_FINEST_INTERVAL, width / PLD_POINTS)


def _groups(releases: Mapping[float, int]) -> tuple[tuple[float, int], ...]:
    return tuple(sorted((float(z), int(k)) for z, k in releases.items() if k > 0))


def _gaussian_groups_event(groups: tuple[tuple[float, int], ...]) -> object:
    import dp_accounting

    return dp_accounting.ComposedDpEvent(
        [dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(z), k)
         for z, k in groups]
    )


def _rdp_epsilon(groups: tuple[tuple[float, int], ...], delta: float) -> float:
    if not groups:
        return 0.0
    from dp_accounting.rdp import RdpAccountant

    return float(RdpAccountant().compose(_gaussian_groups_event(groups)).get_epsilon(delta))


@functools.lru_cache(maxsize=64)
def _pld_epsilon(groups: tuple[tuple[float, int], ...], delta: float) -> float:
    if not groups:
        return 0.0
    from dp_accounting.pld import PLDAccountant

    accountant = PLDAccountant(value_discretization_interval=pld_discretization(dict(groups)))
    return float(accountant.compose(_gaussian_groups_event(groups)).get_epsilon(delta))
