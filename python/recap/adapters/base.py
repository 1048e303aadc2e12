"""The generic adapter: the facts about a decoder-only transformers model that the tree pass
(`recap.verify.tree_pass`), the cost curve and the router need, read from the model itself (no
class names). Adapters import nothing of the decoding loop.

A family that needs something else (multimodal RoPE, visual-token routing) subclasses
`ModelAdapter` in one file under `recap/adapters/families/`.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

# Attention layer types whose cache is a plain key/value list (cropped and gathered per token).
ATTENTION_TYPES = ("full_attention", "sliding_attention")
PLACEHOLDER_ATTRS = ("image_token_id", "video_token_id", "image_token_index", "video_token_index")


def text_config(model: Any) -> Any:
    cfg = model.config
    return cfg.get_text_config(decoder=True) if hasattr(cfg, "get_text_config") else cfg


def layer_types(cfg) -> list[str]:
    """One entry per decoder layer, as transformers' own cache factory reads the config."""
    from transformers.cache_utils import get_layer_types_and_kwargs

    types, _ = get_layer_types_and_kwargs(cfg)
    return list(types)


@dataclass(frozen=True)
class AttentionParts:
    """What visual-token routing reads of one decoder layer's attention: its input norm, the
    query and key projections ([n, hidden] -> [n, heads * head_dim]), optional per-head
    query/key norms, the head size and score scaling, and the projection widths."""

    norm: Callable[[torch.Tensor], torch.Tensor]
    query: Callable[[torch.Tensor], torch.Tensor]
    key: Callable[[torch.Tensor], torch.Tensor]
    head_dim: int
    scaling: float
    query_features: int
    key_features: int
    hidden: int
    q_norm: Callable[[torch.Tensor], torch.Tensor] | None = None
    k_norm: Callable[[torch.Tensor], torch.Tensor] | None = None


class ModelAdapter:
    """One loaded model, seen through what tree verification needs."""

    model_types: tuple[str, ...] = ()  # config.model_type values a family file handles
    routing = False  # recap.catchup can route this family's visual tokens
    keeps_request_state = False  # the model stores per-request state on itself at the prefill
    #: The keyword under which a decoder layer receives its rotary (cos, sin) tables.
    rotary_keyword = "position_embeddings"

    @classmethod
    def refusal(cls, model_type: str) -> str | None:
        """Why this family's `model_type` cannot be tree-verified (None: it can). A family
        file refuses its model types by overriding this."""
        return None

    def __init__(self, model: Any) -> None:
        # A transformers model, read by duck typing (its submodules are not typed).
        self.model: Any = model
        self.text_config = text_config(model)
        self.lm_head: Any = model.get_output_embeddings()
        self.vocab_size = int(self.lm_head.weight.shape[0])
        self.excluded = self._placeholders()
        self.layer_types = layer_types(self.text_config)
        window = getattr(self.text_config, "sliding_window", None)
        self.sliding_window: int | None = (int(window) if window and "sliding_attention" in self.layer_types
                                           else None)
        self.mask_types = sorted({t for t in self.layer_types if t in ATTENTION_TYPES})
        self.language_model: Any = self._language_model()
        self.final_norm: torch.nn.Module | None = getattr(self.language_model, "norm", None)
        params = inspect.signature(model.forward).parameters
        self.cache_keyword = "cache" if "cache" in params else "past_key_values"

    # ---- model structure ------------------------------------------------------------------
    def _language_model(self) -> Any:
        inner = model.get_decoder() if hasattr(model := self.model, "get_decoder") else model.model
        return getattr(inner, "language_model", inner)

    @property
    def decoder_layers(self) -> list[torch.nn.Module]:
        return list(self.language_model.layers)

    def _placeholders(self) -> tuple[int, ...]:
        """Image/video placeholder ids: never drafted, never fed by cost calibration."""
        cfg, out = self.model.config, set()
        for attr in PLACEHOLDER_ATTRS:
            tid = getattr(cfg, attr, None)
            if isinstance(tid, int) and 0 <= tid < self.vocab_size:
                out.add(tid)
        return tuple(sorted(out))

    @property
    def image_token_id(self) -> int | None:
        for attr in ("image_token_id", "image_token_index"):
            tid = getattr(self.model.config, attr, None)
            if isinstance(tid, int):
                return tid
        return None

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    # ---- positions ---------------------------------------------------------------------------
    def before_prefill(self) -> None:
        """Clears per-request state the model keeps on itself (none for most families)."""

    def position_offset(self) -> int:
        """Read right after the prefill: what tree positions add to cache length + depth."""
        return 0

    def position_offsets(self, rows: int) -> list[int]:
        """Read right after a batched prefill: each row's offset (see `position_offset`)."""
        return [self.position_offset()] * rows

    def position_base(self, cache_len: int, offset: int = 0) -> int:
        """What a tree node's position id adds to its depth: the cache length plus the
        family's offset (the decoder writes base + depth on the host)."""
        return cache_len + offset

    # ---- visual-token routing ----------------------------------------------------------------
    def attention_parts(self, layer: Any) -> AttentionParts:
        """The attention parts of `layer` as Llama-shaped layers hold them (separate q/k
        projections under `self_attn`, an `input_layernorm`); a family with fused
        projections overrides this in its family file."""
        attn = layer.self_attn
        return AttentionParts(
            norm=layer.input_layernorm, query=attn.q_proj, key=attn.k_proj, head_dim=int(attn.head_dim),
            scaling=float(attn.scaling), query_features=int(attn.q_proj.out_features),
            key_features=int(attn.k_proj.out_features), hidden=int(attn.k_proj.in_features),
            q_norm=getattr(attn, "q_norm", None), k_norm=getattr(attn, "k_norm", None))

    def visual_grid(self, n: int, model_inputs: dict, visual_index: torch.Tensor | None = None) -> torch.Tensor:
        """(image, row, col) [n, 3] of every visual token on its patch grid: one square grid
        (LLaVA), else positions along the sequence (e.g. LLaVA-NeXT's tiles with row breaks).
        `model_inputs` are the keywords of the model call; `visual_index` the visual tokens'
        positions in the sequence."""
        side = math.isqrt(n)
        if side * side == n:
            r, c = torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij")
            return torch.stack([torch.zeros_like(r), r, c], -1).reshape(-1, 3)
        i = torch.arange(n)
        return torch.stack([torch.zeros_like(i), torch.zeros_like(i), i], -1)
