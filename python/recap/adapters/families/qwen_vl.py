"""Qwen2-VL, Qwen2.5-VL and Qwen3-VL: multimodal RoPE. The model computes a per-request
position offset (`rope_deltas`) at the prefill of an image prompt and keeps it on itself;
tree positions are text positions shifted by it."""

from __future__ import annotations

import torch

from recap.adapters.base import ModelAdapter


class QwenVL(ModelAdapter):
    model_types = ("qwen3_vl", "qwen3_vl_moe")
    keeps_request_state = True

    def before_prefill(self) -> None:
        # A text-only prompt leaves rope_deltas as the previous image prompt set it.
        self.model.model.rope_deltas = None

    def position_offset(self) -> int:
        deltas = getattr(self.model.model, "rope_deltas", None)
        return 0 if deltas is None else int(deltas.reshape(-1)[0])


    def visual_grid(self, n: int, model_inputs: dict) -> torch.Tensor:
        """Every image's (t, h, w) patch grid, merged spatial_merge_size x spatial_merge_size."""
        grid_thw = model_inputs.get("image_grid_thw")
        merge = int(getattr(self.model.config.vision_config, "spatial_merge_size", 1) or 1)
        parts, img = [], 0
        for t, h, w in ([] if grid_thw is None else grid_thw.tolist()):
            for _ in range(t):
                r, c = torch.meshgrid(torch.arange(h // merge), torch.arange(w // merge), indexing="ij")
                parts.append(torch.stack([torch.full_like(r, img), r, c], -1).reshape(-1, 3))
                img += 1
        coords = torch.cat(parts) if parts else torch.zeros(0, 3, dtype=torch.long)
        return coords if coords.shape[0] == n else super().visual_grid(n, model_inputs)


class Qwen2VL(QwenVL):
    """Qwen2-VL and Qwen2.5-VL: a Qwen2 language model, so visual-token routing applies."""

    model_types = ("qwen2_vl", "qwen2_5_vl")
    routing = True
