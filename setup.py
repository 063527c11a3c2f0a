"""Build hook: compile the simulation hot path with mypyc.

The modules listed in ``sim/native.py`` (cache core and engine) are ordinary
type-annotated Python; mypyc turns them into C extensions that run the same code
about twice as fast (``bench/sim_bench.py`` measures it).  The SHA-256 of each
compiled source goes to ``sim/_native_build.json`` so that ``sim/native.py`` runs
the source instead whenever a file changed after the build.

``HCS_PURE=1 pip install ...`` builds nothing (pure Python, same results).
Everything else about the package is in ``pyproject.toml``.
"""
from __future__ import annotations

import json
import os
import runpy
from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).resolve().parent
native = runpy.run_path(str(ROOT / "sim" / "native.py"))
manifest = ROOT / "sim" / native["MANIFEST"]

ext_modules = []
if os.environ.get("HCS_PURE", "") not in ("", "0"):
    # a pure install: drop the manifest and any extension an earlier build left
    # beside the sources (sim/native.py would distrust them anyway)
    manifest.unlink(missing_ok=True)
    for m in native["NATIVE_MODULES"]:
        src = native["source_path"](m, ROOT)
        for ext in src.parent.glob(src.stem + ".*.so"):
            ext.unlink()
    for shared in ROOT.glob("*__mypyc.*.so"):
        shared.unlink()
else:
    from mypyc.build import mypycify

    import mypy.version

    sources = [str(native["source_path"](m, ROOT).relative_to(ROOT))
               for m in native["NATIVE_MODULES"]]
    ext_modules = mypycify(sources, opt_level="3")
    manifest.write_text(json.dumps({
        "compiler": f"mypyc {mypy.version.__version__}",
        "modules": native["source_hashes"](ROOT),
    }, indent=1, sort_keys=True) + "\n")

setup(ext_modules=ext_modules)
