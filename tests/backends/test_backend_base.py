"""backends/base.py: the backends stand apart from the engine (they read the step plan,
``sim/engine/step_plan.py``, re-exported by backends/base.py, nothing else), and the
registry by ``backend.kind``."""
from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from backends.base import BACKENDS, backend_factory
from sim.errors import ConfigError, InputError

ROOT = Path(__file__).resolve().parents[2]
BACKEND_FILES = sorted((ROOT / "backends").rglob("*.py"))
FORBIDDEN = ("sim.engine", "sim.commands.run", "sim.commands.steps")   # the engine, its scheduler, the assembly
# but the step plan, plain data kept beside the engine (as vLLM's SchedulerOutput), which
# backends/base.py re-exports: it imports nothing of the engine
ALLOWED = ("sim.engine.step_plan",)


def _imports(path: Path) -> list[str]:
    """Every module ``path`` imports, at any depth (``TYPE_CHECKING`` blocks and function
    bodies included), as absolute names."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:   # relative: resolve against the file's package
                pkg = path.relative_to(ROOT).parent.parts
                base = ".".join(pkg[:len(pkg) - node.level + 1])
                mod = f"{base}.{node.module}" if node.module else base
            else:
                mod = node.module or ""
            names.append(mod)
            names += [f"{mod}.{a.name}" for a in node.names]
    return names


def _python(code: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=300)


def test_no_backend_source_imports_the_engine_or_the_scheduler():
    assert len(BACKEND_FILES) >= 8   # base, analytical, the torch backend's modules
    bad = [(p.relative_to(ROOT).as_posix(), name) for p in BACKEND_FILES
           for name in _imports(p)
           if any(name == f or name.startswith(f + ".") for f in FORBIDDEN)
           and not any(name == a or name.startswith(a + ".") for a in ALLOWED)]
    assert bad == []
    # (the check sees what it must: the engine's request module imports the plan's item,
    # the scheduler the cache's manager, the backends' base the plan)
    req = _imports(ROOT / "sim" / "engine" / "request.py")
    sched = _imports(ROOT / "sim" / "engine" / "scheduler.py")
    base = _imports(ROOT / "backends" / "base.py")
    assert "sim.engine.step_plan.StepItem" in req and "sim.cache.kv_manager" in sched
    assert "sim.engine.step_plan.StepItem" in base
    # (and the plan itself imports nothing of the engine)
    plan = _imports(ROOT / "sim" / "engine" / "step_plan.py")
    assert not [n for n in plan if n.startswith("sim.engine")]


def test_importing_the_backends_loads_neither_the_engine_nor_the_scheduler():
    mods = ["backends.base", "backends.analytical"]
    try:
        import torch  # noqa: F401
        mods.append("backends.torch_backend.backend")
    except ImportError:
        pass
    r = _python("import sys\n"
                + "".join(f"import {m}\n" for m in mods)
                + "print(sorted(m for m in sys.modules if m.startswith(('sim.engine', "
                  "'sim.commands.run', 'sim.commands.steps'))))\n"
                  "print('backends.analytical' in sys.modules)")
    assert r.returncode == 0, r.stderr
    # (the step plan, re-exported by backends.base, and its package)
    assert r.stdout.split("\n")[:2] == ["['sim.engine', 'sim.engine.step_plan']", "True"]


def test_an_unknown_backend_kind_is_an_input_error_naming_backend_kind():
    with pytest.raises(InputError) as e:
        backend_factory("roofline2")
    assert isinstance(e.value, ConfigError) and e.value.field_name == "backend.kind"
    assert str(e.value) == ("backend.kind: unknown backend 'roofline2' "
                            "(available: analytical, torch)")


def test_the_registry_builds_the_analytical_backend_without_importing_torch():
    """``analytical`` is the deployment's cost model; torch's module is imported only when a
    torch run asks for it."""
    assert set(BACKENDS) == {"analytical", "torch"}
    r = _python("import sys\n"
                "from backends.base import build_backend\n"
                "from sim.config.scenario import load_scenario\n"
                "from sim.commands.run import build_deployment\n"
                "sc = load_scenario('scenarios/athena-tiny.yaml')\n"
                "dep = build_deployment(sc)\n"
                "b = build_backend(sc, dep)\n"
                "print(b is dep.cost, b.jumps, 'torch' in sys.modules)")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "True True False"


def test_a_torch_run_without_torch_says_how_to_install_it():
    r = _python("import sys\n"
                "sys.modules['torch'] = None      # as if torch were not installed\n"
                "from backends.base import backend_factory\n"
                "from sim.errors import ConfigError\n"
                "try:\n"
                "    backend_factory('torch')\n"
                "except ConfigError as e:\n"
                "    print(e)\n")
    assert r.returncode == 0, r.stderr
    msg = r.stdout.strip()
    assert msg.startswith("backend.kind: torch is not installed: ")
    assert 'pip install -e ".[torch]"' in msg and "download.pytorch.org/whl/cpu" in msg

