"""``sim marconi SCENARIO``: the scenario's traffic through Marconi's own cache model (the
paper's token-level reference, ``sim/marconi``), without timing; see ``sim/marconi/route.py``
for why it is a command and not a ``cache.policy``.  Registers on ``sim.entrypoints.cli.app``."""
from __future__ import annotations

from enum import Enum
from pathlib import Path

import typer

from sim.entrypoints.common import parse_sets, requests_override, REQUESTS_HELP, app, fail


class Variant(str, Enum):
    """The paper's three caches (``sim.marconi.VARIANTS``)."""

    marconi = "marconi"
    sglang = "sglang+"
    vllm = "vllm+"


@app.command()
def marconi(scenario: Path = typer.Argument(..., help="Scenario YAML."),
            variant: Variant = typer.Option(Variant.marconi, "--variant",
                                            help="marconi (FLOP-aware), sglang+ (LRU) or vllm+."),
            alpha: float = typer.Option(None, "--alpha", help="Marconi's alpha (default: tuned "
                                        "on the bootstrap window)."),
            out: Path = typer.Option(None, "--out", help="Output folder (default "
                                     "runs/<scenario name>-marconi-<variant>/)."),
            rule: list[str] = typer.Option([], "--rule", metavar="NAME=VALUE",
                                           help="Set one rule where Marconi's code differs "
                                           "(repeatable; sim.marconi.rules, docs/marconi.md)."),
            marconi_code: bool = typer.Option(False, "--marconi-code",
                                              help="Start from every rule set to Marconi's "
                                              "published code (--rule then overrides)."),
            budget: str = typer.Option(None, "--budget", metavar="BYTES",
                                       help="Cache budget instead of the scenario's pool: "
                                       "bytes, or a number with GB, GiB, MB or MiB."),
            sets: list[str] = typer.Option([], "--set", help="Override a field (repeatable)."),
            requests: int = typer.Option(None, "--requests", min=1, metavar="N",
                                         help=REQUESTS_HELP),
            quiet: bool = typer.Option(False, "--quiet", "-q", help="No summary line."),
            ) -> None:
    """Replay a scenario through Marconi's reference cache model (no timing).

    Sized by the scenario's pool (pool_bytes) or --budget, in arrival order, one request at
    a time. Writes requests.csv (hit tokens; timing columns empty), summary.json and report.md.
    """
    from sim.rundir.atomic import check_output_folder
    from sim.errors import ConfigError
    from sim.config.scenario import ScenarioError, load_scenario
    from sim.marconi.route import run_reference, write_reference
    from sim.marconi.rules import DEFAULT, MARCONI_CODE
    from workloads import WorkloadError

    over = requests_override(parse_sets(sets), requests)
    try:
        sc = load_scenario(scenario, over or None)
    except (ScenarioError, ConfigError) as e:
        fail(str(e))
    v = Variant(variant).value
    try:
        rules = (MARCONI_CODE if marconi_code else DEFAULT).with_pairs(rule)
        budget_bytes = None if budget is None else parse_bytes(budget)
    except ConfigError as e:
        msg = str(e)
        if msg.startswith("marconi.rules"):
            fail("--rule " + msg.removeprefix("marconi.rules").lstrip(".:").lstrip())
        fail(f"--{msg.removeprefix('marconi.')}")
    folder = out or Path("runs") / f"{sc.name}-marconi-{v.rstrip('+')}"
    check_output_folder(folder)
    try:
        run = run_reference(sc, v, alpha, rules, budget_bytes)
    except WorkloadError as e:
        fail(f"{scenario}: {e}" if str(e).startswith("workload") else f"{scenario}: workload: {e}")
    except ConfigError as e:
        msg = str(e)
        fail(f"{scenario}: --{msg.removeprefix('marconi.')}" if msg.startswith("marconi.")
             else f"{scenario}: {msg}")
    write_reference(folder, run)
    if not quiet:
        s = run.summary
        typer.echo(f"{s['requests']:,} requests  reference {v}  budget {s['budget_bytes'] / 2**30:.2f} "
                   f"GiB  token hit {s['token_hit_rate']:.2%}  request hit "
                   f"{s['request_hit_rate']:.1%}  (no timing)  -> {folder}/")


_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_bytes(text: str) -> int:
    """``--budget``: a whole number of bytes, as digits or a number and a unit (``50GB`` =
    50 x 10^9, ``4GiB`` = 4 x 2^30; ``50e9`` too)."""
    from sim.errors import ConfigError

    t = text.strip().replace("_", "").replace(",", "")
    num = t.rstrip("KMGTBibB ")
    unit = t[len(num):].strip().upper()
    try:
        value = float(num) * _UNITS[unit]
    except (KeyError, ValueError):
        value = -1.0
    if not 0 <= value <= 2**62 or value != int(value):
        raise ConfigError("marconi.budget", f"must be a whole number of bytes >= 0 (or a number "
                          f"with GB, GiB, MB, MiB), got {text!r}")
    if num.isdigit() and not unit:
        return int(num)
    return int(value)
