"""Build hook: compile the simulation hot path with mypyc.

The modules listed in ``sim/native.py`` (the cache core and the engine: ``sim/cache`` and
``sim/engine``, nothing else) are ordinary type-annotated Python; mypyc turns them into C
extensions that run the same code about seven times as fast (``bench/sim_bench.py``
measures it).  The SHA-256 of each
compiled source goes to ``sim/_native_build.json`` so that ``sim/native.py`` runs
the source instead whenever a file changed after the build.

``HCS_PURE=1 pip install ...`` builds nothing (pure Python, same results).  Where the
compile cannot run (no C compiler or Python headers) the install falls back to the same
pure-Python build with one warning, and records why in the manifest (``sim/native.py``
``describe()`` says it); ``HCS_NATIVE=1 pip install ...`` demands the compiled build
instead (a failed compile stops the install).
Everything else about the package is in ``pyproject.toml``.
"""
from __future__ import annotations

import json
import os
import runpy
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
native = runpy.run_path(str(ROOT / "sim" / "native.py"))
manifest = ROOT / "sim" / native["MANIFEST"]

ext_modules = []
compiler = "mypyc"
compiled_hashes: dict = {}
# install-time HCS_NATIVE=1: the compiled build or nothing (no pure-Python fallback)
DEMAND_NATIVE = os.environ.get("HCS_NATIVE", "").strip() == "1"


def _reason(error: BaseException) -> str:
    """One short line: the exception's type and message (a compiler command line is long:
    its start and its end, which says how it failed).  mypy exits (SystemExit) on type
    errors, which it prints above: a bug of ours, not of the machine (e.g. a compiled
    module importing a package missing from pyproject's build-system requires)."""
    if isinstance(error, SystemExit):
        failed = native["TYPE_CHECK_FAILED"]
        return f"{failed} (exit {error.code}; its errors are printed above)"
    msg = " ".join(str(error).split())
    if len(msg) > 160:
        msg = f"{msg[:80]} ... {msg[-60:]}"
    return f"{type(error).__name__}: {msg}"


def _fallback_message(error: BaseException) -> str:
    fix = ("please report it (the errors above say which module)" if isinstance(error, SystemExit)
           else "install a C compiler and the Python headers (e.g. apt-get install gcc "
                "python3-dev) and run pip install -e . again")
    return (f"hybrid-cache-sim: WARNING: could not compile the simulation hot path with mypyc "
            f"({_reason(error)}); installed the "
            f"pure-Python build instead: same results, ~7x slower. For the compiled build "
            f"{fix}; HCS_NATIVE=1 pip install ... stops the install when the compile fails.")


def _record_fallback(error: BaseException, build_lib: str | None = None) -> None:
    """The pure-Python fallback: say so on stderr and in the manifest, which
    ``sim/native.py`` reads to tell why the source runs."""
    print(_fallback_message(error), file=sys.stderr, flush=True)
    text = json.dumps({"compiler": compiler, "failed": _reason(error)}, indent=1,
                      sort_keys=True) + "\n"
    manifest.write_text(text)
    if build_lib is not None:
        built = Path(build_lib) / "sim" / native["MANIFEST"]
        built.parent.mkdir(parents=True, exist_ok=True)
        built.write_text(text)


def _drop_retired_extensions() -> None:
    """Remove the extensions an earlier build of ours wrote beside the sources of modules
    no longer compiled (its manifest names every module it compiled): Python imports an
    extension before its source, so one left there would shadow the module's new code."""
    try:
        built = json.loads(manifest.read_text()).get("modules") or {}
    except (OSError, ValueError, AttributeError):
        return
    for m in built:
        if m not in native["NATIVE_MODULES"]:
            for ext in native["extensions"](m, ROOT):
                ext.unlink()


if os.environ.get("HCS_PURE", "") not in ("", "0"):
    # a pure install: drop the manifest and any extension an earlier build left
    # beside the sources (sim/native.py would distrust them anyway)
    _drop_retired_extensions()
    manifest.unlink(missing_ok=True)
    for m in native["NATIVE_MODULES"]:
        for ext in native["extensions"](m, ROOT):
            ext.unlink()
    for shared in ROOT.glob("*__mypyc.*.so"):
        shared.unlink()
else:
    _drop_retired_extensions()
    sources = [str(native["source_path"](m, ROOT).relative_to(ROOT))
               for m in native["NATIVE_MODULES"]]
    # the hashes of the sources mypyc just read; recorded only once the extensions
    # exist (a failed build must leave no trusted manifest: old extensions stay distrusted)
    compiled_hashes = native["source_hashes"](ROOT)
    manifest.unlink(missing_ok=True)
    try:
        from mypyc.build import mypycify

        import mypy.version

        compiler = f"mypyc {mypy.version.__version__}"
        # the compiled modules are type-checked strictly; the modules they merely
        # import (sim.config, workloads' package init ...) are read for their types
        # but their own errors do not stop the build (they run interpreted anyway)
        ext_modules = mypycify(["--follow-imports=silent", *sources], opt_level="3")
    except (Exception, SystemExit) as e:  # noqa: BLE001 - mypyc missing or failing (mypy
        # exits on type errors): the pure build
        if DEMAND_NATIVE:
            raise
        _record_fallback(e)


# the packages whose bytecode an in-place (editable) build writes beside the sources
PACKAGES = ("sim", "backends", "workloads", "reports")


def _write_bytecode() -> None:
    """Compile the packages' modules to bytecode beside the sources, as pip does when it
    installs a wheel (an editable install does not): a run where Python writes no
    bytecode itself (``PYTHONDONTWRITEBYTECODE``, a read-only checkout, many containers)
    would otherwise compile every module it imports at each start (~45 ms of a
    ``sim run``'s imports, more in its report workers).  A source edited later makes
    its bytecode stale, and Python then ignores it."""
    import compileall

    for pkg in PACKAGES:
        compileall.compile_dir(str(ROOT / pkg), quiet=1)


class BuildExt(build_ext):
    """build_ext that records the manifest after a successful compile, and whose
    compiler failure says how to install without compiling; an in-place build also
    writes the packages' bytecode (``_write_bytecode``)."""

    def run(self) -> None:
        if self.inplace:
            _write_bytecode()
        if not ext_modules:
            return
        print(f"hybrid-cache-sim: compiling the simulation hot path ({len(ext_modules)} "
              f"extensions) with {compiler} and the C compiler, about 90 s "
              f"(HCS_PURE=1 skips it: pure Python, ~7x slower)", file=sys.stderr, flush=True)
        try:
            super().run()
        except Exception as e:  # CompileError, a missing compiler or Python headers
            if DEMAND_NATIVE:
                raise SystemExit(
                    f"error: compiling the hot path with mypyc failed ({type(e).__name__}: {e}). "
                    f"It needs a C compiler and the Python headers; HCS_NATIVE=1 demands the "
                    f"compiled build (without it the install falls back to the pure-Python "
                    f"build: same results, ~7x slower)") from e
            _record_fallback(e, None if self.inplace else self.build_lib)
            return
        text = json.dumps({"compiler": compiler, "modules": compiled_hashes},
                          indent=1, sort_keys=True) + "\n"
        manifest.write_text(text)                 # beside the sources (editable installs)
        if not self.inplace:                      # and into the wheel being built
            built = Path(self.build_lib) / "sim" / native["MANIFEST"]
            built.parent.mkdir(parents=True, exist_ok=True)
            built.write_text(text)


setup(ext_modules=ext_modules, cmdclass={"build_ext": BuildExt})
