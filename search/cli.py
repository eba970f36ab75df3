"""Command line: `evolve --axis AXIS --cell CELL [...]` and `evolve resume RUN`.

The lead's simcore/cli.py calls `register_main(parser)` on the top-level parser (the bare
form has no subcommand) and `register(subparsers)` for `resume`; `python -m search ...`
offers the same commands without the rest of `evolve`.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from rich.console import Console

AXES = ("retention", "scheduling", "routing")
_REEXEC_ENV = "AGENTSERVESIM_SEARCH_REEXEC"


def register_main(parser: argparse.ArgumentParser) -> None:
    """Flags of the bare `evolve --axis ... --cell ...` form."""
    g = parser.add_argument_group("policy search (evolve --axis AXIS --cell CELL)")
    g.add_argument("--axis", choices=AXES, help="policy axis to evolve")
    g.add_argument("--cell", help="target cell (see `evolve cells`), e.g. rtx70b_swe_0.1")
    g.add_argument("--config", metavar="FILE", help="search settings YAML (overrides configs/search.yaml)")
    g.add_argument("--seed-file", metavar="FILE", help="start from this policy file instead of the shipped seed")
    g.add_argument("--iterations", type=int)
    g.add_argument("--islands", type=int)
    g.add_argument("--population", type=int)
    g.add_argument("--seed", type=int, help="run seed (sampling and the offline mutator)")
    g.add_argument("--llm", metavar="SPEC", help="offline | openai:MODEL | anthropic:MODEL "
                                                 "(default: the config's models, else offline)")
    g.add_argument("--api-base", metavar="URL", help="OpenAI-compatible server for --llm openai:MODEL")
    g.add_argument("--ray-address", metavar="ADDR", help="join this Ray cluster (default: RAY_ADDRESS, "
                                                         "else start a local one)")
    g.add_argument("--run-dir", metavar="DIR", help="where to write the run (default runs/<run-id>)")
    g.add_argument("--workers", type=int, help="parallel evaluations (default: all cores)")
    g.add_argument("--timeout", type=float, metavar="S", help="hard limit per evaluation stage, seconds")
    g.add_argument("--allow-weak-sandbox", action="store_true", default=None,
                   help="evaluate candidates even where a sandbox isolation layer is unavailable (recorded in the run)")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("resume", help="continue an interrupted search run")
    p.add_argument("run", help="run directory (runs/<run-id>)")
    p.add_argument("--ray-address", metavar="ADDR")
    p.set_defaults(func=run_resume)


def _ensure_fixed_hash_seed() -> None:
    """Re-exec with PYTHONHASHSEED=0: OpenEvolve iterates sets of strings, whose order
    otherwise changes from process to process and would make resume diverge."""
    if os.environ.get("PYTHONHASHSEED") == "0" or os.environ.get(_REEXEC_ENV) == "0":
        return
    env = dict(os.environ, PYTHONHASHSEED="0", **{_REEXEC_ENV: "0"})
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-m", "search", *sys.argv[1:]], env)


def _fail(msg: str) -> int:
    Console(stderr=True, highlight=False, soft_wrap=True).print(f"[red]error:[/red] {msg}")
    return 2


def run(args: argparse.Namespace) -> int:
    """The bare form: create a run directory and search."""
    from .driver import SearchError, create_run, execute
    from .llm import LLMSetupError, build_models, entries_for, label_for, parse_spec
    from .settings import SettingsError, load_settings

    if not args.axis or not args.cell:
        return _fail("a search needs both --axis and --cell (e.g. evolve --axis scheduling --cell rtx70b_swe_0.1)")
    try:
        overrides = {"iterations": args.iterations, "islands": args.islands, "population": args.population,
                     "seed": args.seed, "workers": args.workers, "timeout_s": args.timeout,
                     "evaluator": {"allow_weak_sandbox": True} if getattr(args, "allow_weak_sandbox", None) else None}
        settings = load_settings(args.config, overrides)
        if args.llm:
            parse_spec(args.llm)
        entries = entries_for(args.llm, args.api_base, settings.llm)
        label = label_for(entries)
        if not args.llm and not settings.llm.models and (os.environ.get("OPENAI_API_KEY")
                                                        or os.environ.get("ANTHROPIC_API_KEY")):
            Console(stderr=True).print("note: an API key is set but no model was chosen; searching with the "
                                       "offline mutator (use --llm openai:MODEL or anthropic:MODEL)")
        _ensure_fixed_hash_seed()
        build_models(entries, settings.llm, settings.seed, preflight=True)   # fail before creating the run
        run_dir = create_run(args.axis, args.cell, settings, label,
                             [e.model_dump() for e in entries], args.run_dir, args.seed_file)
        return execute(run_dir, args.ray_address, preflight=False)
    except (SettingsError, LLMSetupError, SearchError) as e:
        return _fail(str(e))


def run_resume(args: argparse.Namespace) -> int:
    from .driver import SearchError, execute
    from .rundir import RunDir, RunError
    try:
        run_dir = RunDir(args.run)
        meta = run_dir.load_meta()
        if meta["status"] == "finished":
            return _fail(f"{args.run}: the run already finished ({meta['iterations_done']} iterations)")
        _ensure_fixed_hash_seed()
        return execute(run_dir, args.ray_address)
    except (RunError, SearchError) as e:
        return _fail(str(e))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m search", description="AgentServeSim policy search")
    register_main(parser)
    sub = parser.add_subparsers(dest="command")
    register(sub)
    args = parser.parse_args(argv)
    if getattr(args, "command", None) == "resume":
        return args.func(args)
    return run(args)
