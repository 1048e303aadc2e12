"""The modules that moved into subpackages answer to their old names (`recap.config`,
`recap.budget`, ...): objects pickled under an old module path load, and old imports keep
working. An old name is a thin module that forwards attribute reads to the new one."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types

_LAYOUT = {
    "state": ("model_state", "measurements", "memory_pool"),
    "verify": ("tree_pass", "kv_cache", "cudnn_attention", "grouped_attention",
               "linear_layout", "seeding"),
    "first_use": ("budget", "conformance", "layout_choice"),
    "decoding": ("decoder", "request", "continuous", "generation", "acceptance", "sampling",
                 "outputs", "stats", "drafters", "config"),
    "tools": ("cli", "bench", "batch_bench", "prompts", "models"),
}
MOVED = {f"recap.{name}": f"recap.{floor}.{name}" for floor, names in _LAYOUT.items() for name in names}
# Modules that became part of another: a batch's pass and loop are every request's now.
for _old, _new in (("verify.batch_pass", "verify.tree_pass"), ("decoding.batch_decode", "decoding.loop")):
    MOVED[f"recap.{_old.split('.')[1]}"] = MOVED[f"recap.{_old}"] = f"recap.{_new}"


class _Forward(types.ModuleType):
    def __getattr__(self, name: str):
        return getattr(importlib.import_module(MOVED[self.__name__]), name)

    def __dir__(self) -> list[str]:
        return dir(importlib.import_module(MOVED[self.__name__]))


class _OldNames(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path=None, target=None) -> importlib.machinery.ModuleSpec | None:
        return importlib.util.spec_from_loader(fullname, self) if fullname in MOVED else None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return _Forward(spec.name, f"moved to {MOVED[spec.name]}")

    def exec_module(self, module: types.ModuleType) -> None:
        importlib.import_module(MOVED[module.__name__])  # an unknown name fails at import, not later


def install() -> None:
    if not any(isinstance(f, _OldNames) for f in sys.meta_path):
        sys.meta_path.append(_OldNames())
