"""gpfl server: the ServerApp.

The round's orchestration around the clustered strategy, the polling grid, the run's results
and checkpoint. Starting and watching the processes that run it is :mod:`deploy`'s.
"""
