"""LLaVA and LLaVA-NeXT: visual-token routing (recap.catchup) knows their layout (CLIP
patches in a square grid, a Llama-family language model)."""

from __future__ import annotations

from recap.adapters.base import ModelAdapter


class Llava(ModelAdapter):
    model_types = ("llava", "llava_next")
    routing = True
