"""``sim validate --against-vllm``: replay a case file through vLLM's real KV-cache
manager (``oracle.py`` of the optional vLLM oracle, ``$VLLM_ORACLE_DIR``, in its own venv) and report every
per-request disagreement with our cache model.  Reuses the differential tester's
machinery (``tools/diff_vllm.py``); needs a source checkout and the oracle venv."""
from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


class ValidateUnavailable(RuntimeError):
    """vLLM (the oracle venv) or the checkout's tools are not present."""


def _diff_module():
    path = ROOT / "tools" / "diff_vllm.py"
    if not path.is_file():
        raise ValidateUnavailable(f"{path} not found (needs a source checkout)")
    import sys

    if "diff_vllm" in sys.modules:
        return sys.modules["diff_vllm"]
    spec = importlib.util.spec_from_file_location("diff_vllm", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["diff_vllm"] = mod   # dataclasses resolve annotations through it
    spec.loader.exec_module(mod)
    return mod


def case_to_spec(data: dict) -> tuple[dict, list[str]]:
    """Our case mapping -> the differential tester's spec (segments per request)."""
    from sim.cache.case import CaseError, parse_case

    from sim.cache.config import case_field

    parse_case(data)  # validates; raises CaseError with the field
    cfg = {case_field(k): v for k, v in (data.get("config") or {}).items()}
    requests, ids = [], []
    for i, r in enumerate(data["requests"]):
        p = r["prompt"]
        if isinstance(p, list):
            segs = [("__lit", int(t), 1) for t in p]
        else:
            segs = []
            for part in p.split():
                name, length = part.rsplit(":", 1)
                off = 0
                if "@" in name:
                    name, o = name.split("@", 1)
                    off = int(o)
                segs.append((name, off, int(length)))
        requests.append(segs)
        ids.append(str(r.get("id", f"r{i}")))
    if len(requests) < 2:
        raise CaseError("requests: the oracle needs a producer and at least one consumer")
    return {"config": cfg, "requests": requests}, ids


def validate_case(data: dict) -> dict:
    mod = _diff_module()
    py = mod.default_oracle_python()
    oracle_dir = mod.DEFAULT_ORACLE_DIR.resolve()
    why = mod.oracle_unavailable("oracle", py, oracle_dir)
    if why:
        raise ValidateUnavailable(why)
    spec, ids = case_to_spec(data)
    from sim.cache.case import CaseError

    for k in spec["config"]:
        if k not in mod.ORACLE_KEY:
            raise CaseError(f"config.{k}: the vLLM oracle has no counterpart for this key")
    worker = mod.OracleWorker(py, oracle_dir)
    try:
        ans = worker.run([mod.to_oracle(spec)])[0]
        version = worker.version
    finally:
        worker.close()
    ours = mod.run_ours(spec)
    verdict = mod.compare(spec, ours, ans)
    names = {mod.request_id(i): rid for i, rid in enumerate(ids)}
    rows = [(names.get(m.request, m.request), m.field, m.ours, m.oracle)
            for m in verdict.mismatches]
    return {"vllm": version, "status": verdict.status, "lookups": verdict.lookups,
            "mismatches": rows}
