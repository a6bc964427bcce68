"""The experiments ``python -m experiments`` knows: each name, the module that declares it.

One list, in the order ``all`` runs them and docs/RESULTS.md shows them; the command line
(`experiments.cli`) and the report (`experiments.core.report`) both read it, so neither imports
the other. It names modules rather than importing them: an experiment module imports what its
federations need (torch, Opacus, scikit-learn), and ``python -m experiments NAME`` should load
the one it runs; :func:`load` imports it when asked. Each module declares ``EXPERIMENT``, an
`experiments.core.runner.Experiment`, which carries its own section of the report.
"""

from __future__ import annotations

import importlib

from experiments.core.runner import Experiment

__all__ = ["EXPERIMENTS", "load"]

#: Experiment name -> module (each declares ``EXPERIMENT``, an
#: `experiments.core.runner.Experiment`), in the order ``all`` runs them.
EXPERIMENTS: dict[str, str] = {
    "synthetic-ablation": "experiments.reproductions.synthetic_ablation",
    "accuracy-vs-nu": "experiments.reproductions.accuracy_vs_nu",
    "leakage": "experiments.reproductions.leakage",
    "fairness": "experiments.reproductions.fairness",
    "personalized-budgets": "experiments.reproductions.personalized_budgets",
    "dlg": "experiments.audits.dlg_audit",
    "scale": "experiments.benchmarks.scale",
    "empirical-privacy": "experiments.audits.empirical_privacy",
    "mia": "experiments.audits.mia",
    "small-federations": "experiments.reproductions.small_federations",
    "digits-server-update": "experiments.reproductions.digits_server_update",
    "rogue-devices": "experiments.audits.rogue_devices",
    "record-clipping": "experiments.reproductions.record_clipping",
    "secure-clusters": "experiments.reproductions.secure_clusters",
}


def load(name: str) -> Experiment:
    """Import the module of the experiment ``name`` and return its declaration."""
    experiment: Experiment = importlib.import_module(EXPERIMENTS[name]).EXPERIMENT
    return experiment
