"""`python -m recap ...` runs the `recap` command (useful where the venv's bin folder is not on PATH)."""

import sys

from recap.tools.cli import main

sys.exit(main())
