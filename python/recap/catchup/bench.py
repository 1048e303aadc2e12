"""Routing modes and budgets side by side: KV cache, prefill FLOPs and prefill time vs dense,
and (with a real model and a question file) answer accuracy and agreement with dense.

Every configuration runs on the same prompts in one process; timing repetitions rotate
through the configurations so machine noise falls on all of them alike; medians are reported.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

import recap.catchup as catchup
from recap.catchup.config import CatchUpConfig

BUDGETS = (64, 128, 192)
MODES = ("fastv", "pyramiddrop", "reroute", "catchup")
TINY_IMAGE = 336  # LLaVA-1.5's input size: 576 visual tokens of 14-pixel patches


def tiny_llava(layers: int = 32, hidden: int = 256, seed: int = 0):
    """A randomly initialised LLaVA-1.5-shaped model (32 decoder layers, 576 visual tokens)
    small enough for a CPU: routing costs and savings, not answers, are what it can show."""
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration

    torch.manual_seed(seed)
    vision = CLIPVisionConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                              image_size=TINY_IMAGE, patch_size=14)
    text = LlamaConfig(vocab_size=1024, hidden_size=hidden, intermediate_size=hidden * 8 // 3, num_hidden_layers=layers,
                       num_attention_heads=hidden // 32, num_key_value_heads=hidden // 32, max_position_embeddings=4096)
    cfg = LlavaConfig(vision_config=vision, text_config=text, image_token_index=1000, vision_feature_layer=-1)
    return LlavaForConditionalGeneration(cfg).eval()


def tiny_inputs(model, image_path: Path, question_ids: list[int]) -> dict:
    """Inputs of the tiny model: a few text tokens, the image's 576 placeholders, the question."""
    import numpy as np
    from PIL import Image

    img = Image.open(image_path).convert("RGB").resize((TINY_IMAGE, TINY_IMAGE))
    px = torch.tensor(np.asarray(img, dtype=np.float32) / 255.0).permute(2, 0, 1)[None]
    n = (TINY_IMAGE // 14) ** 2
    ids = torch.tensor([[1, 5, 9] + [model.config.image_token_id] * n + question_ids])
    return dict(input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values=px)


@dataclass
class Case:
    """One routing configuration ("dense" has no budget)."""

    mode: str
    budget: int | None = None

    @property
    def label(self) -> str:
        return self.mode if self.budget is None else f"{self.mode}@{self.budget}"

    def config(self) -> CatchUpConfig:
        return CatchUpConfig(mode=self.mode, budget=self.budget)


@dataclass
class Row:
    case: Case
    stats: list = field(default_factory=list)
    prefill_s: list[float] = field(default_factory=list)
    answers: list[str] = field(default_factory=list)
    correct: int = 0
    agree: int = 0


def _prefill(model, inputs) -> float:
    t0 = time.perf_counter()
    with torch.no_grad():
        model(**inputs, logits_to_keep=1)
    return time.perf_counter() - t0


def run(model, prompts: list[dict], cases: list[Case], reps: int = 5,
        answer: Callable[[dict], str] | None = None, progress: bool = True) -> list[Row]:
    """Statistics and median prefill times of every case on every prompt; with `answer`
    (prompt -> generated text), also the answers, their accuracy against prompt["answer"]
    and their agreement with the dense answers."""
    rows = [Row(c) for c in [Case("dense"), *cases]]
    for p in prompts:
        _prefill(model, p["inputs"])  # warm-up
        times: dict[str, list[float]] = {r.case.label: [] for r in rows}
        stats = {}
        for rep in range(max(reps, 1)):
            order = rows[rep % len(rows):] + rows[:rep % len(rows)]
            for r in order:
                with catchup.routed(model, r.case.config()) as router:
                    times[r.case.label].append(_prefill(model, p["inputs"]))
                stats[r.case.label] = router.last_stats  # the same every repetition
        for r in rows:
            r.stats.append(stats[r.case.label])
            r.prefill_s.append(statistics.median(times[r.case.label]))
            if answer is not None:
                with catchup.routed(model, r.case.config()):
                    r.answers.append(answer(p))
        if progress:
            print(".", end="", flush=True)
    if answer is not None:
        dense = rows[0].answers
        for r in rows:
            r.agree = sum(a == d for a, d in zip(r.answers, dense, strict=True))
            r.correct = sum(p.get("answer", "\0").lower() in a.lower() for a, p in zip(r.answers, prompts, strict=True))
    if progress:
        print()
    return rows


def summary(rows: list[Row]) -> list[dict]:
    dense_t = sum(rows[0].prefill_s)
    out = []
    for r in rows:
        s = r.stats
        kv = sum(x.kv_bytes for x in s)
        kv_dense = sum(x.kv_bytes_dense for x in s)
        flops = sum(x.prefill_flops for x in s)
        flops_dense = sum(x.prefill_flops_dense for x in s)
        d = {"case": r.case.label, "mode": r.case.mode, "budget": r.case.budget,
             "visual_tokens": statistics.mean(x.visual_tokens for x in s),
             "mean_active_visual": statistics.mean(x.mean_active_visual for x in s),
             "stage_budgets": s[0].stage_budgets, "readmitted": statistics.mean(sum(x.readmitted) for x in s),
             "kv_mib": kv / len(s) / 2**20, "kv_ratio": kv / kv_dense, "flops_ratio": flops / flops_dense,
             "snapshot_kib": statistics.mean(x.snapshot_bytes for x in s) / 1024,
             "prefill_ms": sum(r.prefill_s) / len(r.prefill_s) * 1e3, "prefill_ratio": sum(r.prefill_s) / dense_t}
        if r.answers:
            d.update(accuracy=r.correct / len(r.answers), agree_with_dense=r.agree / len(r.answers))
        out.append(d)
    return out


def markdown(table: list[dict]) -> str:
    answers = "accuracy" in table[0]
    head = ["routing", "active visual / layer", "stage K", "re-admitted", "KV MiB", "KV vs dense",
            "prefill FLOPs vs dense", "snapshots KiB", "prefill ms", "prefill time vs dense"]
    if answers:
        head += ["accuracy", "same answer as dense"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for d in table:
        cells = [d["case"], f"{d['mean_active_visual']:.1f} of {d['visual_tokens']:.0f}",
                 ",".join(map(str, d["stage_budgets"])) or "-", f"{d['readmitted']:.1f}", f"{d['kv_mib']:.2f}",
                 f"{d['kv_ratio']:.3f}", f"{d['flops_ratio']:.3f}", f"{d['snapshot_kib']:.0f}",
                 f"{d['prefill_ms']:.1f}", f"{d['prefill_ratio']:.3f}"]
        if answers:
            cells += [f"{d['accuracy']:.3f}", f"{d['agree_with_dense']:.3f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def save(out: Path, table: list[dict], meta: dict) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    js, md = out / "catchup.json", out / "catchup.md"
    js.write_text(json.dumps({"meta": meta, "rows": table}, indent=1))
    md.write_text(markdown(table) + "\n")
    return [js, md]
