"""The prompt set shipped with the package (MT-bench, HumanEval, summarisation, easy-VQA) or a
user's JSONL.

Each line: {"set": name, "id": str, "turns": [user message, ...], "image": optional path}. An
image path is relative to the JSONL file.
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
    image: Path | None = None


def load_prompts(path: str | Path | None = None, sets: list[str] | None = None,
                 per_set: int | None = None, images: bool = False, skip: int = 0) -> list[Prompt]:
    """Prompts in file order, optionally only from `sets`, after the first `skip` of each
    set, and at most `per_set` per set. Prompts with an image are kept only when `images` is
    true (a vision-language model)."""
    if path is None:
        source = Path(str(resources.files("recap").joinpath("data/prompts.jsonl")))
    else:
        source = Path(path)
    text = source.read_text()
    out: list[Prompt] = []
    counts: dict[str, int] = {}
    skipped: dict[str, int] = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        row = json.loads(line)
        if not isinstance(row.get("turns"), list) or not row["turns"]:
            raise ValueError(f"{path}:{n}: expected a non-empty list under 'turns', got {row.get('turns')!r}")
        image = source.parent / row["image"] if row.get("image") else None
        p = Prompt(set=row.get("set", "custom"), id=str(row.get("id", n)), turns=tuple(row["turns"]), image=image)
        if (sets and p.set not in sets) or (p.image is not None and not images):
            continue
        if skipped.get(p.set, 0) < skip:
            skipped[p.set] = skipped.get(p.set, 0) + 1
            continue
        if per_set is not None and counts.get(p.set, 0) >= per_set:
            continue
        counts[p.set] = counts.get(p.set, 0) + 1
        out.append(p)
    return out
