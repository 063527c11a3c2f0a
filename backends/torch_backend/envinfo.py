"""Where a measurement ran: the device, its driver and clocks, the software versions.

:func:`environment` returns a JSON-ready mapping that a calibration profile and the GPU check
(``bench/gpu_check.py``) carry as their provenance::

    {"date": "2026-11-20T10:11:12Z", "device": "cuda", "device_name": "NVIDIA H200",
     "torch": "2.11.0+cu130", "cuda": "13.0", "driver": "580.159.04",
     "clocks_mhz": {"sm": 1980, "memory": 3201, "sm_max": 1980, "memory_max": 3201},
     "python": "3.12.3", "host": {...}, "tf32": {"matmul": false, "cudnn": false}}

On CUDA the driver and clocks come from ``nvidia-smi`` when it is on the PATH (``null`` when it
is not, or it fails); nothing here changes any setting of the card.  On a CPU ``device_name``
is the processor's model name and ``threads`` torch's intra-op thread count.
"""
from __future__ import annotations

import datetime as _dt
import os
import platform
import shutil
import subprocess

NVIDIA_SMI_QUERY = ("name,driver_version,clocks.current.sm,clocks.current.memory,clocks.max.sm,"
                    "clocks.max.memory,temperature.gpu,power.draw,memory.total")


def _run(args: list[str], timeout: float = 20.0) -> str | None:
    """Output of a read-only command, or None when it is missing or fails."""
    if shutil.which(args[0]) is None:
        return None
    try:
        p = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=timeout, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    return p.stdout if p.returncode == 0 else None


def cpu_model() -> str:
    """The processor's model name (``/proc/cpuinfo``), else what ``platform`` says."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def nvidia_smi_query() -> dict | None:
    """The first GPU's name, driver, current and maximum SM / memory clocks (MHz),
    temperature, power and memory, read with ``nvidia-smi --query-gpu``; None without it."""
    keys = NVIDIA_SMI_QUERY.split(",")
    out = _run(["nvidia-smi", f"--query-gpu={NVIDIA_SMI_QUERY}", "--format=csv,noheader,nounits"])
    if not out or not out.strip():
        # a driver that refuses one of the fields refuses the query: ask the two it must know
        keys = ["name", "driver_version"]
        out = _run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"])
        if not out or not out.strip():
            return None
    return parse_query(out, keys)


def parse_query(out: str, keys: list[str]) -> dict:
    """The first GPU's row of an ``nvidia-smi --query-gpu`` answer (csv, no header, no units)
    as :func:`nvidia_smi_query` returns it; a field it did not give (or ``[N/A]``) is None."""
    vals = [v.strip() for v in out.strip().splitlines()[0].split(",")]
    row = dict(zip(keys, vals))

    def num(k):
        try:
            return float(row.get(k, ""))
        except ValueError:
            return None

    return {"name": row.get("name"), "driver": row.get("driver_version"),
            "clocks_mhz": {"sm": num("clocks.current.sm"), "memory": num("clocks.current.memory"),
                           "sm_max": num("clocks.max.sm"), "memory_max": num("clocks.max.memory")},
            "temperature_c": num("temperature.gpu"), "power_w": num("power.draw"),
            "memory_total_mib": num("memory.total")}


def nvidia_smi_text() -> str | None:
    """``nvidia-smi`` and ``nvidia-smi -q -d CLOCK,PERFORMANCE`` as printed (for the report)."""
    a = _run(["nvidia-smi"])
    if a is None:
        return None
    b = _run(["nvidia-smi", "-q", "-d", "CLOCK,PERFORMANCE"]) or ""
    return a + "\n" + b


def environment(device: str) -> dict:
    """Provenance of a measurement on ``device`` (``cpu`` or ``cuda``): see the module doc."""
    import torch

    env: dict = {
        "date": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()
        .replace("+00:00", "Z"),
        "device": device,
        "torch": str(torch.__version__),
        "python": platform.python_version(),
        "host": {"machine": platform.machine(), "system": platform.system(),
                 "release": platform.release(), "cpu": cpu_model(),
                 "cpu_count": os.cpu_count()},
    }
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        env.update({
            "device_name": torch.cuda.get_device_name(0),
            "cuda": torch.version.cuda,
            "capability": f"{props.major}.{props.minor}",
            "multiprocessors": props.multi_processor_count,
            "memory_gib": round(props.total_memory / 2**30, 1),
            "tf32": {"matmul": bool(torch.backends.cuda.matmul.allow_tf32),
                     "cudnn": bool(torch.backends.cudnn.allow_tf32)},
        })
        smi = nvidia_smi_query()
        env["driver"] = smi["driver"] if smi else None
        env["clocks_mhz"] = smi["clocks_mhz"] if smi else None
        env["nvidia_smi"] = smi
    else:
        env.update({"device_name": cpu_model(), "threads": torch.get_num_threads(),
                    "driver": None, "clocks_mhz": None})
    return env


def device_tag(env: dict) -> str:
    """A short name for file names: ``h200`` for an NVIDIA H200, ``cpu`` on a CPU."""
    if env.get("device") != "cuda":
        return "cpu"
    name = str(env.get("device_name") or "cuda").lower().replace("nvidia", "").strip()
    tag = "".join(ch if ch.isalnum() else "-" for ch in name).strip("-")
    while "--" in tag:
        tag = tag.replace("--", "-")
    return (tag.split("-")[0] if tag else "cuda") or "cuda"


def describe(env: dict) -> str:
    """One line: ``NVIDIA H200 (cuda 13.0, driver 580.159.04, SM 1980 MHz), torch 2.11.0``."""
    if env.get("device") == "cuda":
        clk = (env.get("clocks_mhz") or {}).get("sm")
        parts = [f"cuda {env.get('cuda')}", f"driver {env.get('driver')}"]
        if clk:
            parts.append(f"SM {clk:.0f} MHz")
        return f"{env.get('device_name')} ({', '.join(parts)}), torch {env['torch']}"
    return (f"cpu {env.get('device_name')} ({env.get('threads')} torch threads), "
            f"torch {env['torch']}")
