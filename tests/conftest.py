import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import os  # noqa: E402

# Tests measure for themselves: no first-use measurement from an earlier run (or another
# checkout) is read, and nothing is written to the user's cache folder
# (tests/test_measurements.py turns it on in a temporary folder).
os.environ["RECAP_CACHE"] = "0"
