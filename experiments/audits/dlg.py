"""Gradient inversion against one Laplace-sanitized update: the DLG audit's victim and attacks.

The setting of 000 (Section 5.4, Fig. 5) and 001 (Fig. 5, Table 2) on
scikit-learn's 8×8 digits, in modules named after what they hold:

* `experiments.audits.dlg_victim`: the digits and their recogniser, the network, one client's SGD
  step, its Laplace release and what the server observes of it;
* `experiments.audits.dlg_objectives`: what each attack minimises (and iDLG's label reading);
* `experiments.audits.dlg_attacks`: the optimizers (L-BFGS, projected Adam), their effort, one
  attack;
* `experiments.audits.dlg_audit` (the audit loop) and `experiments.audits.dlg_report` (its tables,
  claims and figures of scores).

This module gathers their public names, so that
``from experiments.audits.dlg import attack, victim`` reads as one API.
"""

from __future__ import annotations

from experiments.audits.dlg_attacks import (
    ATTACKS,
    FULL,
    QUICK,
    SMOKE,
    Attack,
    Effort,
    Reconstruction,
    attack,
    one_thread,
    run_attacks,
)
from experiments.audits.dlg_objectives import (
    TV_WEIGHT,
    geiping_objective,
    idlg_label,
    likelihood_objective,
    prior_objective,
)
from experiments.audits.dlg_victim import (
    CLIENT_DEFAULT_MODE,
    IMAGE_SIDE,
    LEARNING_RATE,
    MODES,
    NUM_CLASSES,
    Digits,
    Observation,
    Victim,
    batched_gradients,
    digits,
    dlg_lenet,
    mechanism,
    observe,
    release,
    victim,
)

__all__ = [
    "ATTACKS",
    "CLIENT_DEFAULT_MODE",
    "FULL",
    "IMAGE_SIDE",
    "LEARNING_RATE",
    "MODES",
    "NUM_CLASSES",
    "QUICK",
    "SMOKE",
    "TV_WEIGHT",
    "Attack",
    "Digits",
    "Effort",
    "Observation",
    "Reconstruction",
    "Victim",
    "attack",
    "batched_gradients",
    "digits",
    "dlg_lenet",
    "geiping_objective",
    "idlg_label",
    "likelihood_objective",
    "mechanism",
    "observe",
    "one_thread",
    "prior_objective",
    "release",
    "run_attacks",
    "victim",
]
