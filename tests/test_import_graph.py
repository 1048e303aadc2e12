"""The package's import graph: no circle, counting module-level, function-level and
annotation (TYPE_CHECKING) imports alike, and the floors that must import nothing above them."""

from __future__ import annotations

import ast
from pathlib import Path

import recap

PACKAGE = Path(recap.__file__).parent


def modules(root: Path) -> dict[str, Path]:
    """Dotted name -> file, for every .py file of the package under `root`."""
    out = {}
    for f in root.rglob("*.py"):
        parts = f.relative_to(root.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = f
    return out


def graph(files: dict[str, Path], extension_modules: tuple[str, ...] = ()) -> dict[str, set[str]]:
    """Who imports whom among `files` (every import statement anywhere in a file). `from p
    import m` where p.m is a module counts as importing p.m, not p."""
    known = set(files) | set(extension_modules)

    def owner(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[str, set[str]] = {m: set() for m in files}
    for mod, path in files.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                subs = [f"{base}.{a.name}" for a in node.names]
                names = [s for s in subs if s in known] or [base]
            else:
                continue
            for name in names:
                target = owner(name)
                if target is not None and target != mod and target in files:
                    edges[mod].add(target)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_checker_finds_a_cycle_hidden_in_a_function_and_an_annotation(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from pkg import b\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.c import C\n")
    (pkg / "c.py").write_text("from . import a\n")
    (pkg / "d.py").write_text("from pkg import a\n")
    assert cycles(graph(modules(pkg))) == [["pkg.a", "pkg.b", "pkg.c"]]


def test_the_package_imports_in_no_circle():
    edges = graph(modules(PACKAGE), ("recap._core",))
    assert "recap.decoding.decoder" in edges["recap.decoding.generation"]  # the graph sees real imports
    assert cycles(edges) == []


# The floors, bottom up (docs/architecture.md): a module imports its own floor and those below.
FLOORS = {"_core": 0, "_moved": 0, "state": 0, "adapters": 0, "verify": 1, "catchup": 1, "first_use": 2,
          "decoding": 3, "": 4, "serve": 5, "tools": 6, "__main__": 7}


def floor(module: str) -> int:
    parts = module.split(".")
    return FLOORS[parts[1] if len(parts) > 1 else ""]


def test_every_module_sits_on_a_floor():
    assert {m.split(".")[1] for m in modules(PACKAGE) if "." in m} <= set(FLOORS)


def test_the_floors_import_nothing_above_them():
    edges = graph(modules(PACKAGE), ("recap._core",))
    upward = sorted((m, t) for m, targets in edges.items() for t in targets if floor(t) > floor(m))
    assert upward == []
    # What is kept with the model is plain data: it imports nothing of recap.
    assert edges["recap.state.model_state"] == set()
    # Adapters hold every model-specific fact and import nothing but adapters.
    for mod, targets in edges.items():
        if mod.startswith("recap.adapters"):
            assert {t for t in targets if not t.startswith("recap.adapters")} == set(), mod


def test_a_pickle_naming_a_moved_module_loads():
    import pickle

    config = recap.RecapConfig(budget=7)
    old = pickle.dumps(config, protocol=0).replace(b"recap.decoding.config", b"recap.config")
    assert b"recap.config\n" in old
    assert pickle.loads(old) == config
