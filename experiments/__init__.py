"""gpfl's experiments: the papers' reproductions, audits and benchmarks (``python -m experiments``).

Each experiment module declares an `experiments.core.runner.Experiment`: its grid of
configurations, the measurement that turns a finished one into a ``results.csv`` row, its
figures, and its own section of docs/RESULTS.md (``report``), which `experiments.core.report`
assembles. `experiments.core.runner.run` does the rest the same way for all of them.

* ``core``: what every experiment shares and imports: the loop (``runner``), the context and the
  cache of federations (``common``), rows and drawing (``tables``, ``figures``), how a claim is
  stated (``claims``), devices for a strategy driven in process (``in_process``), the list of
  experiments (``registry``), the report that assembles their sections (``report``) and the
  runner of several at once (``jobs``); it imports no experiment;
* ``reproductions``: the papers' experiments (``synthetic_ablation``, ``accuracy_vs_nu``,
  ``leakage``, ``fairness``, ``personalized_budgets``, ``small_federations``,
  ``digits_server_update``, ``record_clipping``), and ``budget_aggregation`` and
  ``tabular_seeds`` with command lines of their own;
* ``audits``: privacy audits and attacks (the DLG audit ``dlg_*``, ``empirical_privacy`` with
  ``privacy_audit`` and ``record_audit``, ``lowbit_audit``, ``mia``, ``rogue_devices``);
* ``benchmarks``: ``scale`` and the stand-alone ``bench_*`` scripts, ``bench_suite`` running
  them all (``python -m experiments bench``), and Flower's FedAvg yardstick
  (``fedavg_baseline``);
* ``cli``: ``python -m experiments NAME``, above all of them.

Every federation runs through ``deploy.launcher.launch``, on the direct engine or Flower's
Simulation Engine.

The three kinds import ``core``, never each other; ``core`` imports none of them (the registry
names their modules, loaded when asked).
"""
