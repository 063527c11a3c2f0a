"""Non-negative least squares: minimise ``||A x - b||`` subject to ``x >= 0``.

The Lawson–Hanson active-set method (Lawson & Hanson, *Solving Least Squares Problems*,
1974, ch. 23), numpy only: scipy is not a dependency of the project, and ``sim
calibrate`` fits four cost coefficients, where clipping an ordinary least-squares
solution at zero is not a least-squares solution at all (the other coefficients stay
where the negative one pulled them).

The method keeps a *passive* set of coefficients free to move and holds the rest at
zero.  Each outer step frees the held coefficient whose gradient most wants to grow;
the inner loop solves the unconstrained problem on the passive set and, while that
solution has a non-positive entry, steps back towards it as far as feasibility allows
and returns the coefficients that reached zero to the held set.  On exit the KKT
conditions hold: the passive coefficients are positive with zero gradient, the held
ones zero with a gradient pointing outwards.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np


class NNLSResult(NamedTuple):
    x: np.ndarray          # the solution, every entry >= 0
    residual: float        # ||A x - b||
    passive: np.ndarray    # bool: the coefficients left free (> 0) at the solution


def nnls(A, b, max_iter: int | None = None, tol: float | None = None) -> NNLSResult:
    """The non-negative least-squares solution of ``A x ~ b`` (``A`` m x n)."""
    A = np.asarray(A, dtype=float)
    b = np.asarray(b, dtype=float)
    if A.ndim != 2 or b.ndim != 1 or A.shape[0] != b.shape[0]:
        raise ValueError(f"nnls: A must be m x n and b of length m, got {A.shape} and {b.shape}")
    m, n = A.shape
    # Columns scaled to unit norm: the solution's signs (all the constraint sees) do not
    # change, and one tolerance fits coefficients of any scale (a calibration's per-pair
    # cost is ~1e-9 s where its per-step cost is ~1e-3 s).  An all-zero column stays 0.
    norms = np.linalg.norm(A, axis=0)
    scale = np.where(norms > 0, norms, 1.0)
    A_in, A = A, A / scale
    if tol is None:
        tol = 10 * np.finfo(float).eps * max(m, n)
    if max_iter is None:
        max_iter = 3 * n + 10
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    if not norms.any():
        return NNLSResult(x, float(np.linalg.norm(b)), passive)
    w = A.T @ (b - A @ x)
    for _ in range(max_iter):
        held = ~passive
        if not held.any() or w[held].max() <= tol:
            break
        j = int(np.argmax(np.where(held, w, -np.inf)))
        passive[j] = True
        while True:
            s = np.zeros(n)
            s[passive] = np.linalg.lstsq(A[:, passive], b, rcond=None)[0]
            bad = passive & (s <= tol)
            if not bad.any():
                break
            # step from x towards s until the first passive coefficient reaches zero
            alpha = np.min(x[bad] / (x[bad] - s[bad]))
            x = x + alpha * (s - x)
            passive &= x > tol
            x[~passive] = 0.0
        x = s
        w = A.T @ (b - A @ x)
        if not passive[j]:
            break   # the freed coefficient fell straight back: optimal to rounding (degenerate A)
    else:
        raise RuntimeError(f"nnls: no convergence in {max_iter} iterations")
    x = x / scale
    return NNLSResult(x, float(np.linalg.norm(A_in @ x - b)), passive.copy())
