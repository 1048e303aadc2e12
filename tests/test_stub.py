"""The hand-written stub lists exactly the public names of the native module."""

import ast
from pathlib import Path

import recap._core as core

STUB = Path(core.__file__).parent / "_core.pyi"


def stub_members():
    tree = ast.parse(STUB.read_text())
    out = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            out[node.name] = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
    return out


def test_stub_matches_the_module():
    stub = stub_members()
    classes = {n for n in dir(core) if isinstance(getattr(core, n), type)}
    assert set(stub) == classes
    for name, members in stub.items():
        public = {m for m in dir(getattr(core, name)) if not m.startswith("_")}
        assert {m for m in members if not m.startswith("_")} == public, name
