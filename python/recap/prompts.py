"""The prompt set shipped with the package (MT-bench, HumanEval, summarisation) or a user's JSONL.

Each line: {"set": name, "id": str, "turns": [user message, ...]}.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path


@dataclass(frozen=True)
class Prompt:
    set: str
    id: str
    turns: tuple[str, ...]


def load_prompts(path: str | Path | None = None, sets: list[str] | None = None,
                 per_set: int | None = None) -> list[Prompt]:
    if path is None:
        text = resources.files("recap").joinpath("data/prompts.jsonl").read_text()
    else:
        text = Path(path).read_text()
    out: list[Prompt] = []
    counts: dict[str, int] = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        row = json.loads(line)
        if not isinstance(row.get("turns"), list) or not row["turns"]:
            raise ValueError(f"{path}:{n}: expected a non-empty list under 'turns', got {row.get('turns')!r}")
        p = Prompt(set=row.get("set", "custom"), id=str(row.get("id", n)), turns=tuple(row["turns"]))
        if sets and p.set not in sets:
            continue
        if per_set is not None and counts.get(p.set, 0) >= per_set:
            continue
        counts[p.set] = counts.get(p.set, 0) + 1
        out.append(p)
    return out
