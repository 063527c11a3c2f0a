"""Case files on disk: reading ``sim case`` / ``sim steps`` files for the commands.

The cache model (``sim/cache/case.py``) runs a case from its parsed mapping and knows
nothing about files; this module is the file side, through the project's one loader
(unreadable, non-UTF-8, duplicate keys and syntax errors name the file and line).
"""
from __future__ import annotations

from pathlib import Path

from sim.cache.case import CaseError, run_case_data
from sim.config.loader import load_file


def load_case_file(path: str | Path):
    """A case (or step case) file, YAML or JSON (``.json``)."""
    return load_file(path, CaseError)


def run_case_file(path: str | Path) -> list[dict]:
    """Run the case file at ``path`` (``sim case``): one result per request."""
    return run_case_data(load_case_file(path), source=str(path))
