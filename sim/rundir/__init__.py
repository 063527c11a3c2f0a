"""The run-folder contract: what a run folder holds (records, tables, CSV and JSON
writers and readers, provenance, atomic writes, KV-event files). Reports read runs
through this room and never through ``sim.commands``."""
