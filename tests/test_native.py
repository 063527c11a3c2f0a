"""The mypyc-compiled hot path: chosen only when it matches the sources, and it
gives byte-identical results to the Python source it was compiled from."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sim import native

ROOT = Path(__file__).resolve().parents[1]


def _fake_tree(tmp_path: Path, with_ext: bool = True, manifest: bool = True) -> Path:
    """A copy of the compiled modules' sources, fake extension files and a manifest."""
    for m in native.NATIVE_MODULES:
        src = native.source_path(m, ROOT)
        dst = native.source_path(m, tmp_path)
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(src, dst)
        if with_ext:
            dst.with_name(dst.stem + ".cpython-311-x86_64-linux-gnu.so").write_bytes(b"")
    if manifest:
        (tmp_path / "sim" / native.MANIFEST).write_text(json.dumps(
            {"compiler": "test", "modules": native.source_hashes(tmp_path)}))
    return tmp_path


def test_the_compiled_set_is_the_cache_and_the_engine():
    """The design rule (issue #39): only ``sim/cache`` and ``sim/engine`` are compiled.  Hot
    code at an edge runs there as the compiled twin of a plain reference kept at the edge
    (``sim/engine/codecs.py``, ``sim/engine/step_cost.py``), and the codecs import nothing of
    the project (the edges call them: nothing of the cache is loaded through them)."""
    import ast

    outside = [m for m in native.NATIVE_MODULES
               if not m.startswith(("sim.cache.", "sim.engine."))]
    assert outside == []
    assert {"sim.engine.codecs", "sim.engine.step_cost"} <= set(native.NATIVE_MODULES)
    tree = ast.parse(native.source_path("sim.engine.codecs", ROOT).read_text())
    ours = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
            and (n.module or "").split(".")[0] in ("sim", "backends", "workloads", "reports")]
    ours += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
             if a.name.split(".")[0] in ("sim", "backends", "workloads", "reports")]
    assert ours == []


def test_fresh_build_is_usable(tmp_path):
    root = _fake_tree(tmp_path)
    assert native.build_state(root) == (True, "compiled build matches the sources")


def test_an_edited_source_makes_the_build_stale(tmp_path):
    root = _fake_tree(tmp_path)
    p = native.source_path("sim.engine.scheduler", root)
    p.write_text(p.read_text() + "\n# edited\n")
    usable, why = native.build_state(root)
    assert not usable
    assert "sim/engine/scheduler.py changed since the compiled build (1 module(s))" in why


def test_extensions_without_manifest_are_not_trusted(tmp_path):
    usable, why = native.build_state(_fake_tree(tmp_path, manifest=False))
    assert not usable and "_native_build.json" in why


def test_a_missing_extension_is_an_incomplete_build(tmp_path):
    root = _fake_tree(tmp_path)
    next(native.source_path("sim.cache.split", root).parent.glob("split.*.so")).unlink()
    usable, why = native.build_state(root)
    assert not usable and "no extension for sim.cache.split" in why


def test_no_extensions_means_source(tmp_path):
    usable, why = native.build_state(_fake_tree(tmp_path, with_ext=False, manifest=False))
    assert not usable and why.startswith("no compiled build")


def test_manifest_hashes_are_sha256_of_the_sources(tmp_path):
    root = _fake_tree(tmp_path, with_ext=False, manifest=False)
    got = native.source_hashes(root)
    p = native.source_path("sim.cache.block_pool", root)
    assert got["sim.cache.block_pool"] == hashlib.sha256(p.read_bytes()).hexdigest()
    assert set(got) == set(native.NATIVE_MODULES)


def _sim(*args: str, mode: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, HCS_NATIVE=mode)
    return subprocess.run([sys.executable, "-m", "sim", *args], cwd=cwd, env=env,
                          capture_output=True, text=True)


def test_what_runs_follows_the_build_state():
    """In this process: the compiled modules are loaded exactly when the build is
    usable and not switched off (the finder neither forces the source on a fresh
    build nor lets a stale extension run)."""
    usable, _ = native.build_state()
    expect = "compiled" if usable and os.environ.get(native.ENV, "auto") != "0" else "source"
    assert native.mode() == expect
    import sim.engine.scheduler as s
    assert s.__file__.endswith(".py") == (expect == "source")


def test_bad_env_value_is_one_line_exit_2():
    env = dict(os.environ, HCS_NATIVE="fast")
    res = subprocess.run([sys.executable, "-c", "import sim"], env=env, cwd=ROOT,
                         capture_output=True, text=True)
    assert res.returncode == 2
    assert res.stderr == "error: HCS_NATIVE='fast': expected auto, 0 (source) or 1 (compiled)\n"


def test_env_zero_runs_the_source():
    res = subprocess.run([sys.executable, "-c", "import sim.native as n; print(n.describe())"],
                         env=dict(os.environ, HCS_NATIVE="0"), cwd=ROOT,
                         capture_output=True, text=True)
    assert res.returncode == 0 and res.stdout.strip() == "source (HCS_NATIVE=0)"


def test_a_recorded_fallback_says_what_to_do_by_its_cause(tmp_path):
    """A type-check failure is ours (see the install's errors); a compiler failure is the
    machine's (install one)."""
    manifest = tmp_path / "sim" / native.MANIFEST
    manifest.parent.mkdir(parents=True)
    for failed, advice in ((f"{native.TYPE_CHECK_FAILED} (exit 1; its errors are printed above)",
                            "`HCS_NATIVE=1 pip install -e .` shows the errors"),
                           ("CompileError: command 'gcc' failed", "install a C compiler")):
        manifest.write_text(json.dumps({"compiler": "mypyc", "failed": failed}))
        usable, why = native.build_state(tmp_path)
        assert not usable and f"({failed}); {advice}" in why


def _can_compile() -> bool:
    """A C compiler (the one Python was built with) and the Python headers are here."""
    import sysconfig
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    return shutil.which(cc) is not None and \
        (Path(sysconfig.get_paths()["include"]) / "Python.h").is_file()


@pytest.mark.skipif(not _can_compile(), reason="no C compiler or no Python headers here")
def test_a_machine_that_can_compile_was_not_given_the_source():
    """The install falls back to the pure-Python build where it cannot compile.  Where it
    can, a recorded failure is a bug of ours (a compiled module importing a package that
    pyproject's build-system requires lacks fails mypyc's type check) that would
    otherwise pass unseen: the suite runs the source, and the compiled-against-source
    test below skips."""
    failed = native._failed_compile(ROOT / "sim" / native.MANIFEST)
    assert failed is None, (f"the compile failed at install ({failed}); "
                            f"`HCS_NATIVE=1 pip install -e .` shows why")


@pytest.mark.skipif(not native.build_state()[0], reason="no usable compiled build "
                    "(installed with HCS_PURE=1 or sources edited since the build)")
def test_compiled_and_source_give_identical_outputs(tmp_path):
    """Same requests.csv byte for byte (athena-tiny, multi-turn, a Mooncake slice with the
    junction flag) and the same `sim steps` answers on the golden step cases."""
    runs = [("athena-tiny.yaml", []),
            ("multi-turn.yaml", ["--set", "workload.num_sessions=60"]),
            ("mooncake-conversation.yaml", ["--set", "workload.num_requests=400",
                                            "--set", "cache.enable_mamba_shared_prefix_checkpoint=true"])]
    for scenario, extra in runs:
        out = {}
        for mode in ("0", "1"):
            d = tmp_path / f"{scenario}-{mode}"
            res = _sim("run", f"scenarios/{scenario}", "--out", str(d), "--quiet", *extra,
                       mode=mode, cwd=ROOT)
            assert res.returncode == 0, res.stderr
            out[mode] = (d / "requests.csv").read_bytes()
        assert out["0"] == out["1"], scenario
        assert out["0"].count(b"\n") > 40   # (athena-tiny: 40 requests + header)
    cases = sorted(str(p) for p in (ROOT / "tests" / "golden" / "steps").glob("*.yaml"))
    got = {mode: _sim("steps", *cases, mode=mode, cwd=ROOT) for mode in ("0", "1")}
    assert got["0"].returncode == 0, got["0"].stderr
    assert got["0"].stdout == got["1"].stdout and len(got["0"].stdout) > 1000


def test_extension_found_by_listing_as_by_glob(tmp_path):
    """``has_extension`` (one listing a folder, shared) answers as ``extensions``'s globs
    (``stem.*.so`` / ``stem.*.pyd``) on names that match and names that nearly do."""
    from sim import native

    pkg = tmp_path / "sim" / "cache"
    pkg.mkdir(parents=True)
    for name in ("rules.py", "rules.cpython-311-x86_64-linux-gnu.so", "specs.py", "specs.so",
                 "key_map.py", "key_map.abi3.pyd", "hashing.py", "hashing2.cpython-311.so",
                 "prompt.py", "prompt..so"):
        (pkg / name).write_text("")
    listing: dict = {}
    for m in ("sim.cache.rules", "sim.cache.specs", "sim.cache.key_map", "sim.cache.hashing",
              "sim.cache.prompt", "sim.cache.request"):
        assert native.has_extension(m, tmp_path, listing) == bool(native.extensions(m, tmp_path)), m
    assert [m for m in ("sim.cache.rules", "sim.cache.specs", "sim.cache.key_map",
                        "sim.cache.prompt") if native.has_extension(m, tmp_path)] == \
        ["sim.cache.rules", "sim.cache.key_map", "sim.cache.prompt"]
