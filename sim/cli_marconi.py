"""``sim marconi SCENARIO``: the scenario's traffic through Marconi's own cache model (the
paper's token-level reference, ``sim/marconi``), without timing; see ``sim/marconi/route.py``
for why it is a command and not a ``cache.policy``.  Registers on ``sim.cli.app``."""
from __future__ import annotations

from enum import Enum
from pathlib import Path

import typer

from sim.cli import _parse_sets, _requests_override, REQUESTS_HELP, app, fail


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
            sets: list[str] = typer.Option([], "--set", help="Override a field (repeatable)."),
            requests: int = typer.Option(None, "--requests", min=1, metavar="N",
                                         help=REQUESTS_HELP),
            quiet: bool = typer.Option(False, "--quiet", "-q", help="No summary line."),
            ) -> None:
    """Replay a scenario through Marconi's reference cache model (no timing).

    Sized by the scenario's pool (pool_bytes), in arrival order, one request at a time.
    Writes requests.csv (hit tokens; timing columns empty), summary.json and report.md.
    """
    from sim.atomic import check_output_folder
    from sim.config.errors import ConfigError
    from sim.config.scenario import ScenarioError, load_scenario
    from sim.marconi.route import run_reference, write_reference
    from workloads import WorkloadError

    over = _requests_override(_parse_sets(sets), requests)
    try:
        sc = load_scenario(scenario, over or None)
    except (ScenarioError, ConfigError) as e:
        fail(str(e))
    v = Variant(variant).value
    folder = out or Path("runs") / f"{sc.name}-marconi-{v.rstrip('+')}"
    check_output_folder(folder)
    try:
        run = run_reference(sc, v, alpha)
    except WorkloadError as e:
        fail(f"{scenario}: {e}" if str(e).startswith("workload") else f"{scenario}: workload: {e}")
    except ConfigError as e:
        msg = str(e)
        fail(f"{scenario}: --{msg.removeprefix('marconi.')}" if msg.startswith("marconi.")
             else f"{scenario}: {msg}")
    write_reference(folder, run)
    if not quiet:
        s = run.summary
        typer.echo(f"{s['requests']:,} requests  reference {v}  budget {s['pool_bytes'] / 2**30:.2f} "
                   f"GiB  token hit {s['token_hit_rate']:.2%}  request hit "
                   f"{s['request_hit_rate']:.1%}  (no timing)  -> {folder}/")
