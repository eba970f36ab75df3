"""`python -m search` = `evolve` (search/cli.py); the search re-executes itself this way."""
import sys

from .cli import main

sys.exit(main())
