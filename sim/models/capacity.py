"""Capacity checks made before anything runs: a pool that cannot hold one request of
``max_model_len`` tokens (vLLM refuses to start likewise) and a pool too large to
simulate in this machine's memory.  Both raise ``CapacityError`` (one line, exit 2).

(The request-level counterparts live in the engine: ``Scheduler.add`` refuses a request
the pool can never hold, and the engine's progress guard stops a replay that cannot
progress.)
"""
from __future__ import annotations

import os

from sim.errors import CapacityError

# What one pool block costs the simulator: a Block object (~190 B compiled, ~220 B from
# source, measured on CPython 3.11 with 10^6 blocks: the object, its list slot and the
# key map's share) plus headroom for the keys and block tables a replay adds.
BYTES_PER_BLOCK = 256


def _bytes(n: float) -> str:
    for unit, size in (("PiB", 1 << 50), ("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20)):
        if n >= size:
            return f"{n / size:,.1f} {unit}"
    return f"{n / 1024:,.1f} KiB"


def available_memory() -> int | None:
    """Bytes of memory this machine can still give (``MemAvailable``, else the
    physical memory); None where neither can be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        return None


def pool_memory_problem(num_blocks: int) -> str | None:
    """Why a pool of ``num_blocks`` cannot be simulated here (None when it can): the
    simulator holds one Python object per block."""
    need = num_blocks * BYTES_PER_BLOCK
    if need < 1 << 30:
        return None        # (below 1 GiB: never refused, and /proc is not read)
    avail = available_memory()
    if avail is None or need <= avail:
        return None
    return (f"{num_blocks:,} pool blocks would take about {_bytes(need)} of memory to "
            f"simulate (~{BYTES_PER_BLOCK} B per block), more than the {_bytes(avail)} "
            f"this machine has available")


def check_pool_memory(num_blocks: int, field: str, hint: str = "") -> None:
    problem = pool_memory_problem(num_blocks)
    if problem is not None:
        raise CapacityError(f"{field}: {problem}{hint}")


def check_max_model_len(kv, max_model_len: int, block_bytes: int, pool_from: str) -> None:
    """vLLM's start-up check: the pool (less the null block) must hold one request of
    ``max_model_len`` tokens, counted as vLLM counts it per group (see
    ``blocks_per_request``).  ``pool_from`` says where the pool size came from."""
    usable = kv.usable_blocks
    need = kv.blocks_per_request(max_model_len)
    if need <= usable:
        return
    parts = []
    for kind, n, width in kv.blocks_per_request_by_run(max_model_len):
        name = {"mamba": "Mamba", "full": "attention"}.get(kind, "sliding-window")
        parts.append(f"{n:,} x {width} {name} group{'s' if width > 1 else ''}")
    lo, hi = 0, max_model_len       # the largest length that fits, as vLLM estimates it
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if kv.blocks_per_request(mid) <= usable:
            lo = mid
        else:
            hi = mid - 1
    fits = (f"the largest max_model_len it holds is {lo:,}" if lo > 0
            else "it cannot hold a request of any length")
    raise CapacityError(
        f"scheduler.max_model_len: a request of {max_model_len:,} tokens needs {need:,} pool "
        f"blocks ({' + '.join(parts)}; {_bytes(need * block_bytes)} per GPU) but the pool has "
        f"{usable:,} usable besides the null block ({_bytes(usable * block_bytes)}; "
        f"{pool_from}): {fits} (vLLM refuses to start likewise); lower max_model_len or give "
        f"the pool more blocks")


