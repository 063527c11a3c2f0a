"""Which build of the hot path runs: the mypyc-compiled one or the Python source.

The cache core and the engine (``NATIVE_MODULES``) are plain, type-annotated
Python.  ``pip install`` compiles them with mypyc (``setup.py``) into extension
modules that sit beside the sources and run the *same* code about twice as fast;
``HCS_PURE=1 pip install ...`` skips that.  The build records the SHA-256 of each
compiled source in ``sim/_native_build.json``.

Python would import an extension module in preference to its ``.py`` whenever
both exist, so an edited source would silently keep running the old compiled
code.  ``select()`` (called by ``sim/__init__.py`` before anything else of the
package is imported) prevents that: the compiled modules are used only when the
manifest exists and every recorded hash matches the source on disk; otherwise a
finder placed first on ``sys.path``'s search loads every listed module from its
``.py`` — all of them, because compiled modules call each other directly in C
and a mix could still run a stale one.

``HCS_NATIVE`` chooses at run time: ``auto`` (default: compiled when fresh),
``0`` (always the source, e.g. to profile with cProfile or to debug), ``1``
(require the compiled build; an error says why it cannot be used).
This module must stay dependency-free: ``setup.py`` reads it before anything is
installed.
"""
from __future__ import annotations

import hashlib
import importlib.abc
import importlib.util
import json
import os
import sys
from pathlib import Path

# modules compiled by setup.py (the simulation hot path)
NATIVE_MODULES = (
    "sim.cache.rules",
    "sim.cache.observers",
    "sim.cache.events",
    "sim.cache.specs",
    "sim.cache.key_map",
    "sim.cache.block_pool",
    "sim.cache.mirror_pool",
    "sim.cache.utility_pool",
    "sim.cache.hashing",
    "sim.cache.prompt",
    "sim.cache.request",
    "sim.cache.managers",
    "sim.cache.mamba_manager",
    "sim.cache.coordinator",
    "sim.cache.kv_manager",
    "sim.cache.split",
    "sim.cache.evictions",
    "sim.cache.attribution",
    "sim.cache.offload_pool",
    "sim.cache.offload_jobs",
    "sim.cache.offload_lookup",
    "sim.cache.offload_store",
    "sim.cache.offload",
    "sim.engine.step_plan",
    "sim.engine.step_cost",
    "sim.engine.request",
    "sim.engine.active_sequences",
    "sim.engine.observers",
    "sim.engine.scheduler",
    "sim.engine.tiered_scheduler",
    "sim.engine.arrivals",
    "sim.engine.gate",
    "sim.engine.engine",
    "sim.engine.record",
    "sim.engine.door",
    "sim.engine.codecs",
)
MANIFEST = "_native_build.json"
ENV = "HCS_NATIVE"
# how setup.py records a fallback caused by mypy's type errors (a bug of ours, not of the
# machine): the start of the manifest's "failed" reason
TYPE_CHECK_FAILED = "mypyc's type check failed"

_ROOT = Path(__file__).resolve().parent.parent   # the directory holding the sim package


def source_path(module: str, root: Path = _ROOT) -> Path:
    return root.joinpath(*module.split(".")).with_suffix(".py")


def source_hashes(root: Path = _ROOT) -> dict[str, str]:
    """SHA-256 of each compiled module's source, as the build records it."""
    return {m: hashlib.sha256(source_path(m, root).read_bytes()).hexdigest()
            for m in NATIVE_MODULES}


def extensions(module: str, root: Path = _ROOT) -> list[Path]:
    """Compiled extensions of ``module`` lying beside its source."""
    src = source_path(module, root)
    return [*src.parent.glob(src.stem + ".*.so"), *src.parent.glob(src.stem + ".*.pyd")]


def _is_extension(name: str, stem: str) -> bool:
    """Whether a file ``name`` matches ``stem.*.so`` or ``stem.*.pyd`` (``extensions``)."""
    return name.startswith(stem + ".") and name[len(stem) + 1:].endswith((".so", ".pyd"))


def has_extension(module: str, root: Path = _ROOT, listing: dict | None = None) -> bool:
    """Whether ``module`` has a compiled extension beside its source; ``listing``: a
    cache of folder listings shared by several calls (one ``os.listdir`` a folder,
    not two globs a module: every ``import sim`` asks this of each compiled module)."""
    src = source_path(module, root)
    folder = str(src.parent)
    if listing is None:
        listing = {}
    if folder not in listing:
        try:
            listing[folder] = os.listdir(folder)
        except OSError:
            listing[folder] = []
    return any(_is_extension(n, src.stem) for n in listing[folder])


def _failed_compile(manifest: Path) -> str | None:
    """The reason ``setup.py`` recorded when it fell back to the pure-Python build."""
    try:
        failed = json.loads(manifest.read_text()).get("failed")
    except (OSError, ValueError, AttributeError):
        return None
    return str(failed) if failed else None


def build_state(root: Path = _ROOT) -> tuple[bool, str]:
    """(usable, why): whether the compiled build exists and matches the sources."""
    manifest = root / "sim" / MANIFEST
    failed = _failed_compile(manifest)
    if failed:
        fix = ("`HCS_NATIVE=1 pip install -e .` shows the errors"
               if failed.startswith(TYPE_CHECK_FAILED)
               else "install a C compiler and the Python headers and rerun `pip install -e .` "
                    "for the compiled build")
        return False, (f"pure-Python build, ~7x slower: the compile failed at install "
                       f"({failed}); {fix}")
    listing: dict = {}
    missing = [m for m in NATIVE_MODULES if not has_extension(m, root, listing)]
    if len(missing) == len(NATIVE_MODULES):
        return False, "no compiled build (installed with HCS_PURE=1, or not built)"
    try:
        recorded = json.loads(manifest.read_text())["modules"]
    except (OSError, ValueError, KeyError, TypeError):
        return False, f"compiled modules without a readable {manifest.name}; rebuild"
    if missing:
        return False, f"compiled build incomplete (no extension for {missing[0]}); rebuild"
    current = source_hashes(root)
    changed = [m for m in NATIVE_MODULES if recorded.get(m) != current[m]]
    if changed:
        return False, (f"{source_path(changed[0], root).relative_to(root)} changed since the "
                       f"compiled build ({len(changed)} module(s)); `pip install -e .` recompiles")
    return True, "compiled build matches the sources"


class _SourceFinder(importlib.abc.MetaPathFinder):
    """Loads the listed modules from their ``.py`` files, never an extension."""

    def __init__(self, root: Path):
        self.root = root

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in NATIVE_MODULES:
            return None
        return importlib.util.spec_from_file_location(fullname, source_path(fullname, self.root))


def _fail(message: str) -> None:
    """A bad setting is bad input: one line on stderr, exit code 2."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def select() -> None:
    """Make the next imports of ``NATIVE_MODULES`` load the compiled build when it is
    usable (and wanted), else the source.  Idempotent; the decision lives in
    ``sys.meta_path`` (a module is imported once per interpreter anyway)."""
    want = os.environ.get(ENV, "auto").strip().lower()
    if want not in ("auto", "0", "1"):
        _fail(f"{ENV}={want!r}: expected auto, 0 (source) or 1 (compiled)")
    if any(isinstance(f, _SourceFinder) for f in sys.meta_path):
        return
    usable, why = build_state()
    if want == "1" and not usable:
        _fail(f"{ENV}=1 but the compiled build cannot be used: {why}")
    if want == "0" or not usable:
        loaded = [m for m in NATIVE_MODULES if m in sys.modules]
        if loaded:   # (cannot happen through sim/__init__.py, which calls this first)
            raise RuntimeError(f"{loaded[0]} was imported before sim.native.select()")
        sys.meta_path.insert(0, _SourceFinder(_ROOT))


def mode() -> str:
    """What this process runs: ``compiled`` or ``source`` (read off the loaded modules)."""
    import importlib

    files = [importlib.import_module(m).__file__ or "" for m in NATIVE_MODULES]
    return "source" if any(f.endswith(".py") for f in files) else "compiled"


def describe() -> str:
    """One line for benchmarks and reports: the build in use and why."""
    m = mode()
    if os.environ.get(ENV, "auto").strip().lower() == "0":
        return f"{m} ({ENV}=0)"
    usable, why = build_state()
    if m == "compiled":
        return f"compiled ({why})" if usable else \
            "compiled (its sources changed after this process loaded it)"
    return f"source ({why})" if not usable else f"source ({why}, but loaded as source)"
