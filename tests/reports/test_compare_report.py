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


def _scenarios(tmp_path, off: dict, on: dict):
    for side, cache in (("off", off), ("on", on)):
        (tmp_path / side).mkdir(parents=True)
        (tmp_path / side / "run.json").write_text(json.dumps(
            {**RUN, "scenario": {"name": "toy", "cache": cache, "seed": 1}}))
    return tmp_path


def test_the_stored_flag_is_the_one_field_off_then_on(tmp_path):
    import pytest

    from reports.compare_report import stored_flag
    from sim.errors import InputError

    base = {"policy": "vllm", "hash_block_size": 64, "disable_lookahead_block_hashes": True}
    one = _scenarios(tmp_path / "one", {**base, "enable_mamba_shared_prefix_checkpoint": False},
                     {**base, "enable_mamba_shared_prefix_checkpoint": True})
    assert stored_flag(one) == "cache.enable_mamba_shared_prefix_checkpoint"
    two = _scenarios(tmp_path / "two", {**base, "a": False, "b": False},
                     {**base, "a": True, "b": True})
    with pytest.raises(InputError, match=r"not a compare folder of one flag .*cache\.a, cache\.b"):
        stored_flag(two)
    with pytest.raises(InputError, match="none"):
        stored_flag(_scenarios(tmp_path / "none", base, base))


def test_sim_report_rewrites_a_compare_folder(tmp_path):
    from pathlib import Path

    from tests.entrypoints.sim_cli import run_sim

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "cmp"
    assert run_sim("compare", "scenarios/athena-tiny.yaml", "--flag",
                   "enable_mamba_shared_prefix_checkpoint", "--out", str(out), "-q", cwd=root) == 0
    before = {p: (out / p).read_bytes() for p in ("compare.md", "off/report.md", "on/report.md",
                                                  "on/hit_hist.png", "hit_delta.png", "ttft.png")}
    for p in before:
        (out / p).unlink()
    assert run_sim("report", str(out), cwd=root) == 0
    assert {p: (out / p).read_bytes() for p in before} == before


def _paired(tmp_path, deltas, name="toy"):
    """A compare folder whose paired.csv holds ``deltas`` and TTFTs (0.1 s faster on)."""
    tmp_path.mkdir()
    _folder(tmp_path)
    for side in ("off", "on"):
        (tmp_path / side / "run.json").write_text(json.dumps({**RUN, "name": name}))
    with open(tmp_path / "paired.csv", "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["request_id", "prompt_tokens", "hit_off", "hit_on", "hit_delta", "lost_off",
                    "lost_on", "ttft_off_s", "ttft_on_s", "ttft_delta_s"])
        for i, d in enumerate(deltas):
            off = 0.2 + (i % 17) * 0.03
            w.writerow([f"r{i}", 9000, 4000, 4000 + d, d, 0, 0, f"{off:.6f}",
                        f"{off - 0.1:.6f}", "-0.100000"])
    return tmp_path


def test_compare_draws_hit_delta_and_ttft_byte_for_byte(tmp_path):
    """hit_delta.png and ttft.png: drawn into the compare folder, named in compare.md, the
    same bytes from the same folder (few distinct deltas: bars; many: a histogram)."""
    from reports.compare_report import write_compare_report

    few = [4352] * 30 + [0] * 10 + [-64] * 3
    many = [(i * 37) % 3000 - 600 for i in range(400)]
    for deltas in (few, many):
        a, b = (_paired(tmp_path / f"{len(deltas)}{side}", deltas) for side in "ab")
        md = write_compare_report(a, "cache.f").read_text()
        write_compare_report(b, "cache.f")
        for stem in ("hit_delta", "ttft"):
            png = (a / f"{stem}.png").read_bytes()
            assert png.startswith(b"\x89PNG") and len(png) > 5000, stem
            assert png == (b / f"{stem}.png").read_bytes(), stem
            assert f"]({stem}.png)" in md
    assert "How much more (or less) of each prompt" in md


def test_compare_prints_its_folder(tmp_path, capsys):
    from pathlib import Path

    from tests.entrypoints.sim_cli import run_sim

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "cmp"
    assert run_sim("compare", "scenarios/athena-tiny.yaml", "--flag",
                   "enable_mamba_shared_prefix_checkpoint", "--out", str(out), cwd=root) == 0
    line = capsys.readouterr().out.strip()
    assert line.endswith(f"lose  -> {out}/"), line
    assert (out / "hit_delta.png").stat().st_size > 0 and (out / "ttft.png").stat().st_size > 0
