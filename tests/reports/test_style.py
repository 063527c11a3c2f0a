"""The shared report style: units written plainly, captions under figures, same bytes."""
from __future__ import annotations

import pytest

from reports import style


def test_token_and_memory_text():
    assert [style.tokens_text(v) for v in (950, 1000, 4416, 52992, 120000, 1_250_000)] == \
        ["950", "1k", "4.42k", "53k", "120k", "1.25M"]
    assert style.gib(5.195e10) == "48.38 GiB"
    assert style.gib(2**30, digits=3) == "1.000 GiB"


def test_nice_step_is_the_next_round_width():
    assert [style.nice_step(v) for v in (0.7, 1, 1.2, 2.2, 3, 6, 47.6, 4932)] == \
        [1, 1, 2, 2.5, 5, 10, 50, 5000]
    assert style.nice_step(2.5, (1, 2, 5)) == 5
    assert style.nice_step(0) == 1.0


def test_log_ticks_are_round_and_at_least_four():
    assert style.nice_log_ticks(0.02, 3.0) == pytest.approx([0.03, 0.1, 0.3, 1, 3])
    assert style.nice_log_ticks(5, 2) == []


def _draw(folder, caption):
    with style.rc():
        fig = style.figure(4, 3)
        ax = fig.add_subplot()
        ax.plot([1, 2, 3], [3, 1, 2])
        ax.set_xlabel("time (s)")
        return style.save(fig, folder, "f", caption, note="x = a long name")


def test_save_writes_caption_and_same_bytes(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    saved = _draw(a, "What does this answer?")
    _draw(b, "What does this answer?")
    assert [p.name for p in saved.files] == ["f.png", "f.svg"]
    assert saved.caption == "What does this answer?"
    svg = (a / "f.svg").read_text()
    assert "What does this answer?" in svg and "x = a long name" in svg
    assert "<dc:date>" not in svg                                   # no date metadata
    png = (a / "f.png").read_bytes()
    assert b"Software" not in png and b"matplotlib" not in png
    for name in ("f.png", "f.svg"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
