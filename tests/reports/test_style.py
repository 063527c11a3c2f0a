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


def _png_only(folder, caption, note="", far_text=False):
    with style.rc():
        fig = style.figure(4, 3)
        ax = fig.add_subplot()
        ax.plot([1, 2, 3], [3, 1, 2])
        ax.set_xlabel("time (s)")
        if far_text:        # from the figure's right edge across the canvas's margin
            fig.text(0.95, 0.5, "far " * 60)
        return style.save(fig, folder, "f", caption, svg=False, note=note)


def _pixels(path):
    import numpy as np
    from PIL import Image

    return np.asarray(Image.open(path).convert("RGBA"))


def test_png_alone_is_cut_to_what_is_drawn_with_its_texts(tmp_path):
    import numpy as np
    from PIL import Image

    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    saved = _png_only(a, "What does this answer? " * 6, note="x = a long name")
    _png_only(b, "What does this answer? " * 6, note="x = a long name")
    assert [p.name for p in saved.files] == ["f.png"]
    assert (a / "f.png").read_bytes() == (b / "f.png").read_bytes()
    img = Image.open(a / "f.png")
    assert img.mode == "RGB"                      # opaque: stored without alpha
    assert img.info["dpi"] == pytest.approx((style.DPI, style.DPI), abs=0.01)
    px = _pixels(a / "f.png")
    ink = np.flatnonzero((px[:, :, :3] != 255).any(axis=2).any(axis=1))
    cols = np.flatnonzero((px[:, :, :3] != 255).any(axis=2).any(axis=0))
    pad = round(style.Trim.PAD * style.DPI)
    # exactly the padding around what is drawn, on every side
    assert (ink[0], px.shape[0] - 1 - ink[-1]) == (pad, pad)
    assert (cols[0], px.shape[1] - 1 - cols[-1]) == (pad, pad)
    # the note and the (wrapped, three-line) caption lie under the axes: the image is
    # taller than the figure alone, cut tight, would be
    c, d = tmp_path / "c", tmp_path / "d"
    c.mkdir()
    d.mkdir()
    _png_only(c, "")
    assert px.shape[0] > _pixels(c / "f.png").shape[0] + 0.3 * style.DPI
    # the same box as the tight bounding box (with an SVG beside it) to a few pixels
    _draw(d, "What does this answer? " * 6)
    tight = _pixels(d / "f.png")
    assert abs(tight.shape[1] - px.shape[1]) <= 6


def test_png_alone_falls_back_on_the_tight_box_when_a_margin_is_reached(tmp_path):
    saved = _png_only(tmp_path, "caption", far_text=True)
    assert [p.name for p in saved.files] == ["f.png"]
    # the far text (~4 in past the figure's right edge) is whole in the image: the
    # canvas's margin (2.5 in) could not hold it, so the tight box of every artist was
    # used
    assert _pixels(tmp_path / "f.png").shape[1] > (4 + 3.5) * style.DPI


def test_png_canvas_writes_matplotlibs_pixels(tmp_path):
    import io

    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from PIL import Image

    def figure():
        fig = style.figure(3, 2)
        fig.add_subplot().plot([0, 1], [1, 0], label="a line")
        return fig

    ours, theirs = io.BytesIO(), io.BytesIO()
    figure().savefig(ours, format="png", dpi=style.DPI, metadata=style.PNG_META)
    fig = figure()
    FigureCanvasAgg(fig).print_png(theirs, metadata=style.PNG_META)
    a, b = Image.open(ours), Image.open(theirs)
    assert (a.mode, b.mode) == ("RGB", "RGBA")
    assert np.array_equal(np.asarray(a), np.asarray(b)[:, :, :3])
    assert len(ours.getvalue()) < len(theirs.getvalue())
    # a figure that is not opaque keeps its alpha channel
    fig = figure()
    fig.patch.set_alpha(0.0)
    clear = io.BytesIO()
    fig.savefig(clear, format="png", dpi=style.DPI, transparent=True)
    assert Image.open(clear).mode == "RGBA"


def test_png_bytes_decode_to_the_pixels_given():
    """``png_bytes`` (Up-filtered rows, one zlib stream) is a valid PNG that Pillow reads
    back to the same pixels: RGB when all are opaque, RGBA otherwise, on any size and on
    a view cut out of a larger image, with the resolution and text chunks."""
    import io

    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(7)
    big = rng.integers(0, 256, size=(40, 60, 4), dtype=np.uint8)
    cases = [big, big[5:30, 7:51], big[:1, :1], big[:1], big[:, :1]]
    for img in cases:
        for opaque in (True, False):
            px = img.copy()
            if opaque:
                px[:, :, 3] = 255
            data = style.png_bytes(px, style.DPI, {"Title": "t"})
            Image.open(io.BytesIO(data)).verify()            # chunks and CRCs
            got = Image.open(io.BytesIO(data))
            assert got.mode == ("RGB" if opaque else "RGBA")
            assert np.array_equal(np.asarray(got), px[:, :, :3] if opaque else px)
            assert got.info["dpi"] == pytest.approx((style.DPI, style.DPI), abs=0.01)
            assert got.info["Title"] == "t"
    view = big[3:20, 4:30].copy()
    view[:, :, 3] = 255
    cut = big.copy()
    cut[:, :, 3] = 255
    assert style.png_bytes(cut[3:20, 4:30], 100) == style.png_bytes(view, 100)
