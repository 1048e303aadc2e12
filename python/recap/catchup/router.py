"""Visual-token routing on a loaded VLM, through forward hooks on its decoder layers.

Data flow of a routed prefill (decoder layers 0..L-1, routing layers r_0 < r_1 < ...):

    layers < r_0          dense: every token, every layer
    at r_s (pre-hook)     write the active rows into the full-length state buffer (deferred
                          rows keep their cached state), score all visual tokens with the last
                          text token's attention, select K_s, correct re-admitted states (LTC),
                          and hand the layer only the active rows, with their rotary tables,
                          mask rows/columns and position ids (original positions, gaps kept)
    layers in segment s   the same compacted inputs: deferred tokens stay out of compute and
                          out of these layers' KV cache
    after the last layer  scatter the active rows back: the output is full length again

Decoding calls (text tokens, cache non-empty) run through every layer; each routed layer
gets the columns of the attention mask that its shorter cache holds. Weights are never
touched; `disable` removes the hooks.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from typing import Any

import torch

from recap.adapters import adapter_for
from recap.adapters.registry import require_routing
from recap.catchup.config import CatchUpConfig
from recap.catchup.ltc import grid_distances, transition_correct
from recap.catchup.scoring import last_token_attention

_NEVER = 1 << 30  # active_since of a deferred token


@dataclass
class RoutingStats:
    """What one routed prefill did. `routed` is False for the dense path (text-only prompt,
    or mode "dense"); byte and FLOP figures then equal their dense counterparts."""

    mode: str
    routed: bool
    visual_tokens: int
    text_tokens: int
    routing_layers: list[int] = field(default_factory=list)
    stage_budgets: list[int] = field(default_factory=list)
    active_visual: list[int] = field(default_factory=list)  # per decoder layer
    readmitted: list[int] = field(default_factory=list)  # per routing layer
    selections: list[list[int]] = field(default_factory=list)  # visual-token indices per stage
    kv_bytes: int = 0
    kv_bytes_dense: int = 0
    snapshot_bytes: int = 0
    prefill_flops: float = 0.0
    prefill_flops_dense: float = 0.0

    @property
    def kv_ratio(self) -> float:
        return self.kv_bytes / self.kv_bytes_dense if self.kv_bytes_dense else 1.0

    @property
    def flops_ratio(self) -> float:
        return self.prefill_flops / self.prefill_flops_dense if self.prefill_flops_dense else 1.0

    @property
    def mean_active_visual(self) -> float:
        return sum(self.active_visual) / len(self.active_visual) if self.active_visual else 0.0

    def as_dict(self) -> dict:
        d = dict(self.__dict__)
        d.update(kv_ratio=self.kv_ratio, flops_ratio=self.flops_ratio, mean_active_visual=self.mean_active_visual)
        return d


class _Request:
    """Routing state of one prompt, from its prefill to the next prompt."""

    def __init__(self, length: int, vis: torch.Tensor, coords: torch.Tensor, ks: list[int], layers: int):
        self.length = length
        self.vis = vis
        self.coords = coords
        self.ks = ks
        self.last = length - 1
        self.stage = -1
        self.keep: torch.Tensor | None = None  # active positions of the current stage
        self.layer_keep: list[torch.Tensor | None] = [None] * layers
        self.full: torch.Tensor | None = None
        n = vis.numel()
        self.selected = torch.ones(n, dtype=torch.bool, device=vis.device)
        self.deferred_at = torch.full((n,), -1, dtype=torch.long, device=vis.device)
        self.active_since = torch.full((n,), -1, dtype=torch.long, device=vis.device)
        self.snaps: dict[int, torch.Tensor] = {}
        self.snapshot_bytes = 0
        self.readmitted: list[int] = []
        self.selections: list[list[int]] = []
        self.prefill = True
        self._memo: tuple | None = None


class Router:
    """Routes the visual tokens of every prompt a model runs (see `recap.catchup.enable`)."""

    def __init__(self, model: torch.nn.Module, config: CatchUpConfig):
        adapter = adapter_for(model)
        require_routing(adapter)
        self._local = threading.local()  # one request's routing state per thread
        self.model = model
        self.config = config
        self.adapter = adapter
        self.lm = adapter.language_model
        self.layers = list(self.lm.layers)
        self.num_layers = len(self.layers)
        self.parts = [adapter.attention_parts(layer) for layer in self.layers]  # the model's facts
        self.rotary = adapter.rotary_keyword
        self.routing = config.routing_layers(self.num_layers)
        self.stage_of = {layer: s for s, layer in enumerate(self.routing)}
        if adapter.image_token_id is None:
            raise TypeError(f"recap.catchup: {type(model).__name__} names no image token id in its config")
        self.image_token = int(adapter.image_token_id)
        self.frozen: list[list[int]] | None = None
        self.last_stats = None
        self._req = None
        self._handles = [model.register_forward_pre_hook(self._on_call, with_kwargs=True)]
        for i, layer in enumerate(self.layers):
            self._handles.append(layer.register_forward_pre_hook(self._hook(i), with_kwargs=True))
        self._handles.append(self.layers[-1].register_forward_hook(self._after_last))

    @property
    def _req(self) -> _Request | None:
        return getattr(self._local, "req", None)

    @_req.setter
    def _req(self, value: _Request | None) -> None:
        self._local.req = value

    @property
    def last_stats(self) -> RoutingStats | None:
        """What the calling thread's latest prefill did."""
        return getattr(self._local, "stats", None)

    @last_stats.setter
    def last_stats(self, value: RoutingStats | None) -> None:
        self._local.stats = value

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._req = None

    def freeze(self, selections: list[list[int]] | None) -> None:
        """Replay these per-stage selections (visual-token indices, as in
        `RoutingStats.selections`) at every following prefill instead of scoring; None scores again."""
        if selections is not None and len(selections) != len(self.routing):
            raise ValueError(f"freeze: expected one selection per routing layer {list(self.routing)}; "
                             f"got {len(selections)}")
        self.frozen = None if selections is None else [list(map(int, s)) for s in selections]

    # ---- one call of the model -----------------------------------------------------------
    def _on_call(self, _module, args, kwargs):
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        if cache is not None and cache.get_seq_length() > 0:
            return None  # decoding: keep the prompt's routing
        self._req = None
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None:
            self.last_stats = None  # embeddings only: visual tokens cannot be located; dense
            return None
        if ids.shape[0] != 1:
            raise ValueError(f"recap.catchup routes one sequence at a time; got a batch of {ids.shape[0]}")
        vis = (ids[0] == self.image_token).nonzero().squeeze(1)
        n, length = vis.numel(), ids.shape[1]
        if n == 0 or not self.routing or int(vis[-1]) == length - 1:
            # text-only prompt, mode "dense", or no text after the image to score with: dense path
            self.last_stats = self._stats(length, n, None)
            return None
        ks = self.config.stage_ks(n, self.num_layers, self.routing)
        coords = self.adapter.visual_grid(n, kwargs, vis).to(ids.device)
        self._req = _Request(length, vis, coords, ks, self.num_layers)
        return None

    def _norm(self, coords: torch.Tensor) -> float:
        h = float(coords[:, 1].max()) if coords.numel() else 0.0
        w = float(coords[:, 2].max()) if coords.numel() else 0.0
        d = self.config.distance
        value = math.hypot(h, w) if d == "diagonal" else max(h, w) if d == "side" else 1.0
        return max(value, 1.0)

    # ---- every decoder layer -------------------------------------------------------------
    def _hook(self, i: int):
        def before(_module, args, kwargs):
            r = self._req
            if r is None:
                return None
            if not r.prefill:
                return self._decode_inputs(r, i, args, kwargs)
            if i in self.stage_of:
                return self._route(r, i, self.stage_of[i], args, kwargs)
            if r.stage >= 0:
                return args, self._compact(r, kwargs)
            return None
        return before

    def _decode_inputs(self, r: _Request, i: int, args, kwargs):
        keep = r.layer_keep[i]
        mask = kwargs.get("attention_mask")
        if keep is None or not isinstance(mask, torch.Tensor) or mask.shape[-1] < r.length:
            return None
        cols = torch.cat([keep, torch.arange(r.length, mask.shape[-1], device=keep.device)])
        return args, {**kwargs, "attention_mask": mask.index_select(-1, cols.to(mask.device))}

    def _compact(self, r: _Request, kwargs: dict) -> dict:
        """The layer's keyword inputs restricted to the stage's active positions (memoised:
        every layer of a segment gets the same mask and rotary tables)."""
        mask, pe, pid = kwargs.get("attention_mask"), kwargs.get(self.rotary), kwargs.get("position_ids")
        key = (r.stage, id(mask), id(pe), id(pid))
        if r._memo is not None and r._memo[0] == key:
            return {**kwargs, **r._memo[1]}
        keep, length = r.keep, r.length
        assert keep is not None, "compacting before the first routing layer"
        out: dict[str, Any] = {}
        if isinstance(mask, torch.Tensor):
            k = keep.to(mask.device)
            if mask.shape[-1] == length:
                mask = mask.index_select(-1, k)
            if mask.shape[-2] == length:
                mask = mask.index_select(-2, k)
            out["attention_mask"] = mask
        if pe is not None:
            out[self.rotary] = tuple(t.index_select(-2, keep.to(t.device)) for t in pe)
        if isinstance(pid, torch.Tensor) and pid.shape[-1] == length:
            out["position_ids"] = pid.index_select(-1, keep.to(pid.device))
        r._memo = (key, out)
        return {**kwargs, **out}

    def _route(self, r: _Request, layer_idx: int, s: int, args, kwargs):
        h = args[0] if args else kwargs["hidden_states"]
        if r.full is None:
            r.full = h.clone()
        else:
            r.full[:, r.keep] = h
        states = r.full[0]
        cos, sin = kwargs[self.rotary]
        vis = r.vis
        k = r.ks[s]
        if self.frozen is not None:
            chosen = torch.as_tensor(self.frozen[s], dtype=torch.long, device=vis.device)
        else:
            with torch.no_grad():
                score = last_token_attention(self.parts[layer_idx], states, cos[0], sin[0], r.last)[vis]
            if self.config.monotonic:
                score = score.masked_fill(~r.selected, float("-inf"))
                k = min(k, int(r.selected.sum()))
            chosen = score.topk(k).indices.sort().values
        new = torch.zeros_like(r.selected)
        new[chosen] = True
        readmit = new & ~r.selected
        deferred = r.selected & ~new
        if self.config.gamma_used and bool(readmit.any()):
            with torch.no_grad():
                self._correct(r, states, readmit)
        r.deferred_at[deferred] = s
        r.active_since[deferred] = _NEVER
        r.active_since[readmit] = s
        r.selected = new
        if self.config.mode == "catchup":
            r.snaps[s] = states[vis].clone()
            r.snapshot_bytes += r.snaps[s].numel() * r.snaps[s].element_size()
        r.readmitted.append(int(readmit.sum()))
        r.selections.append(chosen.tolist())
        keep = torch.ones(r.length, dtype=torch.bool, device=vis.device)
        keep[vis[~new]] = False
        r.keep = keep.nonzero().squeeze(1)
        r.stage = s
        end = self.routing[s + 1] if s + 1 < len(self.routing) else self.num_layers
        for j in range(layer_idx, end):
            r.layer_keep[j] = r.keep
        h = r.full[:, r.keep]
        kwargs = self._compact(r, kwargs)
        if args:
            return (h, *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": h}

    def _correct(self, r: _Request, states: torch.Tensor, readmit: torch.Tensor) -> None:
        """LTC for every re-admitted token, grouped by the stage it was deferred at."""
        c = self.config
        norm = self._norm(r.coords)
        for sp in r.deferred_at[readmit].unique().tolist():
            tokens = (readmit & (r.deferred_at == sp)).nonzero().squeeze(1)
            anchors = (r.selected & (r.active_since <= sp)).nonzero().squeeze(1)
            if anchors.numel() == 0:
                continue  # no anchor spans the interval: keep the stale state
            then = r.snaps[sp][anchors]  # catchup snapshots every stage, so stage sp is there
            dist = grid_distances(r.coords, tokens, anchors, norm)
            rows = r.vis[tokens]
            states[rows] = transition_correct(states[rows], then, states[r.vis[anchors]], dist,
                                              m=c.m, lam=c.lam, gamma=c.gamma, tau=c.tau)

    def _after_last(self, _module, _args, output):
        r = self._req
        if r is None or not r.prefill:
            return None
        h = output[0] if isinstance(output, tuple) else output
        r.full[:, r.keep] = h
        full = r.full
        self.last_stats = self._stats(r.length, r.vis.numel(), r, dtype=full.dtype)
        r.prefill, r.full, r.snaps, r._memo = False, None, {}, None
        return (full, *output[1:]) if isinstance(output, tuple) else full

    # ---- statistics ------------------------------------------------------------------------
    def _stats(self, length: int, visual: int, r: _Request | None, dtype: torch.dtype | None = None) -> RoutingStats:
        text = length - visual
        if r is None:
            active = [visual] * self.num_layers
        else:
            active = [visual if keep is None else keep.numel() - text for keep in r.layer_keep]
        dtype = dtype or next(self.lm.parameters()).dtype
        elem = torch.empty(0, dtype=dtype).element_size()
        kv_bytes = kv_dense = 0
        flops = dense = 0.0
        for layer, parts, a in zip(self.layers, self.parts, active, strict=True):
            kv_row = 2 * parts.key_features * elem
            kv_bytes += (text + a) * kv_row
            kv_dense += length * kv_row
            flops += _layer_flops(layer, parts, text + a)
            dense += _layer_flops(layer, parts, length)
        if r is not None:  # scoring: one key projection over every token per routing layer
            for layer_idx in self.routing:
                parts = self.parts[layer_idx]
                flops += 2.0 * length * parts.hidden * parts.key_features
        return RoutingStats(
            mode=self.config.mode, routed=r is not None, visual_tokens=visual, text_tokens=text,
            routing_layers=list(self.routing) if r is not None else [],
            stage_budgets=list(r.ks) if r is not None else [], active_visual=active,
            readmitted=list(r.readmitted) if r is not None else [],
            selections=list(r.selections) if r is not None else [],
            kv_bytes=kv_bytes, kv_bytes_dense=kv_dense, snapshot_bytes=r.snapshot_bytes if r is not None else 0,
            prefill_flops=flops, prefill_flops_dense=dense)


def _layer_flops(layer: torch.nn.Module, parts, n: int) -> float:
    """Multiply-adds x 2 of one decoder layer over n causal tokens: its linear maps plus
    the score and value products of causal attention."""
    linear = sum(m.weight.numel() for m in layer.modules() if isinstance(m, torch.nn.Linear))
    width = parts.query_features
    return 2.0 * n * linear + 2.0 * 2.0 * width * n * (n + 1) / 2
