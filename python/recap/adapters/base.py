"""The generic adapter: everything the decoder, the cost curve and the router need to know
about a decoder-only transformers model, read from the model itself (no class names).

A family that needs something else (multimodal RoPE, visual-token routing) subclasses
`ModelAdapter` in one file under `recap/adapters/families/`.
"""

from __future__ import annotations

import inspect
import math

import numpy as np
import torch

from recap.kv_cache import DEFAULT_CAPACITY, SlabCache
from recap.step_buffers import masked_value

# Attention layer types whose cache is a plain key/value list (cropped and gathered per token).
ATTENTION_TYPES = ("full_attention", "sliding_attention")
PLACEHOLDER_ATTRS = ("image_token_id", "video_token_id", "image_token_index", "video_token_index")


def text_config(model: torch.nn.Module):
    cfg = model.config
    return cfg.get_text_config(decoder=True) if hasattr(cfg, "get_text_config") else cfg


def layer_types(cfg) -> list[str]:
    """One entry per decoder layer, as transformers' own cache factory reads the config."""
    from transformers.cache_utils import get_layer_types_and_kwargs

    types, _ = get_layer_types_and_kwargs(cfg)
    return list(types)


class ModelAdapter:
    """One loaded model, seen through what tree verification needs."""

    model_types: tuple[str, ...] = ()  # config.model_type values a family file handles
    routing = False  # recap.catchup can route this family's visual tokens
    keeps_request_state = False  # the model stores per-request state on itself at the prefill

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.text_config = text_config(model)
        self.lm_head = model.get_output_embeddings()
        self.vocab_size = int(self.lm_head.weight.shape[0])
        self.excluded = self._placeholders()
        self.layer_types = layer_types(self.text_config)
        window = getattr(self.text_config, "sliding_window", None)
        self.sliding_window: int | None = (int(window) if window and "sliding_attention" in self.layer_types
                                           else None)
        self.mask_types = sorted({t for t in self.layer_types if t in ATTENTION_TYPES})
        self.language_model = self._language_model()
        self.final_norm: torch.nn.Module | None = getattr(self.language_model, "norm", None)
        params = inspect.signature(model.forward).parameters
        self.cache_keyword = "cache" if "cache" in params else "past_key_values"

    # ---- model structure ------------------------------------------------------------------
    def _language_model(self) -> torch.nn.Module:
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

    # ---- cache -----------------------------------------------------------------------------
    def new_cache(self, capacity: int = DEFAULT_CAPACITY):
        """A `recap.kv_cache.SlabCache` sized for `capacity` entries per layer (it grows past
        them). Every attention layer keeps all its entries, sliding ones included: the window
        is applied by the mask, so rejected tree entries can be dropped without losing the
        entries a sliding cache would have evicted to make room for them. (Memory therefore
        grows with the sequence on sliding layers too.)"""
        return SlabCache(len(self.layer_types), capacity)

    def compact_cache(self, cache, path: np.ndarray, tree_len: int) -> None:
        """Keep the prefix, the root and the accepted nodes of the tree just verified. The tree
        is the last `tree_len` entries of every layer; layers may hold prefixes of different
        lengths (visual-token routing keeps fewer prompt tokens in deeper layers)."""
        if isinstance(cache, SlabCache):
            cache.keep(path, tree_len)
            return
        accepted = len(path)
        if np.array_equal(path, np.arange(accepted)):
            drop = tree_len - accepted
            if drop:
                cache.crop(-drop)
            return
        # Move the accepted entries (few) into place right after the root, then crop the rest.
        idx, made_for = None, None
        for layer in cache.layers:
            if getattr(layer, "keys", None) is None or layer.keys.numel() == 0:
                continue  # a layer without attention (MoE-only / MLP-only) keeps nothing
            base = layer.keys.shape[-2] - tree_len
            if made_for != (base, layer.keys.device):  # one index for every layer alike (the usual case)
                idx = torch.as_tensor(base + path[1:], device=layer.keys.device)
                made_for = (base, layer.keys.device)
            dst = slice(base + 1, base + accepted)
            layer.keys[..., dst, :] = layer.keys.index_select(-2, idx)
            layer.values[..., dst, :] = layer.values.index_select(-2, idx)
        cache.crop(-(tree_len - accepted))

    # ---- one verification pass -------------------------------------------------------------
    def before_prefill(self) -> None:
        """Clears per-request state the model keeps on itself (none for most families)."""

    def position_offset(self) -> int:
        """Read right after the prefill: what tree positions add to cache length + depth."""
        return 0

    def position_base(self, cache_len: int, offset: int = 0) -> int:
        """What a tree node's position id adds to its depth: the cache length plus the
        family's offset (the decoder writes base + depth on the host)."""
        return cache_len + offset

    def tree_positions(self, cache_len: int, depths: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """Position ids [1, T] of the tree nodes as a tensor (probe and calibration passes)."""
        return (depths + self.position_base(cache_len, offset)).unsqueeze(0)

    def attention_mask(self, tree_mask: torch.Tensor, depths: torch.Tensor, past: int, dtype: torch.dtype):
        """Additive 4D mask [1, 1, T, past + T]: every node sees the committed prefix and, within
        the tree, its ancestors and itself (`tree_mask`, T x T bool); per layer type as
        `per_layer_type` makes it."""
        n = tree_mask.shape[0]
        full = torch.zeros(1, 1, n, past + n, dtype=dtype, device=tree_mask.device)
        full[0, 0, :, past:].masked_fill_(~tree_mask, masked_value(dtype))
        return self.per_layer_type(full, depths, past, int(depths.max()))

    def per_layer_type(self, full: torch.Tensor, depths: torch.Tensor, past: int, max_depth: int):
        """The mask a tree pass takes, from its full-attention form `full`. Sliding-window
        layers see only the last `window` positions of the path a node would have been
        generated on, as one-token decoding would; models with both layer types get a mapping
        per type. `max_depth` is the deepest node's depth, from the host (no device sync)."""
        w = self.sliding_window
        masks = {"full_attention": full}
        if w is not None:
            masks["sliding_attention"] = full
            n = full.shape[-2]
            q = depths.to(full.device) + past  # the index each node would have had
            if past + max_depth - w >= 0:  # some node's window starts inside the sequence
                cols = torch.arange(past + n, device=full.device)
                key_index = torch.cat([cols[:past], q])
                outside = key_index.unsqueeze(0) <= (q - w).unsqueeze(1)
                masks["sliding_attention"] = full.masked_fill(outside[None, None], masked_value(full.dtype))
        if len(self.mask_types) == 1:
            return masks[self.mask_types[0]]
        return {t: masks[t] for t in self.mask_types}

    def forward(self, cache, tokens: torch.Tensor, mask, positions: torch.Tensor) -> torch.Tensor:
        """Logits [T, V] of one tree pass over `tokens` [1, T] after the cached prefix."""
        kw = {self.cache_keyword: cache, "use_cache": True}
        return self.model(input_ids=tokens, attention_mask=mask, position_ids=positions, **kw).logits[0]

    # ---- visual-token routing ----------------------------------------------------------------
    def visual_grid(self, n: int, model_inputs: dict) -> torch.Tensor:
        """(image, row, col) [n, 3] of every visual token on its patch grid: one square grid
        (LLaVA), else positions along the sequence (e.g. LLaVA-NeXT's tiles with row breaks)."""
        side = math.isqrt(n)
        if side * side == n:
            r, c = torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij")
            return torch.stack([torch.zeros_like(r), r, c], -1).reshape(-1, 3)
        i = torch.arange(n)
        return torch.stack([torch.zeros_like(i), torch.zeros_like(i), i], -1)

    def require_routing(self) -> None:
        if not self.routing:
            raise TypeError(f"recap.catchup does not route {type(self.model).__name__} "
                            f"(model_type {self.text_config.model_type!r}); routed families: "
                            f"{', '.join(routed_families())}")


def routed_families() -> list[str]:
    from recap.adapters.registry import known_families

    return sorted(t for f in known_families() if f.routing for t in f.model_types)
