"""Writes the README's supported-model table from the test matrix (tests/tiny_models.py):
every family there is tested for greedy equivalence in tests/test_models.py, and the
columns come from what the adapters say about its tiny model.

Run from the repository root: python tools/supported_models.py
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
START, END = "<!-- supported-models:start -->", "<!-- supported-models:end -->"


def table() -> str:
    sys.path.insert(0, str(ROOT / "tests"))
    from recap.adapters import adapter_for
    from tiny_models import TEXT_FAMILIES, VLM_FAMILIES, text_family

    rows = ["| family | kind | class tested | sliding-window layers (as tested) | recap.catchup |",
            "|---|---|---|---|---|"]
    models = [(name, "text", text_family(name)) for name in TEXT_FAMILIES]
    models += [(name, "vision-language", build([5], [6])[0]) for name, build in VLM_FAMILIES.items()]
    for name, kind, model in models:
        a = adapter_for(model)
        if a.sliding_window is None:
            sliding = "no"
        else:
            sliding = "all" if a.mask_types == ["sliding_attention"] else "mixed with full"
        routed = "yes" if a.routing else ("refused" if kind == "vision-language" else "-")
        rows.append(f"| {name} | {kind} | `{type(model).__name__}` | {sliding} | {routed} |")
    return "\n".join(rows)


def render(readme: str, body: str) -> str:
    head, rest = readme.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{body}\n{END}{tail}"


def main() -> None:
    path = ROOT / "README.md"
    path.write_text(render(path.read_text(), table()))
    print(f"wrote the supported-model table into {path}")


if __name__ == "__main__":
    main()
