"""`python -m search` = the search part of `evolve` (see search/cli.py)."""
import sys

from .cli import main

sys.exit(main())
