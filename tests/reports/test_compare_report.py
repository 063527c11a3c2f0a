"""compare.md from a hand-built compare folder: every value with its unit."""
from __future__ import annotations

import csv
import json

from reports.compare_report import compare_markdown, delta_text, value_text
from tests.reports.builders import RUN

OFF = {"token_hit_rate": 0.808642, "ttft_p50_s": 0.257, "mamba_state_bytes_peak": 52_060_000_000,
       "throughput_tok_s": 340.4, "evictions": 0, "preemptions": 12}
ON = {"token_hit_rate": 0.922345, "ttft_p50_s": 0.099, "mamba_state_bytes_peak": 51_950_000_000,
      "throughput_tok_s": 340.7, "evictions": 5, "preemptions": 10}


def _folder(tmp_path):
    for side, s in (("off", OFF), ("on", ON)):
        (tmp_path / side).mkdir()
        (tmp_path / side / "summary.json").write_text(json.dumps(s))
        (tmp_path / side / "run.json").write_text(json.dumps(RUN))
    with open(tmp_path / "summary_deltas.csv", "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["metric", "off", "on", "delta", "relative"])
        for k in OFF:
            w.writerow([k, OFF[k], ON[k], ON[k] - OFF[k], ""])
    with open(tmp_path / "paired.csv", "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["request_id", "hit_delta"])
        w.writerows([["r0", 64], ["r1", 0], ["r2", -64], ["r3", 128]])
    return tmp_path


def test_compare_md_has_units_not_exponents(tmp_path):
    md = compare_markdown(_folder(tmp_path), "cache.enable_mamba_shared_prefix_checkpoint")
    assert md.startswith("# toy: `cache.enable_mamba_shared_prefix_checkpoint` off vs on\n")
    assert "4 requests paired by id. 2 requests reuse more with the flag on, 1 reuse less." in md
    rows = {ln.split(" | ")[0][2:]: ln for ln in md.splitlines() if ln.startswith("| ")}
    assert list(rows)[1:] == list(OFF)                 # the order of summary_deltas.csv
    assert rows["token_hit_rate"] == "| token_hit_rate | 80.86% | 92.23% | +11.37 pp | +14.06% |"
    assert rows["mamba_state_bytes_peak"] == ("| mamba_state_bytes_peak | 48.48 GiB | 48.38 GiB | "
                                              "-0.10 GiB | -0.21% |")
    assert rows["ttft_p50_s"] == "| ttft_p50_s | 0.257 s | 0.099 s | -0.158 s | -61.48% |"
    assert rows["evictions"] == "| evictions | 0 | 5 | +5 | n/a |"
    assert "e+" not in md


def test_value_and_delta_units():
    assert value_text("throughput_tok_s", 1234.5) == "1,234.5 tok/s"
    assert value_text("kv_bytes_peak", 2**31) == "2.00 GiB"
    assert value_text("preemptions", 12345) == "12,345"
    assert delta_text("lost_token_rate", -0.1137) == "-11.37 pp"
    assert value_text("ttft_p99_s", float("nan")) == "n/a"
