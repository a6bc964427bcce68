"""gpfl: Flower strategies for clustered federated learning with locally private releases.

:class:`ClusteredStrategy` is the server side of Algorithm 1 (k hypotheses, k-means seeded with
them, per-cluster means) with the budget-aware aggregations of Wu, Xu, Zhu (2023) section 4
(:func:`budget_weights`). The math is pure functions on NumPy arrays, apart from Flower:
:mod:`strategies.clustering` (k-means seeded with the hypotheses) and
:mod:`strategies.aggregation` (weights, cluster means, sign vote). Every reply is screened
before it touches the model (:mod:`strategies.intake`: metrics, size, name binding, form,
magnitude). Everything it needs is given to its constructor: it imports no other gpfl package.
"""

from strategies.aggregation import AGGREGATIONS, budget_weights
from strategies.clustered import RELEASES, ClusteredStrategy
from strategies.norms import NormLimits
from strategies.records import ClientRecord, RoundRecord
from strategies.validation import check_reply

__all__ = [
    "AGGREGATIONS",
    "RELEASES",
    "ClientRecord",
    "ClusteredStrategy",
    "NormLimits",
    "RoundRecord",
    "budget_weights",
    "check_reply",
]
