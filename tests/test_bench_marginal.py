"""``bench/marginal.py``: how it reads callgrind_annotate's output and names what it
finds, and its bad input (one line, exit code 2).  The measurement itself (two whole
runs under callgrind, over a minute) is the script's output, not a test's."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "marginal.py"

_spec = importlib.util.spec_from_file_location("bench_marginal", SCRIPT)
marginal = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(marginal)

# the shape of `callgrind_annotate --auto=no --threshold=100` (valgrind 3.19), cut down
ANNOTATE = """\
--------------------------------------------------------------------------------
Profile data file 'callgrind.2000.out' (creator: callgrind-3.19.0)
--------------------------------------------------------------------------------
Events recorded:  Ir
--------------------------------------------------------------------------------
Ir
--------------------------------------------------------------------------------
1,699,632,729 (100.0%)  PROGRAM TOTALS

--------------------------------------------------------------------------------
Ir                    file:function
--------------------------------------------------------------------------------
152,112,677 ( 8.95%)  /tmp/py/Python-3.11.7/Python/ceval.c:_PyEval_EvalFrameDefault'2 [/usr/lib/libpython3.11.so.1.0]
 54,220,932 ( 3.19%)  /tmp/py/Python-3.11.7/Objects/obmalloc.c:_PyObject_Free [/usr/lib/libpython3.11.so.1.0]
  9,866,220 ( 0.58%)  /proj/build/__native_43682f.c:CPyDef_prompt___StreamRegistry___keys_of [/proj/43682f__mypyc.so]
  1,000,000 ( 0.06%)  /root/include/python3.11/object.h:CPyDef_prompt___StreamRegistry___keys_of
  3,118,376 ( 0.18%)  /tmp/env/mypyc/lib-rt/list_ops.c:CPyList_GetItem [/proj/43682f__mypyc.so]
  2,000,000 ( 0.12%)  /project/vecs/vec_template.c:VecI64_Append [/venv/librt/vecs.so]
    500,000 ( 0.03%)  ???:0x00000000000284f0 [???]
 58,777,470 ( 2.02%)  >   ???:0x0000000005f11620 (6,000x) [???]
    300,000 ( 0.02%)  => /x/__native_1.c:CPyDef_hashing___unit_end (16,471x)
"""


def test_annotate_lines_become_costs_per_function_summed_across_files():
    costs = marginal.parse_annotate(ANNOTATE)
    assert costs["PROGRAM TOTALS"] == 1_699_632_729
    key = "/proj/build/__native_43682f.c:CPyDef_prompt___StreamRegistry___keys_of"
    assert costs[key] == 9_866_220
    assert "???:0x0000000005f11620 (6,000x)" not in costs     # (a call-tree line)
    assert len(costs) == 8
    # one function inlined into another file keeps its name: summed by name later
    names = {marginal.name_of(f) for f in costs if "keys_of" in f}
    assert names == {"prompt.StreamRegistry.keys_of"}


def test_names_and_origins():
    assert marginal.name_of("/x/__native_1.c:CPyDef_scheduler___Scheduler___schedule") \
        == "scheduler.Scheduler.schedule"
    assert marginal.name_of("/p/Objects/obmalloc.c:_PyObject_Free'2") == "obmalloc.c:_PyObject_Free"
    assert marginal.origin_of("/x/__native_1.c:CPyDef_block_pool___BlockPool___touch") \
        == "ours: block_pool"
    assert marginal.origin_of("/inc/CPy.h:CPyDef_engine___Engine____jump_steps") == "ours: engine"
    assert marginal.origin_of("/tmp/py/Python-3.11.7/Objects/listobject.c:PyList_Append") \
        == "CPython runtime"
    assert marginal.origin_of("/tmp/env/mypyc/lib-rt/list_ops.c:CPyList_GetItem") == "mypyc runtime"
    assert marginal.origin_of("/project/vecs/vec_template.c:VecI64_Append") == "librt vecs"
    assert marginal.origin_of("???:0x00000000000284f0") == "other"


@pytest.mark.parametrize("args, words", [
    (["--low", "0"], "need 0 < --low < --high"),
    (["--low", "6000", "--high", "2000"], "need 0 < --low < --high"),
    (["--scenario", "nope.yaml"], "no such scenario: nope.yaml"),
    (["--top", "-1"], "--top must be >= 0"),
    (["--against-plain"], "give at least one --set"),
])
def test_bad_input_is_one_line_and_exit_2(args, words):
    res = subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 2, res.stderr
    assert res.stderr.count("\n") == 1 and words in res.stderr, res.stderr


def test_keep_never_overwrites_a_file(tmp_path):
    mine = tmp_path / "callgrind.2000.out"
    mine.write_text("the user's")
    res = subprocess.run([sys.executable, str(SCRIPT), "--keep", str(tmp_path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "exists" in res.stderr and res.stderr.count("\n") == 1
    assert mine.read_text() == "the user's"


def test_own_costs_add_up_per_name_inclusive_ones_take_the_largest_of_ours():
    costs = {"/b/__native_1.c:CPyPy_engine___Engine___run": 100.0,     # (the wrapper)
             "/b/__native_1.c:CPyDef_engine___Engine___run": 98.0,
             "/b/__native_1.c:CPyDef_engine___Engine___run'2": 60.0,   # (a deeper level)
             "/inc/CPy.h:CPyDef_engine___Engine___run": 5.0,           # (inlined lines)
             "/p/Python-3.11.7/Objects/call.c:PyObject_Call": 400.0}
    own = marginal.by_function(costs, inclusive=False)
    assert own == {"engine.Engine.run": 263.0, "call.c:PyObject_Call": 400.0}
    assert marginal.by_function(costs, inclusive=True) == {"engine.Engine.run": 100.0}
