"""``sim validate --against-vllm``: replay a case file through vLLM's real KV-cache manager
(``oracle.py`` of the optional vLLM oracle, ``$VLLM_ORACLE_DIR``, in its own venv) and report
every per-request disagreement with our cache model.  The translation and the comparison are
the differential tester's (``sim.oracle.kv_case``); only the oracle venv is needed."""
from __future__ import annotations

from sim.oracle.worker import OracleUnavailable

# the command's name for "no oracle here" (sim/entrypoints/cli.py prints it and exits 0)
ValidateUnavailable = OracleUnavailable


def validate_case(data: dict) -> dict:
    """``{"vllm", "status", "lookups", "mismatches": [(request, field, ours, vLLM)]}``;
    raises ``CaseError`` for a bad case (or a key the oracle has no counterpart for) and
    ``ValidateUnavailable`` where the oracle is absent."""
    from sim.cache.case import CaseError
    from sim.oracle import kv_case
    from sim.oracle.keys import OracleKeyError
    from sim.oracle.worker import start_oracle

    spec, ids = kv_case.case_to_spec(data)
    try:
        case = kv_case.to_oracle(spec)
    except OracleKeyError as e:
        raise CaseError(str(e)) from None
    oracle = start_oracle(kv_case.KV, batch=200)
    try:
        ans = oracle.run([case])[0]
        version = oracle.version
    finally:
        oracle.close()
    verdict = kv_case.compare(spec, kv_case.run_ours(spec), ans)
    names = {kv_case.request_id(i): rid for i, rid in enumerate(ids)}
    rows = [(names.get(m.request, m.request), m.field, m.ours, m.oracle)
            for m in verdict.mismatches]
    return {"vllm": version, "status": verdict.status, "lookups": verdict.checked,
            "mismatches": rows}
