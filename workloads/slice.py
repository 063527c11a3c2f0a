"""``python -m workloads.slice SRC DST --lines N [--header]``: copy the first N
lines of a trace (streamed), e.g. to cut a test fixture.  ``--header`` copies
the first line (a CSV header) in addition to the N lines."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def slice_lines(src: Path, dst: Path, lines: int, header: bool = False) -> int:
    """Copy the first ``lines`` lines of ``src`` (plus its first line when ``header``)
    to ``dst``; returns the number of lines written.  Each line keeps its ending;
    a last line without one gets ``\\n``."""
    if Path(src).resolve() == Path(dst).resolve():
        raise ValueError("SRC and DST are the same file")
    want = lines + (1 if header else 0)
    n = 0
    Path(dst).parent.mkdir(parents=True, exist_ok=True)
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        for line in fin:
            if n >= want:
                break
            fout.write(line if line.endswith(b"\n") else line + b"\n")
            n += 1
    return n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m workloads.slice",
                                 description="Copy the first N lines of a trace file.")
    ap.add_argument("src", type=Path, help="trace to read")
    ap.add_argument("dst", type=Path, help="file to write (parent folders are created)")
    ap.add_argument("--lines", type=int, required=True, metavar="N", help="lines to copy")
    ap.add_argument("--header", action="store_true",
                    help="also copy the first line (a CSV header), so DST has N data rows")
    args = ap.parse_args(argv)
    if args.lines < 0:
        ap.error("--lines must be >= 0")
    try:
        n = slice_lines(args.src, args.dst, args.lines, args.header)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{args.dst}: {n} lines")
    return 0


if __name__ == "__main__":
    sys.exit(main())
