"""gpfl deploy: running gpfl, on one machine or many.

The operator's side of a federation, beside the compose files and the container image that
run the same processes on many machines: ``gpfl launch`` (one machine's SuperLink, SuperNodes
and ServerApp, or Flower's Simulation Engine), ``gpfl submit`` and ``gpfl serverapp`` (a run on
a deployed SuperLink), the processes' supervision and watchdog, certificates, the SuperLink's
persistent state, joining a Ray cluster, the budget plan before a launch, and the ``gpfl``
command itself. The ServerApp (:mod:`server`) and the device's code (:mod:`client`) import
nothing from here.
"""
