"""gpfl: Flower strategies for clustered federated learning with locally private releases.

:class:`ClusteredStrategy` is the server side of Algorithm 1 (k hypotheses, k-means seeded with
them, per-cluster means) with the budget-aware aggregations of Wu, Xu, Zhu (2023) section 4
(:func:`budget_weights`). Everything it needs is given to its constructor: it imports no other
gpfl package.
"""

from strategies.aggregation import AGGREGATIONS, budget_weights
from strategies.clustered import RELEASES, ClientRecord, ClusteredStrategy, RoundRecord
from strategies.validation import check_reply

__all__ = [
    "AGGREGATIONS",
    "RELEASES",
    "ClientRecord",
    "ClusteredStrategy",
    "RoundRecord",
    "budget_weights",
    "check_reply",
]
