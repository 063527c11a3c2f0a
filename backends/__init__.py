"""Step-time backends: ``analytical`` (a roofline, compiled with the hot path) and
``torch_backend`` (real kernels)."""
import sim  # noqa: F401  (sim.native picks the compiled or source build first)
