"""Build hook: compile the simulation hot path with mypyc.

The modules listed in ``sim/native.py`` (cache core and engine) are ordinary
type-annotated Python; mypyc turns them into C extensions that run the same code
about seven times as fast (``bench/sim_bench.py`` measures it).  The SHA-256 of each
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
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
native = runpy.run_path(str(ROOT / "sim" / "native.py"))
manifest = ROOT / "sim" / native["MANIFEST"]

ext_modules = []
if os.environ.get("HCS_PURE", "") not in ("", "0"):
    # a pure install: drop the manifest and any extension an earlier build left
    # beside the sources (sim/native.py would distrust them anyway)
    manifest.unlink(missing_ok=True)
    for m in native["NATIVE_MODULES"]:
        for ext in native["extensions"](m, ROOT):
            ext.unlink()
    for shared in ROOT.glob("*__mypyc.*.so"):
        shared.unlink()
else:
    from mypyc.build import mypycify

    import mypy.version

    sources = [str(native["source_path"](m, ROOT).relative_to(ROOT))
               for m in native["NATIVE_MODULES"]]
    # the hashes of the sources mypyc just read; recorded only once the extensions
    # exist (a failed build must leave no manifest: old extensions stay distrusted)
    compiled_hashes = native["source_hashes"](ROOT)
    compiler = f"mypyc {mypy.version.__version__}"
    manifest.unlink(missing_ok=True)
    ext_modules = mypycify(sources, opt_level="3")


class BuildExt(build_ext):
    """build_ext that records the manifest after a successful compile, and whose
    compiler failure says how to install without compiling."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as e:  # CompileError, a missing compiler or Python headers
            raise SystemExit(
                f"error: compiling the hot path with mypyc failed ({type(e).__name__}: {e}). "
                f"It needs a C compiler and the Python headers; or install the pure-Python "
                f"build (same results, ~7x slower): HCS_PURE=1 pip install ...") from e
        if not ext_modules:
            return
        text = json.dumps({"compiler": compiler, "modules": compiled_hashes},
                          indent=1, sort_keys=True) + "\n"
        manifest.write_text(text)                 # beside the sources (editable installs)
        if not self.inplace:                      # and into the wheel being built
            built = Path(self.build_lib) / "sim" / native["MANIFEST"]
            built.parent.mkdir(parents=True, exist_ok=True)
            built.write_text(text)


setup(ext_modules=ext_modules, cmdclass={"build_ext": BuildExt})
