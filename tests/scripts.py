"""The repository's own scripts (benches/, tools/), loaded as modules by the tests that run them."""

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def load_script(relative: str) -> ModuleType:
    """The module of the script at `relative` (from the repository root), freshly executed."""
    path = ROOT / relative
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None, f"expected a Python script at {path}"
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
