"""``sim calibrate``: measure the torch backend's prefill over a grid of (new tokens,
cached context) and fit the analytical backend's per-step cost to it.

The fitted form is what one forward of ``t`` new tokens over ``c`` cached tokens
costs on this device and model::

    seconds = per_item_s + per_token_s * t + per_pair_s * (t * c + t * (t + 1) / 2)

(fixed per-forward cost; linear work: projections, MLP, Mamba scan; attention
score/value work over every (query, key) pair).  A step of several items is the
sum.  The coefficients are a non-negative least-squares fit (``sim/nnls.py``); the
profile file (YAML) carries them, the measured grid, the fit's error and each term's
standard error and share of the time; ``backend.profile`` in a scenario loads it.
"""
from __future__ import annotations

import platform
import statistics
from pathlib import Path

import numpy as np
import yaml

QUICK_GRID = {"new": [1, 4, 16, 64, 128, 200, 256, 384, 512], "cached": [0, 128, 512, 1024]}
FULL_GRID = {"new": [1, 4, 16, 64, 256, 1024, 2048], "cached": [0, 256, 1024, 4096, 8192]}


TERMS = ("per_item_s", "per_token_s", "per_pair_s", "per_chunk_s")


def design(points: list[tuple[int, int, float]], chunk: int) -> np.ndarray:
    """One row per measured forward, one column per term of the cost form."""
    return np.array([[1.0, t, t * c + t * (t + 1) / 2, -(-t // chunk)] for t, c, _ in points])


def fit(points: list[tuple[int, int, float]], chunk: int) -> dict:
    """Weighted non-negative least squares (``sim/nnls.py``) of the cost form.

    Weighted by 1/y, so that a 1 ms decode counts as much as a 1 s prefill (the fit
    minimises relative error).  Per term: its coefficient, the coefficient's standard
    error (from the weighted residuals, on the terms left free; none for a term held at
    zero) and its share of the predicted time, averaged over the grid."""
    from sim.nnls import nnls

    X = design(points, chunk)
    y = np.array([s for _, _, s in points])
    w = 1.0 / np.maximum(y, 1e-9)
    Xw = X * w[:, None]
    res = nnls(Xw, y * w)
    coef = res.x
    pred = X @ coef
    rel = np.abs(pred - y) / y
    free = res.passive
    dof = len(y) - int(free.sum())
    std = np.full(len(TERMS), np.nan)
    if dof > 0 and free.any():
        sigma2 = res.residual ** 2 / dof
        cov = sigma2 * np.linalg.pinv(Xw[:, free].T @ Xw[:, free])
        std[free] = np.sqrt(np.maximum(np.diag(cov), 0.0))
    share = (X * coef[None, :]) / np.maximum(pred, 1e-30)[:, None]
    per_term = {}
    for i, name in enumerate(TERMS):
        se = None if np.isnan(std[i]) else float(std[i])
        per_term[name] = {
            "value": float(coef[i]),
            "std_err": se,
            "rel_std_err": (se / float(coef[i])) if se is not None and coef[i] > 0 else None,
            "held_at_zero": bool(not free[i]),
            "mean_share": float(share[:, i].mean()),
        }
    return {"per_item_s": float(coef[0]), "per_token_s": float(coef[1]),
            "per_pair_s": float(coef[2]), "per_chunk_s": float(coef[3]), "chunk_tokens": chunk,
            "fit_median_rel_err": float(np.median(rel)),
            "fit_max_rel_err": float(np.max(rel)),
            "per_term": per_term}


def describe_terms(per_term: dict) -> str:
    """``per_item_s 1.23e-03 +- 2.1%, ...``: each coefficient with its relative standard
    error (``held at 0`` for a term the non-negativity holds at zero)."""
    parts = []
    for name, t in per_term.items():
        if t["held_at_zero"]:
            parts.append(f"{name} held at 0")
        elif t["rel_std_err"] is None:
            parts.append(f"{name} {t['value']:.3g}")
        else:
            parts.append(f"{name} {t['value']:.3g} +- {t['rel_std_err']:.1%}")
    return ", ".join(parts)


def calibrate(cfg, device: str, grid: dict, repeats: int = 3, progress=None) -> dict:
    import torch

    from backends.torch_backend.model import HybridStack
    from backends.torch_backend.timing import time_prefill

    if device == "cpu":
        torch.set_num_threads(1)   # as the torch backend runs on CPU
    model = HybridStack(cfg, torch.device(device))
    points = []
    measured = []
    total = len(grid["new"]) * len(grid["cached"])
    for i, (t, c) in enumerate([(t, c) for c in grid["cached"] for t in grid["new"]]):
        r = time_prefill(model, t, c, device=device, repeats=repeats)
        # the fitted total is the call the backend makes (forward_chunk on pooled
        # blocks, state in and out), not just the layer stack
        r["total"] = _time_forward_chunk(model, t, c, device, repeats)
        points.append((t, c, r["total"]))
        measured.append({"new_tokens": t, "cached": c,
                         **{k: round(v, 9) for k, v in r.items()}})
        if progress:
            progress(i + 1, total)
    f = fit(points, cfg.chunk_size)
    return {
        "kind": "fitted",
        "description": "torch backend prefill cost on this device, fitted as per_item_s + "
                       "per_chunk_s*ceil(t/chunk_tokens) + per_token_s*t + "
                       "per_pair_s*(t*c + t*(t+1)/2) per forward",
        "device": device if device != "cpu" else f"cpu ({platform.processor() or platform.machine()}, "
                                                  f"{torch.get_num_threads()} threads)",
        "torch": str(torch.__version__),
        "model": {"pattern": cfg.pattern, "hidden": cfg.hidden, "mamba_heads": cfg.mamba_heads,
                  "mamba_head_dim": cfg.mamba_head_dim, "d_state": cfg.d_state,
                  "q_heads": cfg.q_heads, "kv_heads": cfg.kv_heads, "head_dim": cfg.head_dim,
                  "ffn_dim": cfg.ffn_dim, "dtype": cfg.dtype, "source": cfg.source},
        "coefficients": {k: f[k] for k in ("per_item_s", "per_token_s", "per_pair_s",
                                           "per_chunk_s", "chunk_tokens")},
        "fit": {**{k: f[k] for k in ("fit_median_rel_err", "fit_max_rel_err")},
                "method": "non-negative least squares (Lawson-Hanson), weighted by 1/time",
                "per_term": f["per_term"]},
        "measured": measured,
    }


def _time_forward_chunk(model, t: int, c: int, device: str, repeats: int,
                        block_size: int = 64) -> float:
    import time

    import torch

    from backends.torch_backend.model import forward_chunk
    from backends.torch_backend.pools import KVPool

    g = torch.Generator().manual_seed(t * 7919 + c)
    ids = torch.randint(0, model.cfg.vocab, (c + t,), generator=g).to(device)
    nb = -(-(c + t) // block_size) + 1
    pool = KVPool(model.cfg, nb, block_size, torch.device(device))
    blocks = list(range(nb))
    state = None
    with torch.inference_mode():
        if c:
            _, state = forward_chunk(model, ids[:c], 0, blocks, pool, block_size, None)
        times = []
        for i in range(repeats + 1):
            if device == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            forward_chunk(model, ids[c:], c, blocks, pool, block_size, state)
            if device == "cuda":
                torch.cuda.synchronize()
            if i:
                times.append(time.perf_counter() - t0)
    return statistics.median(times)


def check_settings(path: Path, force: bool, repeats: int, layers: int, width_div: int) -> None:
    """Up front, before any timing: never overwrite an existing profile (the project tracks
    some, e.g. ``profiles/cpu-tiny-hybrid.yaml``) unless ``--force``; counts >= 1."""
    from sim.config.errors import InputError

    for name, v in (("--repeats", repeats), ("--layers", layers), ("--width-div", width_div)):
        if v < 1:
            raise InputError(f"{name}: must be >= 1, got {v}")
    if Path(path).exists() and not force:
        raise InputError(f"{path}: exists; calibrate writes a new profile and does not replace "
                         f"one unless asked: add --force to overwrite it, or give another --out")


def write_profile(profile: dict, path: Path, command: str) -> None:
    from sim.atomic import atomic_write_text

    text = f"# made by: {command}\n" + yaml.safe_dump(profile, sort_keys=False)
    atomic_write_text(path, text)      # temp file + os.replace: never a half-written profile


def median_ttft_error(torch_rows, analytical_rows) -> tuple[float, int]:
    """Median relative TTFT error of analytical vs torch, paired by request id."""
    a = {r.request_id: r.ttft_s for r in analytical_rows}
    errs = [abs(a[r.request_id] - r.ttft_s) / r.ttft_s for r in torch_rows
            if r.request_id in a and r.ttft_s > 0]
    return (statistics.median(errs) if errs else float("nan")), len(errs)
