"""Markdown and HTML from one list of report blocks.

A report is built once as blocks (``("h1", text)``, ``("p", text)``, ``("ul", items)``,
``("img", file, alt)``, ``("table", Table)``) so that ``report.md`` and the
self-contained ``report.html`` can never say different things.  A figure's alt text is
its caption (the question it answers), which is also drawn under the figure itself.
"""
from __future__ import annotations

import base64
import html
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Table:
    head: list[str]
    rows: list[list[str]]
    align: str  # one of l/r/c per column


def _md_cell(s: str) -> str:
    return s.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def render_md(blocks) -> str:
    """The blocks as Markdown."""
    out = []
    for b in blocks:
        kind = b[0]
        if kind == "h1":
            out += [f"# {b[1]}", ""]
        elif kind == "h2":
            out += [f"## {b[1]}", ""]
        elif kind == "p":
            out += [b[1], ""]
        elif kind == "ul":
            out += [f"- {it}" for it in b[1]] + [""]
        elif kind == "img":
            out += [f"![{b[2]}]({b[1]})", ""]
        elif kind == "table":
            t: Table = b[1]
            sep = {"l": "---", "r": "---:", "c": ":---:"}
            out.append("| " + " | ".join(_md_cell(h) for h in t.head) + " |")
            out.append("|" + "|".join(sep[a] for a in t.align) + "|")
            for r in t.rows:
                out.append("| " + " | ".join(_md_cell(c) for c in r) + " |")
            out.append("")
    return "\n".join(out)


_CSS = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 2em auto;
       max-width: 1400px; padding: 0 1em; color: #222; line-height: 1.45; }
h1 { font-size: 1.5em; border-bottom: 2px solid #ddd; padding-bottom: .2em; }
h2 { font-size: 1.2em; margin-top: 1.8em; border-bottom: 1px solid #eee; }
table { border-collapse: collapse; margin: .6em 0 1em; font-size: .85em; }
th, td { border: 1px solid #ccc; padding: .25em .55em; }
th { background: #f3f3f3; }
tr:nth-child(even) td { background: #fafafa; }
td.r { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.c { text-align: center; }
img { max-width: 100%; height: auto; display: block; margin: .5em 0 1.2em; }
code { background: #f3f3f3; padding: 0 .25em; border-radius: 3px; }
""".strip()


def _html_inline(s: str) -> str:
    """Escape, then render `code` spans as the Markdown does."""
    parts = html.escape(s, quote=False).split("`")
    return "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts))


def render_html(blocks, folder: Path) -> str:
    """The blocks as one HTML file, figures inline as data URIs (read from ``folder``)."""
    title = next((b[1] for b in blocks if b[0] == "h1"), "Report")
    out = ["<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
           f"<title>{html.escape(title)}</title>", f"<style>\n{_CSS}\n</style>", "</head>",
           "<body>"]
    for b in blocks:
        kind = b[0]
        if kind in ("h1", "h2"):
            out.append(f"<{kind}>{_html_inline(b[1])}</{kind}>")
        elif kind == "p":
            out.append(f"<p>{_html_inline(b[1])}</p>")
        elif kind == "ul":
            out.append("<ul>" + "".join(f"<li>{_html_inline(it)}</li>" for it in b[1]) + "</ul>")
        elif kind == "img":
            from sim.rundir.atomic_files import read_back    # (the figure as this report wrote it)

            data = base64.b64encode(read_back(folder / b[1])).decode("ascii")
            out.append(f'<img alt="{html.escape(b[2])}" src="data:image/png;base64,{data}">')
        elif kind == "table":
            t: Table = b[1]
            out.append("<table>")
            out.append("<tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in t.head) + "</tr>")
            for r in t.rows:
                cells = []
                for a, c in zip(t.align, r):
                    cls = f' class="{a}"' if a in "rc" else ""
                    cells.append(f"<td{cls}>{html.escape(c)}</td>")
                out.append("<tr>" + "".join(cells) + "</tr>")
            out.append("</table>")
    out += ["</body>", "</html>", ""]
    return "\n".join(out)
