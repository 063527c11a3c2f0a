"""Write a folder atomically: build it under a temporary name beside the target and
rename it into place at the end; on any error nothing is left behind, so a failed
run never leaves partial outputs."""
from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_folder(out: str | Path):
    """``with atomic_folder(out) as tmp:`` write into ``tmp``; on success it becomes
    ``out`` (replacing an older one), on error it is removed."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        yield tmp
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
