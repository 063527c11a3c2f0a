"""Step-time backends: ``analytical`` (a roofline; the engine times it with its compiled
twin, ``sim/engine/step_cost.py``) and ``torch_backend`` (real kernels)."""
