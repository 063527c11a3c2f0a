"""``sim ARGS`` in this process (the console entry point), for tests that only need the exit
code: faster than a subprocess, and the same code path."""
from __future__ import annotations

import os
from pathlib import Path


def run_sim(*args: str, cwd: Path) -> int:
    """Exit code of ``sim ARGS`` run from ``cwd`` (0 when it returns normally)."""
    from sim.entrypoints.cli import main

    old = os.getcwd()
    os.chdir(cwd)
    try:
        main(list(args))
        return 0
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 0
    finally:
        os.chdir(old)
