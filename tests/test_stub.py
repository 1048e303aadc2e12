"""The hand-written stub describes the native module exactly: the same public classes and
members, and for every function and method the same parameters (names, kinds, which have
defaults, and the defaults' values where the module states them)."""

import ast
import inspect
from pathlib import Path

import numpy as np
import pytest
import recap._core as core

STUB = Path(core.__file__).parent / "_core.pyi"
TREE = ast.parse(STUB.read_text())
CLASSES = {n.name: n for n in TREE.body if isinstance(n, ast.ClassDef)}


def defs(cls: ast.ClassDef) -> dict[str, ast.FunctionDef]:
    """The class's methods in the stub, those of its (stub) bases included."""
    out = {}
    for base in cls.bases:
        if isinstance(base, ast.Name) and base.id in CLASSES:
            out.update(defs(CLASSES[base.id]))
    out.update({n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)})
    return out


def is_property(fn: ast.FunctionDef) -> bool:
    return any(isinstance(d, ast.Name) and d.id == "property" for d in fn.decorator_list)


def is_static(fn: ast.FunctionDef) -> bool:
    return any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in fn.decorator_list)


def stub_params(fn: ast.FunctionDef, method: bool) -> list[tuple]:
    a = fn.args
    positional = a.posonlyargs + a.args
    if method:
        positional = positional[1:]  # self
    pos_defaults = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    out = [(p.arg, "positional", d) for p, d in zip(positional, pos_defaults, strict=True)]
    if a.vararg is not None:
        out.append((a.vararg.arg, "var", None))
    out += [(p.arg, "keyword", d) for p, d in zip(a.kwonlyargs, a.kw_defaults, strict=True)]
    return out


def native_params(obj, method: bool) -> list[tuple]:
    kinds = {inspect.Parameter.POSITIONAL_ONLY: "positional", inspect.Parameter.POSITIONAL_OR_KEYWORD: "positional",
             inspect.Parameter.VAR_POSITIONAL: "var", inspect.Parameter.KEYWORD_ONLY: "keyword"}
    params = list(inspect.signature(obj).parameters.values())
    if method and params and params[0].name == "self":
        params = params[1:]
    return [(p.name, kinds[p.kind], p.default) for p in params]


def check_signature(where: str, fn: ast.FunctionDef, native, method: bool) -> None:
    want = native_params(native, method)
    got = stub_params(fn, method)
    assert [(n, k, d is not None) for n, k, d in got] == \
        [(n, k, d is not inspect.Parameter.empty) for n, k, d in want], where
    for (name, _, stub_default), (_, _, default) in zip(got, want, strict=True):
        if stub_default is not None and default is not inspect.Parameter.empty and default is not Ellipsis:
            assert ast.literal_eval(stub_default) == default, f"{where}({name}=...)"


def test_stub_lists_exactly_the_public_classes_and_members():
    public_classes = {n for n in CLASSES if not n.startswith("_")}
    assert public_classes == {n for n in dir(core) if isinstance(getattr(core, n), type)}
    for name in public_classes:
        cls = getattr(core, name)
        real = {m for m in dir(cls) if not m.startswith("_")}
        assert {m for m in defs(CLASSES[name]) if not m.startswith("_")} == real, name


def test_every_stubbed_signature_matches_the_module():
    for fn in TREE.body:
        if isinstance(fn, ast.FunctionDef):
            check_signature(fn.name, fn, getattr(core, fn.name), method=False)
    for name, cls in CLASSES.items():
        if name.startswith("_"):
            continue
        for member, fn in defs(cls).items():
            if is_property(fn) or member in ("__len__", "__repr__"):
                continue
            target = getattr(core, name)
            if member == "__init__":
                check_signature(f"{name}()", fn, target, method=True)
                continue
            check_signature(f"{name}.{member}", fn, getattr(target, member), method=not is_static(fn))


def test_the_check_catches_a_wrong_signature():
    fn = ast.parse("def observe_packed(self, packed, k, forward_s=None): ...").body[0]
    with pytest.raises(AssertionError):
        check_signature("Session.observe_packed", fn, core.Session.observe_packed, method=True)
    fn = ast.parse("def pld(vocab_size, *, max_ngram=3, num_tokens=10, excluded=None): ...").body[0]
    with pytest.raises(AssertionError):
        check_signature("Drafter.pld", fn, core.Drafter.pld, method=False)


def test_a_drafter_has_no_stream_of_its_own_a_session_is_one():
    d = core.Drafter.recap(50, k=2)
    for stream_only in ("begin", "propose", "observe", "history", "observe_packed"):
        assert not hasattr(d, stream_only), stream_only  # no hidden default session
    s = d.session()
    s.begin(np.arange(5))
    assert len(s.propose()) >= 1 and s.history.tolist() == [0, 1, 2, 3, 4]
    assert s.bytes() > 0 and dict(s.bytes_by_part())
