"""How well the calibrated analytical backend predicts the torch backend's TTFT.

Runs a scenario twice — on the torch backend (real kernels, measured step times) and on the
analytical backend with a fitted profile from ``sim calibrate`` — and prints the median and
p90 per-request relative TTFT error (paired by request id), over several repetitions.

    python bench/ttft_error.py [--scenario scenarios/athena-tiny.yaml]
                               [--profile profiles/cpu-tiny-hybrid.yaml] [--repeats 3]
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sim.commands.run import simulate  # noqa: E402
from sim.config.scenario import load_scenario  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default=str(ROOT / "scenarios" / "athena-tiny.yaml"))
    ap.add_argument("--profile", default=str(ROOT / "profiles" / "cpu-tiny-hybrid.yaml"))
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    prof = str(Path(args.profile).resolve())
    a = load_scenario(args.scenario, {"backend.kind": "analytical", "backend.profile": prof})
    _, rows_a, _ = simulate(a)
    pred = {r.request_id: r.ttft_s for r in rows_a}
    medians = []
    for i in range(args.repeats):
        t = load_scenario(args.scenario, {"backend.kind": "torch"})
        _, rows_t, s = simulate(t)
        errs = sorted(abs(pred[r.request_id] - r.ttft_s) / r.ttft_s for r in rows_t if r.ttft_s > 0)
        med = statistics.median(errs)
        p90 = errs[int(0.9 * (len(errs) - 1))]
        medians.append(med)
        print(f"run {i + 1}: {len(errs)} requests, median TTFT error {med:.1%}, p90 {p90:.1%} "
              f"(torch forward {s['torch_forward_s']:.1f} s)")
    print(f"median of medians {statistics.median(medians):.1%} (target <= 10%)")


if __name__ == "__main__":
    main()
