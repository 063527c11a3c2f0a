"""The work behind each command (run, sweep, compare, steps, check, validate,
calibrate, search, capacity, events check/serve), called by ``sim.entrypoints``."""
