"""gpfl.mechanisms: local-privacy mechanisms, their accounting and the client's ledger.

Pure NumPy/SciPy plus Google's dp-accounting; never Flower, never torch. Importing
this package is cheap: dp-accounting (about a second) is imported only when a
Gaussian or sign mechanism is built or such releases are composed, SciPy only by
the sign mechanism.

The ledger is :mod:`mechanisms.accountant` (pure composition and the cap),
:mod:`mechanisms.ledger_store` (the crash-safe file; its refusals in
:mod:`mechanisms.ledger_errors`) and :mod:`mechanisms.ledger` (:class:`PrivacyLedger`,
the façade a client uses). Rendering a ledger for people belongs to whoever shows it
(the CLI), not here.
"""

from mechanisms.base import Mechanism, cast_release
from mechanisms.calibration import calibrate_gaussian_noise_multiplier, gaussian_epsilon
from mechanisms.clipping import (
    clip_elementwise,
    clip_l2,
    hypotheses_diameter,
    l2_sensitivity,
)
from mechanisms.events import (
    FAMILIES,
    GaussianReleaseEvent,
    MetricPrivacyEvent,
    NeighbourhoodEvent,
    NonPrivateEvent,
    PrivacyEvent,
    RecordLevelEvent,
    SignReleaseEvent,
    event_from_dict,
)
from mechanisms.gaussian import GaussianMechanism
from mechanisms.laplace import EuclideanLaplace, sample_euclidean_laplace
from mechanisms.ledger import (
    BudgetExceededError,
    LedgerCorruptError,
    LedgerEntry,
    LedgerMissingError,
    LedgerRollbackError,
    LedgerUnavailableError,
    PrivacyLedger,
    Spend,
)
from mechanisms.none import NoMechanism
from mechanisms.rng import device_rng, make_rng, seeded_rng
from mechanisms.sign import StochasticSign

__all__ = [
    "FAMILIES",
    "BudgetExceededError",
    "EuclideanLaplace",
    "GaussianMechanism",
    "GaussianReleaseEvent",
    "LedgerCorruptError",
    "LedgerEntry",
    "LedgerMissingError",
    "LedgerRollbackError",
    "LedgerUnavailableError",
    "Mechanism",
    "MetricPrivacyEvent",
    "NeighbourhoodEvent",
    "NoMechanism",
    "NonPrivateEvent",
    "PrivacyEvent",
    "PrivacyLedger",
    "RecordLevelEvent",
    "SignReleaseEvent",
    "Spend",
    "StochasticSign",
    "calibrate_gaussian_noise_multiplier",
    "cast_release",
    "clip_elementwise",
    "clip_l2",
    "device_rng",
    "event_from_dict",
    "gaussian_epsilon",
    "hypotheses_diameter",
    "l2_sensitivity",
    "make_rng",
    "sample_euclidean_laplace",
    "seeded_rng",
]
