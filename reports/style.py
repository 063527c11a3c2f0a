"""One look for every report figure: colours, fonts, sizes, captions, units, saving.

The run, sweep and compare reports import their figure and number style from here so
that a TTFT axis, a GiB value or a caption reads the same in each.  Saving goes
through ``save`` alone, which is what keeps figures byte-identical for the same
inputs: matplotlib's Agg backend, no date/version/software metadata, a fixed SVG hash
salt, a PNG alone cut to its pixels (``Trim``) and one tight bounding box for a PNG
with its SVG.

Figures are plain ``Figure`` objects on this module's ``PngCanvas``, not pyplot's: no
global figure registry to close them from, and a PNG written as the report needs it
(``PngCanvas.print_png``).
"""
from __future__ import annotations

import math
import struct
import textwrap
import zlib
from pathlib import Path
from typing import NamedTuple

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib import cbook  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter  # noqa: E402
from matplotlib.transforms import Bbox, TransformedBbox  # noqa: E402

GIB = 2**30
DPI = 110
PNG_META = {"Software": None}
# zlib level of the PNG files: 3 compresses a report figure ~2x faster than Pillow's
# default 6, in a file a few % larger (9 the smallest, 1 the fastest)
PNG_COMPRESS_LEVEL = 3
SVG_META = {"Date": None, "Creator": None}
RC = {
    "svg.hashsalt": "hybrid-cache-sim-report",
    "svg.fonttype": "none",  # text stays text: smaller files, searchable labels
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.labelsize": 9,
    "legend.fontsize": 8,
    "xtick.labelsize": 8,
    "ytick.labelsize": 8,
    # unhinted glyphs: FreeType's TrueType hinting interpreter ran for every glyph of
    # every text, ~6 % of a report figure's instructions, for glyph shapes and advances
    # that differ by a fraction of a pixel at this resolution
    "text.hinting": "no_hinting",
}

# colours: one meaning each across the reports
HIT = "#1f77b4"          # reuse, TTFT p50, the highlighted series
LOSS = "#d62728"         # reuse given up by reconciliation
FRONTIER = "#d62728"     # on the Reuse-Pareto frontier
DOMINATED = "#7f7f7f"
P99 = "#ff7f0e"
CONTEXT = "#c8c8c8"      # the other series behind a highlighted one
NOTE = "grey"
CAPTION = "#333333"

# figure sizes (inches)
SINGLE = (8.0, 4.6)      # one panel with a legend outside on the right
PANEL = (3.0, 2.2)       # one small multiple


def rc():
    """The report style as a context (``with rc(): ...``)."""
    return plt.rc_context(RC)


class PngCanvas(FigureCanvasAgg):
    """matplotlib's Agg canvas, with a PNG as the report writes it: the same pixels as
    ``FigureCanvasAgg.print_png`` (the same rendering, the same resolution and text
    chunks), stored as RGB when every pixel is opaque (a report figure always is: its
    white background covers the image), else as RGBA (``write_png``).

    Given a ``Trim`` (``save``), the image is first cut to what was drawn, with the
    trim's texts drawn under it."""

    def print_png(self, filename_or_obj, *, metadata=None, pil_kwargs=None,
                  trim: "Trim | None" = None, **_applied):
        # (``_applied``: what ``print_figure`` passes on to every print method, facecolor
        # and the like, already set on the figure; matplotlib's own methods drop them)
        texts = {k: v for k, v in {"Software": f"Matplotlib version{matplotlib.__version__}, "
                                               f"https://matplotlib.org/",
                                   **(metadata or {})}.items() if v is not None}
        FigureCanvasAgg.draw(self)
        rgba = np.asarray(self.buffer_rgba())
        if trim is not None:
            rgba = trim.cut(self, rgba)
            if rgba is None:            # (something drawn reached the margin: no file)
                return
        dpi = self.figure.dpi
        if pil_kwargs:                  # (Pillow's options: Pillow writes it)
            from PIL import Image, PngImagePlugin

            info = PngImagePlugin.PngInfo()
            for k, v in texts.items():
                info.add_text(k, v)
            image = Image.fromarray(np.ascontiguousarray(rgba), "RGBA")
            if bool((rgba[:, :, 3] == 255).all()):
                image = image.convert("RGB")
            image.save(filename_or_obj, **{"format": "png", "dpi": (dpi, dpi),
                                           "pnginfo": info, **pil_kwargs})
            return
        with cbook.open_file_cm(filename_or_obj, "wb") as f:
            f.write(png_bytes(rgba, dpi, texts))


def _chunk(kind: bytes, data: bytes) -> bytes:
    """One PNG chunk: length, type, data, CRC of type and data."""
    return (struct.pack(">I", len(data)) + kind + data
            + struct.pack(">I", zlib.crc32(data, zlib.crc32(kind))))


def png_bytes(rgba: np.ndarray, dpi: float, texts: dict[str, str] | None = None) -> bytes:
    """An RGBA image (rows top first, 8 bits a channel) as a PNG file: RGB when every
    pixel is opaque, else RGBA; every row filtered by "Up" (its difference from the row
    above, by numpy, read straight from the canvas's buffer) and compressed at
    ``PNG_COMPRESS_LEVEL``; the resolution as Pillow writes it (pixels a metre,
    rounded) and ``texts`` as tEXt chunks (Latin-1).

    Pillow tried all five filters on every row to pick one (its encoder has no setting
    for it) and needed the pixels copied out of the canvas first: with the compression,
    a third of the instructions of drawing a report figure, against ~a tenth here, for
    files ~3-5 % larger."""
    h, w = rgba.shape[:2]
    px = rgba[:, :, :3] if bool((rgba[:, :, 3] == 255).all()) else rgba
    ch = px.shape[2]
    rows = np.empty((h, 1 + w * ch), dtype=np.uint8)
    rows[:, 0] = 2                                      # filter type 2: Up
    out = rows[:, 1:].reshape(h, w, ch)
    for c in range(ch):     # (a channel at a time: numpy's loops then run along a row,
        out[0, :, c] = px[0, :, c]          # not three bytes at a time; the row above the
        np.subtract(px[1:, :, c], px[:-1, :, c], out=out[1:, :, c])   # first is 0; mod 256)
    ppm = int(dpi / 0.0254 + 0.5)
    out = [b"\x89PNG\r\n\x1a\n",
           _chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2 if ch == 3 else 6, 0, 0, 0)),
           _chunk(b"pHYs", struct.pack(">IIB", ppm, ppm, 1))]
    for k, v in (texts or {}).items():
        out.append(_chunk(b"tEXt", k.encode("latin-1") + b"\0" + v.encode("latin-1")))
    out += [_chunk(b"IDAT", zlib.compress(rows, PNG_COMPRESS_LEVEL)), _chunk(b"IEND", b"")]
    return b"".join(out)


def _ink(rgba: np.ndarray) -> tuple[int, int, int, int] | None:
    """The rows and columns ``(top, bottom, left, right)`` (ends exclusive) of the
    pixels that are not opaque white; None if there are none."""
    h, w = rgba.shape[:2]
    other = np.ascontiguousarray(rgba).view(np.uint32).reshape(h, w) != 0xFFFFFFFF
    rows = np.flatnonzero(other.any(axis=1))
    if not len(rows):
        return None
    cols = np.flatnonzero(other.any(axis=0))
    return int(rows[0]), int(rows[-1]) + 1, int(cols[0]), int(cols[-1]) + 1


class Trim:
    """A PNG cut to what was drawn (``save``): the figure is drawn once on a canvas with
    wide white margins (``margins``), the texts (a note, the caption) are drawn under
    the drawn pixels, left-aligned and wrapped to their width, and the image is cut to
    all of it with ``PAD`` inches around.  matplotlib's tight bounding box would lay
    out every axis and text once more before the draw: a fifth to a third of a report
    figure's time.  ``clipped``: something reached the margin (nothing written; ``save``
    then falls back on the tight bounding box)."""

    PAD = 0.1           # inches around what is drawn, as ``bbox_inches`` pads it
    GAP = 0.08          # inches between the figure and a text under it

    def __init__(self, texts: list[tuple[str, dict]]):
        self.texts = texts
        self.clipped = False

    def margins(self, fig) -> Bbox:
        """The canvas (inches, figure coordinates): the figure with room on every side
        (legends beside the axes on the right) and below for the texts, each line
        counted at the narrowest wrapping (40 characters)."""
        w, h = fig.get_figwidth(), fig.get_figheight()
        below = 0.6 + sum((math.ceil(len(t) / 40) + 1) * kw["fontsize"] * 1.3 / 72
                          + self.GAP for t, kw in self.texts)
        return Bbox([[-0.6, -below], [w + 2.5, h + 0.6]])

    def cut(self, canvas, rgba: np.ndarray) -> np.ndarray | None:
        """The drawn image with the texts, cut; None when it reaches the margin."""
        from matplotlib.text import Text
        from matplotlib.transforms import IdentityTransform

        dpi = canvas.figure.dpi
        pad = round(self.PAD * dpi)
        h, w = rgba.shape[:2]
        box = _ink(rgba)
        if box is None:
            self.clipped = True
            return None
        top, bottom, left, right = box
        # the box drawn so far, display pixels (origin bottom left), as ``_under`` keeps it
        x0, x1, y0 = float(left), float(right), float(h - bottom)
        renderer = canvas.get_renderer()
        for text, kw in self.texts:
            t = Text(x0, y0 - self.GAP * dpi, _wrapped(text, (x1 - x0) / dpi, kw["fontsize"]),
                     ha="left", va="top", transform=IdentityTransform(),
                     figure=canvas.figure, **kw)
            t.draw(renderer)
            ext = t.get_window_extent(renderer)
            if ext.width > 0 or ext.height > 0:
                x0, x1, y0 = min(x0, ext.x0), max(x1, ext.x1), min(y0, ext.y0)
        rgba = np.asarray(canvas.buffer_rgba())
        # the texts lie below what was drawn: only those rows are read again
        below = _ink(rgba[bottom:]) if self.texts else None
        if below is not None:
            left, right = min(left, below[2]), max(right, below[3])
            bottom += below[1]
        if top < pad or left < pad or bottom > h - pad or right > w - pad:
            self.clipped = True
            return None
        return rgba[top - pad:bottom + pad, left - pad:right + pad]


def figure(w: float, h: float) -> Figure:
    """A ``w`` x ``h`` inch figure at ``DPI`` on a ``PngCanvas`` (not registered with
    pyplot: nothing to close)."""
    fig = Figure(figsize=(w, h), dpi=DPI)
    PngCanvas(fig)
    return fig


# the titles of axes built under this placed at the axes' top edge once (``fixed_titles``)
FIXED_TITLES = {"axes.titley": 1.0}


def fixed_titles():
    """A context in which new axes place their titles at the top edge (y = 1.0 in axes
    coordinates, plus the title pad), as set, instead of searching at every draw for
    what a title must clear above the axes (ticks or an x label on top, a y-axis offset
    text): that search measured every y tick label's box again, 10-15 % of drawing a
    run figure.  For axes with none of those (the run report's four figures: ticks and
    labels at the bottom and left, axes starting at 0, so no offset text) the search
    leaves the title exactly there: the same pixels (tested)."""
    return matplotlib.rc_context(FIXED_TITLES)


def ready(axes, ticks: int = 12) -> None:
    """Create ``ticks`` major ticks on both axes of each of ``axes`` now.  matplotlib
    creates a tick object (~1 ms each) when a draw first needs it; a figure built
    ahead of its data (``reports/workers.py``) is drawn with that work done.  Ticks a
    draw does not need are neither drawn nor measured, and the ones it does take their
    settings from the same calls, so the figure's bytes are the same."""
    for ax in axes:
        ax.xaxis.get_major_ticks(ticks)
        ax.yaxis.get_major_ticks(ticks)


def _wrapped(text: str, width: float, fontsize: float) -> str:
    """``text`` wrapped to ``width`` inches at ``fontsize`` points (~0.008 in per
    character and point, at least 40 characters a line): a note or caption under a
    figure, on either way of saving it (``_under``, ``Trim``)."""
    return "\n".join(textwrap.wrap(text, max(40, int(width / (0.008 * fontsize))))) or text


def _under(fig, bb, text: str, renderer, **kw):
    """``text`` under ``bb`` (the tight box of everything drawn so far, inches),
    left-aligned, wrapped to its width; returns the tight box with the text.

    The figure's tight box is the union of its artists' boxes, so the new one is the
    old one united with the text's own: measuring the text alone gives the same box as
    measuring the figure again, without laying out every axis once more per text."""
    w, h = fig.get_figwidth(), fig.get_figheight()
    t = fig.text(bb.x0 / w, (bb.y0 - Trim.GAP) / h, _wrapped(text, bb.width, kw["fontsize"]),
                 ha="left", va="top", **kw)
    tb = t.get_tightbbox(renderer)
    if tb is None or not (math.isfinite(tb.width) and math.isfinite(tb.height)) \
            or (tb.width == 0 and tb.height == 0):
        return bb   # (as the figure's box leaves out an empty text)
    # pixels to inches as the figure's box converts them (a monotone scale: the union
    # of converted boxes is the converted union)
    return Bbox.union([bb, TransformedBbox(tb, fig.dpi_scale_trans.inverted())])


class Saved(NamedTuple):
    """A figure as written: its files (PNG first) and its caption, which the report
    also uses as the image's alt text."""

    files: list[Path]
    caption: str


NOTE_STYLE = {"fontsize": 7.5, "color": NOTE}
CAPTION_STYLE = {"fontsize": 8.5, "style": "italic", "color": CAPTION}


def save(fig, folder: Path, stem: str, caption: str = "", svg: bool = True,
         note: str = "", into=None) -> Saved:
    """``stem``.png (and .svg) with a small grey ``note`` (e.g. what short names stand
    for) and then the caption under the figure.  A PNG alone is drawn once and cut to
    what was drawn (``Trim``); with an SVG, one tight bounding box for both files.
    ``into``: a binary file object the PNG is written to instead of ``folder`` (no SVG;
    the bytes the file would hold: a report worker draws a figure before the run
    folder exists, ``reports/workers.py``)."""
    import io

    from sim.rundir.atomic_files import write_file     # (whole files only)

    png = Path(folder) / f"{stem}.png"
    if into is not None and svg:
        raise ValueError("save: an SVG is written to the folder only")
    target = io.BytesIO() if into is None else into
    if not svg and isinstance(fig.canvas, PngCanvas):
        trim = Trim([(t, kw) for t, kw in ((note, NOTE_STYLE), (caption, CAPTION_STYLE)) if t])
        fig.savefig(target, format="png", dpi=DPI, bbox_inches=trim.margins(fig),
                    metadata=PNG_META, trim=trim)
        if not trim.clipped:
            if into is None:
                write_file(png, target.getvalue())
            return Saved([png], caption)
        if into is None:
            target = io.BytesIO()           # (nothing was written: drawn again below)
    renderer = fig.canvas.get_renderer()
    bb = fig.get_tightbbox(renderer)
    if note:
        bb = _under(fig, bb, note, renderer, **NOTE_STYLE)
    if caption:
        bb = _under(fig, bb, caption, renderer, **CAPTION_STYLE)
    bb = bb.padded(Trim.PAD)
    fig.savefig(target, format="png", dpi=DPI, bbox_inches=bb, metadata=PNG_META)
    if into is None:
        write_file(png, target.getvalue())
    out = [png]
    if svg:
        out.append(png.with_suffix(".svg"))
        buf = io.BytesIO()
        fig.savefig(buf, format="svg", bbox_inches=bb, metadata=SVG_META)
        write_file(out[-1], buf.getvalue())
    return Saved(out, caption)


def distinct_bars(ax, distinct, counts, color, labels: list[str], xlabel: str) -> None:
    """One bar per distinct value (few of them: typically whole blocks), its count
    written on it; ``color`` one colour or one per bar, ``labels`` the values' ticks."""
    x = np.arange(len(distinct))
    ax.bar(x, counts, color=color, width=0.6)
    for xi, c in zip(x, counts):
        ax.text(xi, c, f"{c:,}", ha="center", va="bottom", fontsize=7.5)
    ax.set_xticks(x)
    ax.set_xticklabels(labels)
    ax.set_xlim(-0.7, len(distinct) - 0.3)
    ax.set_ylim(0, counts.max() * 1.12)
    ax.set_xlabel(xlabel)


def empty(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color=NOTE)
    ax.set_xticks([])
    ax.set_yticks([])


def series_style(i: int, n: int):
    """(colour, line style, marker) of the i-th of n series."""
    if n <= 10:
        return plt.get_cmap("tab10")(i % 10), "-", "o"
    styles, markers = ("-", "--", ":"), ("o", "s", "^")
    return plt.get_cmap("tab20")(i % 20), styles[(i // 20) % 3], markers[(i // 20) % 3]


# ---------------------------------------------------------------- numbers and units


def finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def gib(nbytes: float, digits: int = 2) -> str:
    """Bytes as ``12.34 GiB`` (GiB = 2^30 bytes)."""
    return f"{nbytes / GIB:.{digits}f} GiB"


def tokens_text(v: float) -> str:
    """A token count for a tick or a bar: 950, 4.4k, 120k, 1.2M."""
    a = abs(v)
    if a >= 1e6:
        return f"{v / 1e6:.3g}M"
    if a >= 1000:
        return f"{v / 1000:.3g}k"
    return f"{v:g}"


def token_axis(axis) -> None:
    """Linear token axis with short tick labels (no colliding ``100000120000``)."""
    axis.set_major_formatter(FuncFormatter(lambda v, _: tokens_text(v)))


def integer_axis(axis) -> None:
    """Counts: integer ticks only."""
    axis.get_major_locator().set_params(integer=True)


def nice_step(raw: float, mantissas: tuple[float, ...] = (1, 2, 2.5, 5)) -> float:
    """The smallest round width (a mantissa x 10^k) at least ``raw``."""
    if not raw > 0:
        return 1.0
    e = 10.0 ** math.floor(math.log10(raw))
    return next(m * e for m in (*mantissas, 10) if m * e >= raw * (1 - 1e-12))


def nice_log_ticks(lo: float, hi: float) -> list[float]:
    """Round tick values (1-3, 1-2-5 or finer) within [lo, hi] on a log axis, at least 4."""
    if not (lo > 0 and hi > lo):
        return []
    ticks: list[float] = []
    for mant in ((1,), (1, 3), (1, 2, 5), (1, 2, 3, 5, 7), (1, 1.5, 2, 3, 4, 5, 7)):
        ticks = []
        for e in range(math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 1):
            ticks += [m * 10.0**e for m in mant]
        ticks = [t for t in ticks if lo <= t * (1 + 1e-9) and t <= hi * (1 + 1e-9)]
        if len(ticks) >= 4:
            return ticks
    return ticks


def log_axis(axis, lo: float, hi: float, tokens: bool = False) -> None:
    """Log scale with round, plainly written ticks (no 10^x, no minor labels)."""
    ticks = nice_log_ticks(lo, hi)
    if ticks:
        axis.set_major_locator(FixedLocator(ticks))
        axis.set_ticklabels([tokens_text(t) if tokens else f"{t:g}" for t in ticks])
    axis.set_minor_formatter(NullFormatter())
