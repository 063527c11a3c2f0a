"""``sim calibrate``: measure the torch backend's prefill over a grid of (new tokens,
cached context) and fit the analytical backend's per-step cost to it.

The fitted form is what one forward of ``t`` new tokens over ``c`` cached tokens
costs on this device and model::

    seconds = per_item_s + per_chunk_s * ceil(t / chunk_tokens) + per_token_s * t
              + per_pair_s * (t * c + t * (t + 1) / 2)

(fixed per-forward cost; the SSD scan's chunks; linear work: projections, MLP, Mamba
conv; attention score/value work over every (query, key) pair).  A step of several items
is the sum.  The coefficients are a non-negative least-squares fit (``sim/commands/nnls.py``).

Three stages, each usable alone:

* :func:`measure_grid` times the grid on a device: per grid point each layer kind's time
  (``mamba``, ``attention``, ``mlp``, ``other``) and the ``total`` forward the backend
  runs, plus the kernel grid (``backends/torch_backend/timing.py`` ``time_kernels``: each
  kernel and the Mamba state / KV block copies alone), with the provenance of the device
  (``backends/torch_backend/envinfo.py``).  ``sim calibrate --save-grid`` writes it (JSON).
* :func:`fit_profile` turns a measured grid into a profile: the total fit (``--fit
  total``, the default) or the sum of per-layer-kind fits (``--fit per-kind``) as the
  coefficients, the per-kind fits per layer either way (``per_kind``), the state copies
  (``state_copies``; one state save per forward is part of ``per_item_s``), and the
  provenance.  ``sim calibrate --from-grid GRID`` fits a grid measured elsewhere.
* :func:`held_out` measures end-to-end prefills off the grid (a cached prefix restored,
  the prompt in chunks of the scheduler's budget, the state saved after each) and the
  profile's prediction of each: the analytical model's TTFT error for isolated requests.

The profile file (YAML) is what ``backend.profile`` in a scenario loads.
"""
from __future__ import annotations

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
    """Weighted non-negative least squares (``sim/commands/nnls.py``) of the cost form.

    Weighted by 1/y, so that a 1 ms decode counts as much as a 1 s prefill (the fit
    minimises relative error).  Per term: its coefficient, the coefficient's standard
    error (from the weighted residuals, on the terms left free; none for a term held at
    zero) and its share of the predicted time, averaged over the grid."""
    from sim.commands.nnls import nnls

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


#: the terms each layer kind's own fit may use (the columns of :func:`design`)
KIND_TERMS = {"mamba": ("per_item_s", "per_token_s", "per_chunk_s"),
              "attention": ("per_item_s", "per_token_s", "per_pair_s"),
              "mlp": ("per_item_s", "per_token_s"),
              "other": ("per_item_s", "per_token_s"),
              "rest": ("per_item_s", "per_token_s")}
#: what the profile says of the kernels it timed (``implementation``)
IMPLEMENTATION = (
    "Timed: this project's torch backend (backends/torch_backend/), pure PyTorch. Its Mamba2 "
    "prefill is an einsum chunked SSD scan in float32 and its decode a token-by-token "
    "recurrence; its attention gathers cached K/V from a paged pool by index and calls "
    "torch's scaled_dot_product_attention (an explicit mask after a cached prefix). vLLM "
    "runs other kernels: its own Triton SSD kernels (mamba_chunk_scan_combined, "
    "selective_state_update) and FlashAttention on paged KV (and CUDA graphs for decode). "
    "These coefficients describe the torch backend on this device, not vLLM's speed on it.")
GRID_FORMAT = "hcs-calibration-grid/1"


def _kinds_of(pattern: str) -> dict[str, int]:
    """How many blocks of each timed kind the pattern has (``E`` blocks run as MLPs)."""
    from backends.torch_backend.model import KIND

    counts = {"mamba": 0, "attention": 0, "mlp": 0}
    for ch in pattern:
        counts[KIND[ch]] += 1
    return counts


def measure_grid(cfg, device: str, grid: dict, repeats: int = 3, warmup: int = 1,
                 progress=None, kernels: bool = True, kernel_sizes: dict | None = None,
                 command: str | None = None) -> dict:
    """Time ``cfg``'s torch model on ``device`` over ``grid`` (``{"new": [...], "cached":
    [...]}``): the data :func:`fit_profile` fits, JSON-ready.

    ``points``: per grid point the seconds of each layer kind and the ``total`` forward the
    backend runs (``forward_chunk`` on pooled blocks, state in and out), each the median of
    ``repeats`` runs after ``warmup``; ``kernels``: the kernel grid (``time_kernels``, sizes
    from ``kernel_sizes``: ``tokens``, ``cached``, ``decode_tokens``), unless ``kernels`` is
    False; ``environment``: where it ran (``envinfo.environment``)."""
    import dataclasses

    import torch

    from backends.torch_backend.envinfo import environment
    from backends.torch_backend.model import HybridStack
    from backends.torch_backend.timing import time_kernels, time_prefill

    if device == "cpu":
        torch.set_num_threads(1)   # as the torch backend runs on CPU
    model = HybridStack(cfg, torch.device(device))
    points = []
    cells = [(t, c) for c in grid["cached"] for t in grid["new"]]
    for i, (t, c) in enumerate(cells):
        r = time_prefill(model, t, c, device=device, repeats=repeats, warmup=warmup)
        # the fitted total is the call the backend makes (forward_chunk on pooled
        # blocks, state in and out), not just the layer stack
        r["total"] = _time_forward_chunk(model, t, c, device, repeats, warmup=warmup)
        points.append({"new_tokens": t, "cached": c, **{k: round(v, 9) for k, v in r.items()}})
        if progress:
            progress(i + 1, len(cells))
    rows = []
    if kernels:
        ks = {"tokens": (1, 16, 64, 256), "cached": (0, 256), "decode_tokens": (1, 2, 4),
              **(kernel_sizes or {})}
        rows = time_kernels(model, tokens=ks["tokens"], cached=ks["cached"],
                            decode_tokens=ks["decode_tokens"], repeats=max(repeats, 3),
                            warmup=max(warmup, 1))
    return {"format": GRID_FORMAT, "command": command,
            "model": dataclasses.asdict(cfg), "device": device,
            "environment": environment(device), "grid": {k: list(v) for k, v in grid.items()},
            "repeats": repeats, "warmup": warmup, "points": points, "kernels": rows}


def load_grid(path) -> dict:
    """A grid file written by ``sim calibrate --save-grid`` or ``bench/gpu_check.py``; an
    ``InputError`` (one line) when it is not one."""
    import json

    from sim.errors import InputError

    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise InputError(f"{path}: cannot read a calibration grid: {e}") from None
    if not isinstance(data, dict) or data.get("format") != GRID_FORMAT:
        raise InputError(f"{path}: not a calibration grid (format {GRID_FORMAT!r}, written by "
                         f"sim calibrate --save-grid or bench/gpu_check.py)")
    for key in ("model", "device", "points"):
        if key not in data:
            raise InputError(f"{path}: {key}: missing")
    return data


def grid_config(data: dict):
    """The ``TorchModelConfig`` a grid was measured on."""
    from backends.torch_backend.config import TorchModelConfig

    return TorchModelConfig(**data["model"])


def _fit_columns(points, chunk: int, y, cols: tuple[str, ...], weight) -> tuple[np.ndarray, np.ndarray]:
    """NNLS of ``y`` on the named columns of the design, weighted by ``weight``; the full
    4-vector of coefficients (zero outside ``cols``) and the prediction."""
    from sim.commands.nnls import nnls

    X = design(points, chunk)
    idx = [TERMS.index(c) for c in cols]
    w = 1.0 / np.maximum(weight, 1e-9)
    res = nnls(X[:, idx] * w[:, None], y * w)
    coef = np.zeros(len(TERMS))
    coef[idx] = res.x
    return coef, X @ coef


def fit_per_kind(points: list[dict], cfg) -> dict:
    """Each layer kind's time fitted on its own terms (:data:`KIND_TERMS`): per kind its
    coefficients for all its blocks together and per block (``per_layer``), its fit error
    and share of the total; ``rest`` is the forward's time outside the blocks (the total
    minus the kinds: launch gaps, block-table indexing, Python); ``composed`` is their sum,
    the analytical model assembled from the layer kinds, with its error on the totals."""
    chunk = cfg.chunk_size
    pts = [(p["new_tokens"], p["cached"], p["total"]) for p in points]
    total = np.array([p["total"] for p in points])
    counts = {**_kinds_of(cfg.pattern), "other": 1, "rest": 1}
    out: dict = {}
    composed = np.zeros(len(TERMS))
    for kind, cols in KIND_TERMS.items():
        if kind == "rest":
            y = total - sum(np.array([p[k] for p in points]) for k in ("mamba", "attention",
                                                                     "mlp", "other"))
            weight = total           # relative to the forward, as the total fit
        else:
            if not counts[kind]:
                continue
            y = np.array([p[kind] for p in points])
            weight = np.maximum(y, 1e-9)
        coef, pred = _fit_columns(pts, chunk, y, cols, weight)
        composed += coef
        n = counts[kind]
        entry = {"blocks": n,
                 "coefficients": {c: float(coef[TERMS.index(c)]) for c in cols},
                 "per_layer": {c: float(coef[TERMS.index(c)]) / n for c in cols},
                 "mean_share": float(np.mean(y / total))}
        if kind != "rest":
            entry["fit_median_rel_err"] = float(np.median(np.abs(pred - y) / y))
        out[kind] = entry
    pred = design(pts, chunk) @ composed
    rel = np.abs(pred - total) / total
    out["composed"] = {"coefficients": {t: float(v) for t, v in zip(TERMS, composed)},
                       "fit_median_rel_err": float(np.median(rel)),
                       "fit_max_rel_err": float(np.max(rel))}
    return out


def state_copies(kernel_rows: list[dict]) -> dict | None:
    """Median seconds and bytes of the state and block copies in a kernel grid: ``save_s``
    (a sequence's Mamba state into a pool block), ``restore_s`` (out of one),
    ``block_copy_s`` (Mamba block to block), ``kv_block_copy_s`` (a KV block, every
    attention layer); None when the grid timed none."""
    names = {"state_save": "save", "state_restore": "restore",
             "state_block_copy": "block_copy", "kv_block_copy": "kv_block_copy"}
    out = {}
    for r in kernel_rows or []:
        if r["kernel"] in names:
            out[names[r["kernel"]] + "_s"] = float(r["median_s"])
            out[names[r["kernel"]] + "_bytes"] = r["bytes"]
    return out or None


def fit_profile(data: dict, method: str = "total") -> dict:
    """A profile from a measured grid (:func:`measure_grid`'s mapping).

    ``method``: ``total`` fits the total forward directly; ``per-kind`` takes the sum of the
    per-layer-kind fits (:func:`fit_per_kind` ``composed``).  Either way ``per_item_s`` then
    gains one state save (the backend stores the Mamba state after every forward; the
    grid's forwards do not), and the profile carries the per-kind fits, the state copies,
    the kernel grid and the provenance."""
    if method not in ("total", "per-kind"):
        raise ValueError(f"fit method must be total or per-kind, got {method!r}")
    cfg = grid_config(data)
    env = data.get("environment") or {}
    device = data["device"]
    points = data["points"]
    f = fit([(p["new_tokens"], p["cached"], p["total"]) for p in points], cfg.chunk_size)
    kinds = fit_per_kind(points, cfg)
    copies = state_copies(data.get("kernels") or [])
    if method == "total":
        coef = {k: f[k] for k in TERMS}
        fit_err = {k: f[k] for k in ("fit_median_rel_err", "fit_max_rel_err")}
    else:
        coef = dict(kinds["composed"]["coefficients"])
        fit_err = {k: kinds["composed"][k] for k in ("fit_median_rel_err", "fit_max_rel_err")}
    save = (copies or {}).get("save_s", 0.0) if cfg.num_mamba_layers else 0.0
    coef["per_item_s"] += save
    if device == "cuda":
        dev = f"cuda ({env.get('device_name', 'GPU')})"
    else:
        dev = f"cpu ({env.get('host', {}).get('machine') or env.get('device_name')}, " \
              f"{env.get('threads', 1)} threads)"
    prov = {k: env.get(k) for k in ("date", "device_name", "torch", "cuda", "driver",
                                    "clocks_mhz", "tf32", "python") if k in env}
    prov.update({"grid_command": data.get("command"), "repeats": data.get("repeats"),
                 "warmup": data.get("warmup"),
                 "timer": "cuda_events" if device == "cuda" else "perf_counter",
                 "statistic": "median"})
    return {
        "kind": "fitted",
        "description": "torch backend prefill cost on this device, fitted as per_item_s + "
                       "per_chunk_s*ceil(t/chunk_tokens) + per_token_s*t + "
                       "per_pair_s*(t*c + t*(t+1)/2) per forward",
        "device": dev,
        "torch": env.get("torch"),
        "provenance": prov,
        "implementation": IMPLEMENTATION,
        "model": {"pattern": cfg.pattern, "hidden": cfg.hidden, "mamba_heads": cfg.mamba_heads,
                  "mamba_head_dim": cfg.mamba_head_dim, "d_state": cfg.d_state,
                  "q_heads": cfg.q_heads, "kv_heads": cfg.kv_heads, "head_dim": cfg.head_dim,
                  "ffn_dim": cfg.ffn_dim, "dtype": cfg.dtype, "source": cfg.source},
        "coefficients": {**{k: float(coef[k]) for k in TERMS}, "chunk_tokens": cfg.chunk_size},
        "fit": {**fit_err, "method": "non-negative least squares (Lawson-Hanson), weighted "
                "by 1/time" + ("" if method == "total" else
                               "; sum of the per-layer-kind fits (per_kind)"),
                "fitted": method, "state_save_in_per_item_s": float(save),
                "total_fit": {k: f[k] for k in (*TERMS, "fit_median_rel_err",
                                                "fit_max_rel_err")},
                "per_term": f["per_term"]},
        "per_kind": kinds,
        "state_copies": copies,
        "measured": points,
        "kernels": data.get("kernels") or [],
    }


def calibrate(cfg, device: str, grid: dict, repeats: int = 3, progress=None,
              warmup: int = 1, method: str = "total") -> dict:
    """:func:`measure_grid` then :func:`fit_profile`."""
    return fit_profile(measure_grid(cfg, device, grid, repeats=repeats, warmup=warmup,
                                    progress=progress), method=method)


def predict(coef: dict, t: int, c: int) -> float:
    """The profile's seconds for one forward of ``t`` new tokens over ``c`` cached."""
    ck = coef.get("chunk_tokens") or 0
    return (coef["per_item_s"] + coef["per_token_s"] * t
            + coef["per_pair_s"] * (t * c + t * (t + 1) // 2)
            + (coef.get("per_chunk_s", 0.0) * -(-t // ck) if ck else 0.0))


def held_out_cases(grid: dict, n: int, seed: int = 0, block: int = 16) -> list[tuple[int, int]]:
    """``n`` (prompt tokens to compute, cached prefix) pairs off the grid, within its range
    (up to twice its longest chunk of new tokens; the prefix a multiple of ``block``),
    drawn from ``seed``: the held-out set."""
    rng = np.random.default_rng(seed)
    max_new = 2 * max(grid["new"])
    max_c = max(grid["cached"])
    on_grid = {(t, c) for t in grid["new"] for c in grid["cached"]}
    out: list[tuple[int, int]] = []
    tries = 0
    while len(out) < n and tries < 100 * n:
        tries += 1
        t = int(np.exp(rng.uniform(0.0, np.log(max_new))))
        c = 0 if rng.random() < 0.3 else block * int(rng.integers(1, max(2, max_c // block + 1)))
        if t >= 1 and (t, c) not in on_grid and (t, c) not in out:
            out.append((t, c))
    return out


def held_out(cfg, device: str, coefficients: dict, cases: list[tuple[int, int]],
             budget: int, repeats: int = 3, warmup: int = 1, block_size: int = 16) -> dict:
    """Measured against predicted end-to-end prefills: each case ``(t, c)`` restores the
    Mamba state of a ``c``-token cached prefix from a state pool (its K/V already in the
    paged pool), prefills ``t`` new tokens in chunks of at most ``budget`` (the scheduler's
    token budget), storing the state after each chunk, as the torch backend does for a lone
    request: its TTFT.  The prediction is the sum of the profile's forwards.  Returns
    ``{"rows": [...], "median_rel_err", "p90_rel_err", "max_rel_err", "n", "budget"}``."""
    import torch

    from backends.torch_backend.model import HybridStack, forward_chunk
    from backends.torch_backend.pools import KVPool, StatePool
    from backends.torch_backend.timing import bench, summarize

    if device == "cpu":
        torch.set_num_threads(1)
    dev = torch.device(device)
    model = HybridStack(cfg, dev)
    rows = []
    for t, c in cases:
        g = torch.Generator().manual_seed(t * 7919 + c + 1)
        ids = torch.randint(0, cfg.vocab, (c + t,), generator=g).to(dev)
        nb = -(-(c + t) // block_size) + 1
        pool = KVPool(cfg, nb, block_size, dev)
        blocks = list(range(nb))
        states = StatePool(cfg, 2, dev) if cfg.num_mamba_layers else None
        with torch.inference_mode():
            if c:
                _, st = forward_chunk(model, ids[:c], 0, blocks, pool, block_size, None)
                if states is not None:
                    states.store(0, st)
        chunks = [(s, min(s + budget, c + t)) for s in range(c, c + t, budget)]

        def once():
            state = states.load(0) if (c and states is not None) else None
            for s, e in chunks:
                _, state = forward_chunk(model, ids[s:e], s, blocks, pool, block_size, state)
                if states is not None:
                    states.store(1, state)

        with torch.inference_mode():
            meas = summarize(bench(once, dev, repeats, warmup))["median_s"]
        pred = sum(predict(coefficients, e - s, s) for s, e in chunks)
        rows.append({"new_tokens": t, "cached": c, "chunks": len(chunks),
                     "measured_s": meas, "predicted_s": pred,
                     "rel_err": abs(pred - meas) / meas})
    errs = sorted(r["rel_err"] for r in rows)
    return {"n": len(rows), "budget": budget,
            "median_rel_err": float(statistics.median(errs)) if errs else None,
            "p90_rel_err": float(errs[int(0.9 * (len(errs) - 1))]) if errs else None,
            "max_rel_err": float(errs[-1]) if errs else None, "rows": rows}


def _time_forward_chunk(model, t: int, c: int, device: str, repeats: int,
                        block_size: int = 64, warmup: int = 1) -> float:
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
        for i in range(repeats + warmup):
            if device == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            forward_chunk(model, ids[c:], c, blocks, pool, block_size, state)
            if device == "cuda":
                torch.cuda.synchronize()
            if i >= warmup:
                times.append(time.perf_counter() - t0)
    return statistics.median(times)


def check_settings(path: Path, force: bool, repeats: int, layers: int, width_div: int) -> None:
    """Up front, before any timing: never overwrite an existing profile (the project tracks
    some, e.g. ``profiles/cpu-tiny-hybrid.yaml``) unless ``--force``; counts >= 1."""
    from sim.errors import InputError

    for name, v in (("--repeats", repeats), ("--layers", layers), ("--width-div", width_div)):
        if v < 1:
            raise InputError(f"{name}: must be >= 1, got {v}")
    if Path(path).exists() and not force:
        raise InputError(f"{path}: exists; calibrate writes a new profile and does not replace "
                         f"one unless asked: add --force to overwrite it, or give another --out")


def write_profile(profile: dict, path: Path, command: str) -> None:
    from sim.rundir.atomic_files import atomic_write_text

    text = f"# made by: {command}\n" + yaml.safe_dump(profile, sort_keys=False)
    atomic_write_text(path, text)      # temp file + os.replace: never a half-written profile


def median_ttft_error(torch_rows, analytical_rows) -> tuple[float, int]:
    """Median relative TTFT error of analytical vs torch, paired by request id."""
    a = {r.request_id: r.ttft_s for r in analytical_rows}
    errs = [abs(a[r.request_id] - r.ttft_s) / r.ttft_s for r in torch_rows
            if r.request_id in a and r.ttft_s > 0]
    return (statistics.median(errs) if errs else float("nan")), len(errs)
