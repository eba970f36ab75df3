"""A search run from the command line: `evolve --axis AXIS --cell CELL [...]` and `evolve
resume RUN [...]`.

The console script (search/cli.py) calls `register_main(parser)` on its top-level parser
(the bare form has no subcommand) and `register(subparsers)` for `resume`.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from rich.console import Console
from rich.text import Text

from simcore.display import strip_control
from simcore.policies.base import AXES

_REEXEC_ENV = "AGENTSERVESIM_SEARCH_REEXEC"


def _llm_help() -> str:
    return ("offline | openai:MODEL | anthropic:MODEL, or a weighted ensemble such as "
            "openai:A@0.7,anthropic:B@0.3 (default: the config's models, else offline)")


def register_main(parser: argparse.ArgumentParser) -> None:
    """Flags of the bare `evolve --axis ... --cell ...` form."""
    g = parser.add_argument_group("policy search (evolve --axis AXIS --cell CELL)")
    g.add_argument("--axis", choices=AXES, help="policy axis to evolve")
    g.add_argument("--cell", help="target cell (see `evolve cells`), e.g. rtx70b_swe_0.1")
    g.add_argument("--with", dest="fixed", action="append", metavar="AXIS=POLICY",
                   help="fix another axis to a shipped policy or a policy file (repeatable), "
                        "e.g. --with retention=ttl")
    g.add_argument("--config", metavar="FILE", help="search settings YAML (overrides configs/search.yaml)")
    g.add_argument("--seed-file", metavar="FILE", help="start from this policy file instead of the shipped seed")
    g.add_argument("--iterations", type=int)
    g.add_argument("--islands", type=int)
    g.add_argument("--population", type=int)
    g.add_argument("--seed", type=int, help="run seed (sampling and the offline mutator)")
    g.add_argument("--llm", metavar="SPEC", help=_llm_help())
    g.add_argument("--api-base", metavar="URL", help="OpenAI-compatible server for the openai: models of --llm")
    g.add_argument("--ray-address", metavar="ADDR", help="join this Ray cluster (default: RAY_ADDRESS, "
                                                         "else start a local one)")
    g.add_argument("--run-dir", metavar="DIR", help="where to write the run (default runs/<run-id>)")
    g.add_argument("--workers", type=int, help="parallel evaluations (default: all cores)")
    g.add_argument("--timeout", type=float, metavar="S", help="hard limit per evaluation stage, seconds")
    g.add_argument("--allow-weak-sandbox", action="store_true", default=None,
                   help="evaluate candidates even where a sandbox isolation layer is unavailable (recorded in the run)")
    g.add_argument("--json", action="store_true",
                   help="progress and report on stderr; the run's final record (run.json) as JSON on stdout")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("resume", help="continue an interrupted run, or extend / re-model a finished one")
    p.add_argument("run", help="run directory (runs/<run-id>)")
    p.add_argument("--iterations", type=int, metavar="N", help="new total number of iterations (extends the run)")
    p.add_argument("--llm", metavar="SPEC", help="use these models for the new iterations: " + _llm_help())
    p.add_argument("--api-base", metavar="URL", help="OpenAI-compatible server for the openai: models of --llm")
    p.add_argument("--ray-address", metavar="ADDR")
    p.add_argument("--json", action="store_true",
                   help="progress and report on stderr; the run's final record (run.json) as JSON on stdout")
    p.set_defaults(func=run_resume)


def _ensure_fixed_hash_seed() -> None:
    """Re-exec with PYTHONHASHSEED=0: OpenEvolve's database iterates sets of program ids,
    whose order otherwise changes from process to process and would make resume diverge.
    `-P` keeps the current directory off sys.path, so a user's search.py cannot stand in
    for this package."""
    if os.environ.get("PYTHONHASHSEED") == "0" or os.environ.get(_REEXEC_ENV) == "0":
        return
    env = dict(os.environ, PYTHONHASHSEED="0", **{_REEXEC_ENV: "0"})
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-P", "-m", "search", *sys.argv[1:]], env)  # search/__main__.py


def _console(args: argparse.Namespace) -> Console | None:
    """With --json the live panel and the report go to stderr, leaving stdout to the JSON."""
    return Console(stderr=True, highlight=False, soft_wrap=True) if getattr(args, "json", False) else None


def _finish(run_dir: Any, args: argparse.Namespace, code: int) -> int:
    if getattr(args, "json", False):
        print(json.dumps({"run_dir": str(run_dir.root), **run_dir.load_meta().model_dump(mode="json")}))
    return code


def _fail(msg: str) -> int:
    c = Console(stderr=True, highlight=False, soft_wrap=True)
    c.print(Text("error: ", style="red") + Text(strip_control(msg)))
    return 2


def _check_flags(args: argparse.Namespace) -> str | None:
    for flag, v in (("--iterations", args.iterations), ("--workers", getattr(args, "workers", None)),
                    ("--islands", getattr(args, "islands", None)),
                    ("--population", getattr(args, "population", None))):
        if v is not None and v <= 0:
            return f"{flag} {v}: must be a positive number"
    t = getattr(args, "timeout", None)
    if t is not None and not t > 0:
        return f"--timeout {t:g}: must be a positive number of seconds"
    return None


def run(args: argparse.Namespace) -> int:
    """The bare form: create a run directory and search."""
    from .driver import SearchError, create_run, execute, parse_with
    from .llm import LLMSetupError, build_backends, entries_for, label_for
    from .settings import SettingsError, load_settings

    if not args.axis or not args.cell:
        return _fail("a search needs both --axis and --cell (e.g. evolve --axis scheduling --cell rtx70b_swe_0.1)")
    bad = _check_flags(args)
    if bad:
        return _fail(bad)
    try:
        overrides = {"iterations": args.iterations, "islands": args.islands, "population": args.population,
                     "seed": args.seed, "workers": args.workers, "timeout_s": args.timeout,
                     "evaluator": {"allow_weak_sandbox": True} if getattr(args, "allow_weak_sandbox", None) else None}
        settings = load_settings(args.config, overrides)
        fixed = parse_with(args.fixed, args.axis)
        entries = entries_for(args.llm, args.api_base, settings.llm)
        label = label_for(entries)
        if not args.llm and not settings.llm.models and (os.environ.get("OPENAI_API_KEY")
                                                        or os.environ.get("ANTHROPIC_API_KEY")):
            Console(stderr=True).print(Text("note: an API key is set but no model was chosen; searching with the "
                                            "offline mutator (use --llm openai:MODEL or anthropic:MODEL)"))
        _ensure_fixed_hash_seed()
        build_backends(entries, settings.llm, settings.seed, preflight=True)   # fail before creating the run
        run_dir = create_run(args.axis, args.cell, settings, label, [e.model_dump() for e in entries],
                             args.run_dir, args.seed_file, fixed=fixed)
        return _finish(run_dir, args, execute(run_dir, args.ray_address, preflight=False, console=_console(args)))
    except (SettingsError, LLMSetupError, SearchError) as e:
        return _fail(str(e))


def run_resume(args: argparse.Namespace) -> int:
    from .driver import SearchError, execute
    from .llm import LLMSetupError, parse_llm_flag
    from .rundir import RunDir, RunError
    if args.iterations is not None and args.iterations <= 0:
        return _fail(f"--iterations {args.iterations}: must be a positive number")
    try:
        run_dir = RunDir(args.run)
        meta = run_dir.load_meta()
        entries = parse_llm_flag(args.llm, args.api_base) if args.llm else None
        if meta.status == "finished" and (args.iterations is None or args.iterations <= meta.iterations_done) \
                and entries is None:
            return _fail(f"{args.run}: the run already finished ({meta.iterations_done} iterations); extend it "
                         f"with --iterations N (the new total, e.g. {meta.iterations_done + 20})")
        _ensure_fixed_hash_seed()
        return _finish(run_dir, args, execute(run_dir, args.ray_address, extend_to=args.iterations,
                                              llm_entries=entries, console=_console(args)))
    except (RunError, SearchError, LLMSetupError) as e:
        return _fail(str(e))

