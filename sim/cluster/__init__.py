"""A fleet: N replicas of one deployment on one SimPy clock behind a router.

Each replica is the single-replica simulator unchanged (its deployment, scheduler, cache
manager and backend, ``sim/commands/run.py``); the replicas share one heap of arrivals through a
``Gate`` (``sim/engine/gate.py``), and the router (``sim/cluster/routers/``) names the
replica each arrival goes to at its instant, seeing replicas only through read-only views
(``sim/cluster/view.py``).  ``fleet.py`` builds and runs it; ``outputs.py`` writes what a
fleet adds to the run folder.  As Vidur's global scheduler sits over unchanged replica
schedulers, remove the router and one replica runs exactly as alone.
"""
