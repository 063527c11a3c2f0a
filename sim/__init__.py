"""hybrid-cache-sim: exact vLLM hybrid prefix caching, replayed over traces."""
from sim import native as _native

_native.select()   # compiled hot path when its build matches the sources (sim/native.py)
