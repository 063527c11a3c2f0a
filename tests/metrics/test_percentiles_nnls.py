"""The one percentile method (sim/rundir/stats.py) and the non-negative least squares of
``sim calibrate`` (sim/commands/nnls.py, sim/commands/calibrate.py), against independent answers."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from sim.commands.calibrate import design, fit
from sim.commands.nnls import nnls
from sim.rundir.stats import percentile, percentiles, weighted_percentiles


def test_percentiles_are_numpys_linear():
    rng = np.random.default_rng(5)
    for _ in range(50):
        v = rng.exponential(size=int(rng.integers(1, 40)))
        for q in (0, 37.5, 50, 90, 99, 100):
            assert percentile(v, q) == np.percentile(v, q)     # bit for bit
    assert percentiles([1.0, 2.0, 3.0, 4.0], [50, 90]) == [2.5, 3.7]   # (numpy: 4 - 1 * 0.3)
    assert np.isnan(percentile([], 50))


@pytest.mark.parametrize("seed", range(4))
def test_percentiles_equal_np_percentile_bit_for_bit_on_any_values(seed):
    """Computed from the sorted values (not through np.percentile): the same doubles for
    any size, any spread, ties, integers, lists of q and single q, both ends; NaN for
    every q when a value is NaN, as numpy answers."""
    rng = np.random.default_rng(seed)
    for _ in range(300):
        n = int(rng.choice([1, 2, 3, rng.integers(1, 50), rng.integers(1, 5000),
                            rng.integers(1, 60000)]))
        kind = int(rng.integers(0, 4))
        v = (rng.exponential(size=n) if kind == 0 else rng.lognormal(0, 3, size=n)
             if kind == 1 else rng.integers(0, 40, size=n) * 0.125 if kind == 2
             else rng.normal(size=n) * 1e6)
        qs = [0, 100, 50, 90, 99, 99.9, 25, 1, 33.3, float(rng.uniform(0, 100))]
        want = [float(x) for x in np.percentile(v, qs)]
        assert percentiles(v, qs) == want
        assert percentiles(list(v), qs) == want
        assert [percentile(v, q) for q in qs[:3]] == want[:3]
        ints = rng.integers(0, 9, size=n)
        assert percentiles(list(map(int, ints)), qs) == [float(x) for x in
                                                        np.percentile(ints, qs)]
    for bad in (-1, 100.5):                     # (numpy refuses these too)
        with pytest.raises(ValueError):
            np.percentile([1.0, 2.0], bad)
        with pytest.raises(ValueError):
            percentiles([1.0, 2.0], [50, bad])
    v = [3.0, float("nan"), 1.0]
    assert all(np.isnan(x) for x in percentiles(v, [0, 50, 100]))
    assert all(np.isnan(x) for x in np.percentile(v, [0, 50, 100]))


def test_weighted_percentiles_equal_the_repeated_values():
    rng = np.random.default_rng(1)
    for _ in range(200):
        v = rng.integers(0, 60, size=int(rng.integers(1, 15))) * 0.731
        c = rng.integers(0, 7, size=len(v))
        if c.sum() == 0:
            continue
        qs = [0, 1, 33.3, 50, 90, 99, 100]
        assert weighted_percentiles(v, c, qs) == percentiles(np.repeat(v, c), qs)


def _brute_force(A, b):
    """The NNLS answer by trying every set of free coefficients (small n only)."""
    best = None
    n = A.shape[1]
    for k in range(n + 1):
        for S in itertools.combinations(range(n), k):
            x = np.zeros(n)
            if S:
                x[list(S)] = np.linalg.lstsq(A[:, list(S)], b, rcond=None)[0]
            if (x < -1e-12).any():
                continue
            r = np.linalg.norm(A @ x - b)
            if best is None or r < best[0] - 1e-12:
                best = (r, x)
    return best


def test_nnls_matches_the_exhaustive_answer():
    rng = np.random.default_rng(0)
    for _ in range(300):
        m, n = int(rng.integers(2, 12)), int(rng.integers(1, 6))
        A, b = rng.normal(size=(m, n)), rng.normal(size=m)
        got = nnls(A, b)
        r, x = _brute_force(A, b)
        assert got.residual == pytest.approx(r, rel=1e-9, abs=1e-12)
        assert (got.x >= 0).all()
        if m >= n:                         # (unique answer)
            assert got.x == pytest.approx(x, abs=1e-8)


def test_nnls_where_ols_goes_negative():
    # y falls with t: least squares wants a negative slope; with slope >= 0 the answer is
    # slope 0 and the intercept the mean of y (KKT: the slope's gradient points down)
    A = np.array([[1.0, 0.0], [1.0, 1.0], [1.0, 2.0]])
    b = np.array([3.0, 2.0, 1.5])
    ols = np.linalg.lstsq(A, b, rcond=None)[0]
    assert ols[1] < 0
    got = nnls(A, b)
    assert got.x == pytest.approx([13 / 6, 0.0])
    assert list(got.passive) == [True, False]
    clipped = np.maximum(ols, 0.0)        # what the fit did before: not least squares
    assert got.residual < np.linalg.norm(A @ clipped - b) - 0.1


def test_nnls_handles_coefficients_of_any_scale():
    # a calibration's terms: seconds per step ~1e-3, per attention pair ~1e-9
    pts = [(t, c) for t in (1, 4, 16, 64, 256) for c in (0, 256, 1024)]
    A = np.array([[1.0, t, t * c + t * (t + 1) / 2] for t, c in pts])
    x_true = np.array([2e-3, 1e-5, 1e-9])
    got = nnls(A, A @ x_true)
    assert got.x == pytest.approx(x_true, rel=1e-9)


def test_calibration_fit_recovers_known_coefficients_and_reports_each_term():
    pts = [(t, c, 0.002 + 1e-5 * t + 1e-9 * (t * c + t * (t + 1) / 2))
           for t in (1, 4, 16, 64, 256, 512) for c in (0, 128, 512, 1024)]
    f = fit(pts, 512)
    assert f["per_item_s"] == pytest.approx(0.002, rel=1e-6)
    assert f["per_token_s"] == pytest.approx(1e-5, rel=1e-6)
    assert f["per_pair_s"] == pytest.approx(1e-9, rel=1e-6)
    assert f["fit_max_rel_err"] < 1e-9
    terms = f["per_term"]
    assert set(terms) == {"per_item_s", "per_token_s", "per_pair_s", "per_chunk_s"}
    assert sum(t["mean_share"] for t in terms.values()) == pytest.approx(1.0)
    assert terms["per_item_s"]["std_err"] is not None
    # a noisy fit: each free term's standard error is positive and finite
    rng = np.random.default_rng(2)
    noisy = [(t, c, s * (1 + 0.05 * rng.standard_normal())) for t, c, s in pts]
    g = fit(noisy, 512)
    for name in ("per_item_s", "per_token_s", "per_pair_s"):
        se = g["per_term"][name]["std_err"]
        assert g["per_term"][name]["held_at_zero"] or (se is not None and 0 < se < np.inf)


def test_calibration_fit_holds_a_term_that_would_go_negative_at_zero():
    # time falls with the chunk count here: OLS makes per_chunk_s negative; NNLS holds it
    pts = [(t, c, 0.003 + 2e-6 * t - 4e-4 * (-(-t // 64))) for t in (1, 32, 64, 65, 128, 200)
           for c in (0, 64)]
    X = design(pts, 64)
    y = np.array([s for *_, s in pts])
    w = 1 / y
    assert np.linalg.lstsq(X * w[:, None], y * w, rcond=None)[0][3] < 0
    f = fit(pts, 64)
    assert f["per_chunk_s"] == 0.0 and f["per_term"]["per_chunk_s"]["held_at_zero"]
    assert f["per_term"]["per_chunk_s"]["std_err"] is None
    assert min(f["per_item_s"], f["per_token_s"], f["per_pair_s"]) >= 0.0
