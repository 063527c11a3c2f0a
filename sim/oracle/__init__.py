"""The bridge to the vLLM oracle: vLLM 0.33.0's real KV-cache manager and scheduler.

The oracle is optional and not part of the project: a folder (``$VLLM_ORACLE_DIR``, default
``shared/vllm-oracle`` beside the checkout) with ``oracle.py`` and ``sched_oracle.py`` and a
venv of its own.  This package is everything on our side of it:

* ``worker``: finding the oracle and running its drivers in long-lived processes;
* ``keys``: the one table from our case keys to the drivers' case keys;
* ``segments``: prompts as stream segments, and the literal token ids both sides get;
* ``kv_case`` / ``step_case``: one case on both sides, compared (``sim case`` against
  ``oracle.py``; ``sim steps`` against ``sched_oracle.py``);
* ``harness``: generate -> translate -> run both -> compare -> shrink, the loop both
  differential testers (``tools/diff_vllm.py``, ``tools/diff_steps.py``) are adapters on.

``sim validate --against-vllm`` uses ``kv_case`` and ``worker``.  Nothing here is imported
by the simulator itself.
"""
from __future__ import annotations

from sim.oracle.harness import Mismatch, Summary, Tester, Verdict, run_both, shrink
from sim.oracle.keys import KEYS, KV, STEPS, OracleKeyError, from_oracle_config, to_oracle_config
from sim.oracle.worker import (
    OraclePool,
    OracleUnavailable,
    OracleWorker,
    default_oracle_dir,
    default_oracle_python,
    oracle_unavailable,
    start_oracle,
)

__all__ = [
    "KEYS", "KV", "STEPS", "Mismatch", "OraclePool", "OracleKeyError", "OracleUnavailable",
    "OracleWorker", "Summary", "Tester", "Verdict", "default_oracle_dir",
    "default_oracle_python", "from_oracle_config", "oracle_unavailable", "run_both", "shrink",
    "start_oracle", "to_oracle_config",
]
