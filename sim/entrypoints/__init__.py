"""Where a user comes in: the ``sim`` command line (one module per command group)
and the notebook API (``sim.run``, ``sim.load``, ``sim.sweep``, re-exported lazily
by ``sim/__init__.py``)."""
