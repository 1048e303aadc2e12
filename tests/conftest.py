import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import os  # noqa: E402

# Tests measure for themselves: no first-use measurement from an earlier run (or another
# checkout) is read, and nothing is written to the user's cache folder
# (tests/test_measurements.py turns it on in a temporary folder).
os.environ["RECAP_CACHE"] = "0"

# The embedded model's float32 conversion (recap.tools.models.converted_folder) is written once
# per test session into a temporary folder and read by every later load in this process and
# in the servers and fresh environments the tests start (they inherit the variable).
if "RECAP_MODEL_DIR" not in os.environ:
    import atexit  # noqa: E402
    import shutil  # noqa: E402
    import tempfile  # noqa: E402

    os.environ["RECAP_MODEL_DIR"] = _models = tempfile.mkdtemp(prefix="recap-test-models-")
    atexit.register(shutil.rmtree, _models, ignore_errors=True)
