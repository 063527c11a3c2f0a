"""Case files on disk: reading ``sim case`` / ``sim steps`` files for the commands.

The cache model (``sim/cache/case.py``) runs a case from its parsed mapping and knows
nothing about files; this module is the file side, through the project's one loader
(unreadable, non-UTF-8, duplicate keys and syntax errors name the file and line).
"""
from __future__ import annotations

from pathlib import Path

from sim.cache.case import CaseError, run_case_data
from sim.config.loader import load_file


def load_case_file(path: str | Path):
    """A case (or step case) file, YAML or JSON (``.json``).  A request id holding a
    control character is refused here, naming the file and line (ids are printed in
    results, tables and messages)."""
    data = load_file(path, CaseError)
    check_case_ids(data, path)
    return data


def check_case_ids(data, path: str | Path, error: type = CaseError) -> None:
    """A case's request id holding a control character is refused, naming the file and
    the request's line."""
    if isinstance(data, dict) and isinstance(data.get("requests"), list):
        from sim.config.fields import control_problem

        for i, r in enumerate(data["requests"]):
            rid = r.get("id") if isinstance(r, dict) else None
            if isinstance(rid, str) and control_problem(rid):
                raise error(f"{path}{_item_line(path, i)}: requests[{i}].id: "
                            f"{control_problem(rid)}")


def _item_line(path: str | Path, i: int) -> str:
    """``:LINE`` of the ``i``-th request of a case file (best effort; "" if unknown)."""
    import yaml

    from sim.errors import InputError
    from sim.config.loader import StrictLoader, read_text

    try:
        node = yaml.compose(read_text(path), Loader=StrictLoader)
        reqs = next(v for k, v in node.value if k.value == "requests")
        return f":{reqs.value[i].start_mark.line + 1}"
    except (InputError, yaml.YAMLError, StopIteration, AttributeError, IndexError,
            RecursionError):
        return ""


def run_case_file(path: str | Path) -> list[dict]:
    """Run the case file at ``path`` (``sim case``): one result per request."""
    return run_case_data(load_case_file(path), source=str(path))
