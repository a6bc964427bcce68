"""gpfl's experiments: the papers' reproductions, audits and benchmarks (``python -m experiments``).

Each experiment module declares an `experiments.runner.Experiment`: its grid of
configurations, the measurement that turns a finished one into a ``results.csv`` row, its
figures, and its own section of docs/RESULTS.md (``report``), which `experiments.report`
assembles. `experiments.runner.run` does the rest the same way for all of them.

* ``runner.py``: the loop, the progress lines, ``results.csv``;
* ``common.py``: the context an experiment runs in and the cache of federations;
* ``tables.py`` and ``figures.py``: reading runs and rows, drawing;
* ``cli.py``, ``report.py`` (which assembles each experiment's own section), ``claims.py``
  (how a claim and its interval are stated): the commands and the report;
* ``synthetic_ablation``, ``accuracy_vs_nu``, ``leakage``, ``fairness``,
  ``personalized_budgets`` (its results in ``personalized_budgets_report``), ``dlg_audit``
  (the victim, objectives and attacks in ``dlg_victim``, ``dlg_objectives``, ``dlg_attacks``;
  its results in ``dlg_report``), ``scale``: the experiments;
* ``budget_aggregation``: an experiment of the same runner with its own command line (not part
  of ``all``);
* ``bench_*``: stand-alone benchmark scripts with their own command lines.
"""
