"""Command line: ``sim case`` (and, as they land, run · steps · sweep · check ...)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="hybrid-cache-sim: vLLM prefix caching for hybrid Mamba/attention models.")


def fail(message: str) -> None:
    """One clear line on stderr, exit code 2 (bad input)."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


@app.command()
def case(files: list[Path] = typer.Argument(..., help="Case files (YAML or JSON)."),
         compact: bool = typer.Option(False, "--compact", help="One-line JSON.")) -> None:
    """Run case files through the exact cache model and print JSON.

    One file prints an array (one object per request); several print an object
    keyed by the paths as given.
    """
    from sim.cache.case import CaseError, run_case_file

    out = {}
    for f in files:
        try:
            out[str(f)] = run_case_file(f)
        except CaseError as e:
            fail(str(e))
    result = out[str(files[0])] if len(files) == 1 else out
    json.dump(result, sys.stdout, indent=None if compact else 1)
    sys.stdout.write("\n")


@app.callback()
def _main() -> None:
    """hybrid-cache-sim."""


if __name__ == "__main__":
    app()
