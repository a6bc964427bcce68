"""The ranges and allowed value sets of gpfl's settings, each declared once.

:mod:`settings.declarations` bounds its settings with these; the packages that implement a value
set import it from here (``mechanisms`` imports no gpfl package and keeps its own tuples, which
``tests/test_settings_rules.py`` ties to these). Imports nothing.
"""

from __future__ import annotations

# ------------------------------------------------------------------------------ ranges
# Every number a server sends is bounded here, so that no value derived from it on a device
# (noise scales, radii, costs, training steps) can overflow, underflow to zero or exhaust the
# device: ν·‖δ‖ stays far below float64's 1.8e308 for any model values a device accepts
# (max-parameter), and an epsilon of 1e6 already means "no privacy" for any model.
#: The largest privacy parameter (ν, ε, radius, clip) a run may ask for.
MAX_PRIVACY_PARAMETER = 1e6
#: The largest local step: beyond it SGD diverges on any task (a diverged model is released as
#: the hypothesis plus noise, see client.release).
MAX_LEARNING_RATE = 1e3
#: The most local epochs of one round (a device's round time grows with them).
MAX_EPOCHS = 10_000
#: The largest count of rounds, samples, users, batch or planned releases.
MAX_COUNT = 10_000_000
#: The most hypotheses an instruction may carry (a device bounds it lower: max-hypotheses).
MAX_HYPOTHESES = 1_000
#: The largest magnitude of a coordinate of an optimum of the generated tasks (and of a public
#: feature mean of the tabular task).
MAX_OPTIMUM = 1e6
#: The widest hidden layer of the tabular MLP (its memory is the device's).
MAX_HIDDEN_UNITS = 10_000
#: The most DP-SGD steps of one record-level release (a device's round time grows with them).
MAX_RECORD_STEPS = 100_000

# ------------------------------------------------------------------------------ value sets
#: The mechanisms a run may ask for and a device may allow.
MECHANISMS = ("laplace", "gaussian", "sign", "none", "dpsgd")
#: Record-level clipping strategies (mechanisms.record_clipping.CLIPPING_STRATEGIES implements
#: these; tests/test_record_clipping.py ties the two).
RECORD_CLIPPING = ("fixed", "quantile", "oso")
#: The neighbouring relations a record-level guarantee is stated under.
RECORD_RELATIONS = ("add-remove", "replace-one")
#: How a cluster's releases are weighted (strategies.aggregation implements each).
AGGREGATIONS = ("mean", "weighted", "probability", "inverse-variance")
#: What the server sees of a round's releases (strategies.secure for secure-clusters).
AGGREGATION_PRIVACY = ("per-device", "secure-clusters")
#: The largest SecAgg+ cohort: Flower's sum of the participants' weights (2^22 each, the
#: quantization range) must stay below its modulus, 2^32.
MAX_COHORT = 1023
#: How a hypothesis moves toward its cluster's aggregate (strategies.server_update).
SERVER_UPDATES = ("mean", "step", "anneal", "plateau")
#: What a cluster of releases becomes (strategies.robust implements each).
CLUSTER_AGGREGATORS = ("mean", "clipped-mean", "median", "trimmed-mean", "krum")
#: Clipping of a Gaussian/sign update. mechanisms.clipping.CLIP_MODES implements these and is
#: the same tuple, declared again there because neither package may import the other (the
#: import contract in pyproject.toml); tests/test_settings_rules.py checks they are equal.
CLIP_MODES = ("l2", "elementwise")
#: What keys each round's draw of devices (strategies.device_keys).
SAMPLE_BY = ("node", "name")
#: What identifies a device across restarts (strategies.identity).
NODE_IDENTITY = ("name", "key")
