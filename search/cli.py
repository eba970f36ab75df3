"""`evolve`: the one console script, in the top layer.

    evolve --axis scheduling --cell rtx70b_swe_0.1     a search (search/run_cli.py)
    evolve resume RUN                                   continue or extend a search
    evolve cells | policies | simulate | sweep          the simulator (simcore/cli.py)
    evolve workload generate | import | stats           workloads (simcore/workload_cli.py)
    evolve check FILE --axis A                          admission of a policy file (sandbox/check.py)
    evolve runs | leaderboard | show | plot | export    search runs (search/runs_cli.py)
    evolve replay | profile | validate                  a real server against the simulator (search/live/)

Every command is imported here directly: lower layers never reach up for one. Errors a
user can fix (`simcore.errors.UserError` and its subclasses in every layer) print as one
line and exit 2; anything else prints one line naming the internal error (the traceback
with AGENTSERVESIM_DEBUG=1) and exits 1, so no input reaches a user as a traceback.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

from rich.console import Console
from rich.text import Text

from sandbox import check as check_cli
from sandbox.client import load_policy_file
from simcore import cli as simcore_cli
from simcore import workload_cli
from simcore.display import strip_control
from simcore.errors import UserError

from . import run_cli, runs_cli
from .live import cli as live_cli

DEBUG_ENV = "AGENTSERVESIM_DEBUG"


def _load_policy_file(path: str, axis: str, allow_weak_sandbox: bool) -> object:
    return load_policy_file(path, axis, allow_weak_sandbox=allow_weak_sandbox)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="evolve", description="AgentServeSim: simulate agent serving policies "
                                "and evolve better ones. Run `evolve --axis A --cell C` to search.")
    run_cli.register_main(p)   # shown in `evolve --help`; the bare form is parsed on its own (main)
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    simcore_cli.register(sub, _load_policy_file)
    workload_cli.register(sub)
    check_cli.register(sub)
    run_cli.register(sub)
    runs_cli.register(sub)
    live_cli.register(sub)
    return p


def _search_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="evolve", description="AgentServeSim policy search")
    run_cli.register_main(p)
    return p


def _error(msg: str) -> None:
    Console(stderr=True, highlight=False, soft_wrap=True).print(Text("error: ", style="bold red")
                                                                + Text(strip_control(msg)))


def _os_error(e: OSError) -> str:
    where = f"{e.filename}: " if e.filename else ""
    return f"{where}{e.strerror or e}"


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0].startswith("-") and argv[0] not in ("-h", "--help"):
            # The main job: `evolve --axis A --cell C ...` is a search.
            return int(run_cli.run(_search_parser().parse_args(argv)) or 0)
        parser = build_parser()
        args = parser.parse_args(argv)
        if not getattr(args, "func", None):
            parser.print_help()
            return 0
        return int(args.func(args) or 0)
    except UserError as e:
        _error(" ".join(str(e).split()))
        return 2
    except KeyboardInterrupt:
        Console(stderr=True).print("interrupted")
        return 130
    except BrokenPipeError:  # `evolve ... --json | head`: the reader left; not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as e:  # a read-only or full disk, a missing folder: the file and the reason
        _error(_os_error(e))
        return 2
    except Exception as e:  # noqa: BLE001 - the last line of defence against a traceback
        if os.environ.get(DEBUG_ENV):
            raise
        _error(f"internal error: {type(e).__name__}: {' '.join(str(e).split())[:300]} "
               f"(please report it; {DEBUG_ENV}=1 shows the traceback)")
        return 1


if __name__ == "__main__":
    sys.exit(main())
