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

    def position_offsets(self, rows: int) -> list[int]:
        deltas = getattr(self.model.model, "rope_deltas", None)
        if deltas is None:
            return [0] * rows
        flat = deltas.reshape(-1).tolist()
        return [int(d) for d in flat] if len(flat) == rows else [int(flat[0])] * rows


    def visual_grid(self, n: int, model_inputs: dict, visual_index: torch.Tensor | None = None) -> torch.Tensor:
        """Every image's (t, h, w) patch grid, merged spatial_merge_size x spatial_merge_size:
        from `image_grid_thw` when the call has it (a plain forward, `recap.Decoder`), else
        from the multimodal position ids (`model.generate` encodes images first and calls the
        model with position ids and encoder outputs only), whose height and width rows are
        each image's row and column offsets."""
        coords: torch.Tensor | None = self._grid_from_thw(model_inputs.get("image_grid_thw"))
        if coords is None or coords.shape[0] != n:
            coords = self._grid_from_positions(model_inputs.get("position_ids"), visual_index)
        return coords if coords is not None and coords.shape[0] == n else super().visual_grid(n, model_inputs)

    def _grid_from_thw(self, grid_thw) -> torch.Tensor:
        merge = int(getattr(self.model.config.vision_config, "spatial_merge_size", 1) or 1)
        parts, img = [], 0
        for t, h, w in ([] if grid_thw is None else grid_thw.tolist()):
            for _ in range(t):
                r, c = torch.meshgrid(torch.arange(h // merge), torch.arange(w // merge), indexing="ij")
                parts.append(torch.stack([torch.full_like(r, img), r, c], -1).reshape(-1, 3))
                img += 1
        return torch.cat(parts) if parts else torch.zeros(0, 3, dtype=torch.long)

    @staticmethod
    def _grid_from_positions(position_ids, visual_index) -> torch.Tensor | None:
        if not isinstance(position_ids, torch.Tensor) or visual_index is None or position_ids.dim() != 3 \
                or position_ids.shape[0] not in (3, 4) or position_ids.shape[1] != 1:
            return None
        thw = position_ids[-3:, 0].index_select(-1, visual_index.to(position_ids.device)).cpu()  # [3, n]
        idx = visual_index.cpu()
        # An image is a run of consecutive visual tokens.
        image = torch.cat([torch.zeros(1, dtype=torch.long), (idx[1:] != idx[:-1] + 1).long()]).cumsum(0)
        coords = torch.zeros(idx.numel(), 3, dtype=torch.long)
        coords[:, 0] = image
        for i in range(int(image[-1]) + 1 if idx.numel() else 0):
            run = image == i
            coords[run, 1] = thw[1, run] - thw[1, run].min()
            coords[run, 2] = thw[2, run] - thw[2, run].min()
        return coords


class Qwen2VL(QwenVL):
    """Qwen2-VL and Qwen2.5-VL: a Qwen2 language model, so visual-token routing applies."""

    model_types = ("qwen2_vl", "qwen2_5_vl")
    routing = True
