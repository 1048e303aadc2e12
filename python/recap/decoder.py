"""`recap.Decoder`: greedy generation with tree-verified RECAP drafts.

One step: draft (Rust) -> pack (mask, positions) -> verify (one forward over the tree) ->
accept + update (Rust) -> compact the KV cache -> commit tokens. The output equals
`model.generate(do_sample=False)` token for token.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from typing import Any

import numpy as np
import torch

from recap import drafters
from recap import linear_layout as layouts
from recap._core import PersistentMemory
from recap.acceptance import NodePicks
from recap.adapters import ModelAdapter, adapter_for
from recap.adapters.conformance import probe
from recap.budget import ChainPasses, CostModel, cost_model, model_key
from recap.config import RecapConfig
from recap.memory_pool import MemoryPool, memory_fingerprint
from recap.model_state import peek, state_of
from recap.request import UNSET, Request, from_call
from recap.sampling import TokenChooser
from recap.stats import GenerationStats
from recap.step_buffers import StepBuffers

PREFILL_SEED_CHUNK = 256  # prompt positions per LM-head chunk when seeding (bounds memory)


class _ChainVerifier:
    """Runs verification passes over chains of n tokens exactly as decoding steps do (for
    measuring the cost curve)."""

    def __init__(self, decoder: Decoder) -> None:
        self.decoder = decoder
        self.cache_kw = decoder.adapter.cache_keyword
        self.new_cache = decoder.adapter.new_cache
        self.excluded = decoder.adapter.excluded

    def __call__(self, cache, past: int, tokens: torch.Tensor) -> np.ndarray:
        d = self.decoder
        n = tokens.shape[1]
        chain = torch.ones(n, n, dtype=torch.bool, device=tokens.device).tril()
        depths = torch.arange(n, device=tokens.device)
        mask = d.adapter.attention_mask(chain, depths, past, d.adapter.dtype)
        return d._forward_packed(cache, tokens, mask, d.adapter.tree_positions(past, depths))


class Decoder:
    """Wraps a transformers model and generates greedily with tree-verified drafts.

    ``drafter`` names the draft source (``"recap"``, its ablations or a peer; see
    `recap.drafters.DRAFTERS`). The drafter lives as long as the Decoder and opens one
    session per request, so what it keeps across requests (RECAP's U, Token Recycling's
    rows, the budget's calibration) carries over between calls; pass a
    `recap.PersistentMemory` as ``memory`` to share those rows between decoders, or a
    `recap.MemoryPool` to keep them per ``memory_scope`` (one scope per tenant: a request
    drafts from and writes to its scope's memory only; see `recap.memory_pool`). One Decoder
    serves any number of threads at once: each request has its own session, KV cache and
    buffers; only the prefill of a family that keeps per-request state on the model (M-RoPE
    offsets) is serialised.

    ``linear_layout`` (``"auto"``, ``"default"``, ``"transposed"``): on a CPU, ``"auto"``
    times one verification pass with the model's linear layers as they are and against a
    transposed copy of their weights (see `recap.linear_layout`), and keeps the faster;
    `linear_layout_used` says which. Other devices keep the model's own.
    """

    def __init__(self, model: torch.nn.Module, config: RecapConfig | None = None,
                 memory: PersistentMemory | MemoryPool | None = None, *, drafter: str = "recap",
                 linear_layout: str = "auto") -> None:
        self.model = model
        self.config = config if config is not None else RecapConfig()
        self.adapter: ModelAdapter = adapter_for(model)  # refuses what cannot be tree-verified, naming why
        vocab = self.adapter.vocab_size
        self.pool: MemoryPool | None = memory if isinstance(memory, MemoryPool) else None
        if self.pool is not None:
            memory = None  # requests without a scope use the decoder's own memory
        if memory is not None and not isinstance(memory, PersistentMemory):
            raise TypeError("memory: expected a recap.PersistentMemory or recap.MemoryPool, "
                            f"got {type(memory).__name__}")
        if memory is not None and (memory.vocab_size != vocab or memory.k != self.config.k):
            raise ValueError(
                f"memory: expected a PersistentMemory with vocab_size={vocab} and k={self.config.k}, "
                f"got vocab_size={memory.vocab_size} and k={memory.k}"
            )
        spec = drafters.spec(drafter)
        self.drafter_name = spec.name
        self._drafter = drafters.build(drafter, vocab, self.config, memory, self.adapter.excluded)
        self.memory: PersistentMemory | None = self._drafter.memory
        self._prepare_lock = threading.RLock()  # first use runs once, whichever thread comes first
        self._local = threading.local()  # each thread's last GenerationStats
        self._last_stats: GenerationStats | None = None
        self._cost: CostModel | None = None
        # Construction runs no forward pass: the first use does (see _prepare).
        if linear_layout not in layouts.LAYOUTS:
            raise ValueError(f"linear_layout: expected one of {', '.join(layouts.LAYOUTS)}; got {linear_layout!r}")
        self._linear_layout = linear_layout
        self._auto_budget = spec.adapts_budget and self.config.auto_budget
        self._layout = None
        self._prepared = False

    def _prepare(self) -> None:
        """First use (generate, calibrate, or reading `cost` / `linear_layout_used`): the
        conformance probe, the linear layout choice and, with budget="auto", the cost curve.
        Each is measured once per model and cached with it."""
        if self._prepared:
            return
        with self._prepare_lock:
            if self._prepared:
                return
            probe(self.adapter)  # tree passes equal one-token passes on this model, or a clear error
            self._layout = layouts.choose(self.model, self._probe(), model_key(self.model), self._linear_layout)
            if self._auto_budget:
                self._calibrate()
            self._prepared = True

    @property
    def last_stats(self) -> GenerationStats | None:
        """This thread's last request's statistics (another thread's when this one has run none)."""
        return getattr(self._local, "stats", None) or self._last_stats

    @property
    def linear_layout_used(self) -> str:
        self._prepare()
        return self._layout_name()

    def _layout_name(self) -> str:
        return "default" if self._layout is None else "transposed"

    @property
    def cost(self) -> CostModel | None:
        """The measured cost curve behind budget="auto" (taken on first use); the drafter
        corrects it online (`last_stats.cost` shows its state)."""
        self._prepare()
        return self._cost

    def _probe(self):
        """One verification pass of a typical tree size; its context is built on the first
        call, so a layout chosen without measuring costs nothing."""
        passes, tokens = None, None

        def probe() -> None:
            nonlocal passes, tokens
            if passes is None:
                passes = ChainPasses(self.model, _ChainVerifier(self))
                tokens = passes.draw(layouts.PROBE_TOKENS)
            passes.run(tokens)

        return probe

    def verifying(self):
        """The context this decoder's passes run in (its linear layout): other generation on
        the same model can share it, e.g. to compare like with like."""
        self._prepare()
        return self._layout if self._layout is not None else contextlib.nullcontext()

    # ---- hardware-aware budget ----------------------------------------------------------
    def calibrate(self, refresh: bool = False) -> CostModel:
        """Measures (or takes from the model's cache) the verification cost curve c(n) of this
        model, device, dtype, thread count and linear layout, and sizes trees with it from now on."""
        self._prepare()
        with self._prepare_lock:
            return self._calibrate(refresh)

    def _calibrate(self, refresh: bool = False) -> CostModel:
        verify = _ChainVerifier(self)
        with self._layout if self._layout is not None else contextlib.nullcontext():
            self._cost = cost_model(self.model, verify, self._drafter.max_nodes + 1,
                                    variant=(self._layout_name(),), refresh=refresh)
        self._drafter.set_cost_points(self._cost.points, self._cost.seconds)
        return self._cost

    def _forward_packed(self, cache, tokens, mask, positions) -> np.ndarray:
        """One verification pass: logits of every tree node, reduced on the device to the
        argmax and top-k, copied to the host in one transfer."""
        return self._topk_packed(self.adapter.forward(cache, tokens, mask, positions), self.config.k)

    # ---- the loop ---------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                 max_new_tokens: int | None = None, max_length: int | None = None,
                 eos_token_id: int | list[int] | None = UNSET, streamer: Any = None,
                 generation_config: Any = None, logits_processor: Any = None, stopping_criteria: Any = None,
                 seed: int | None = None, memory_scope: str | None = None, **kwargs: Any) -> torch.Tensor:
        """Returns prompt + new tokens shaped [1, L] like `model.generate`.

        Greedy unless ``do_sample=True``; every other `generate` setting (temperature, top_k,
        top_p, min_p, typical_p, repetition_penalty, no_repeat_ngram_size, bad_words_ids,
        min_new_tokens, stop_strings with ``tokenizer=``, ...) and a ``logits_processor`` or
        ``stopping_criteria`` list mean what they mean there. ``seed`` makes sampling
        reproducible: the same seed gives the same tokens whatever the drafter or budget.
        Like `generate`, an explicit ``eos_token_id=None`` disables stopping on EOS; leaving
        it out uses the generation config's. ``memory_scope`` names the pool scope whose
        memory this request drafts from and writes to (the decoder needs a `MemoryPool`).
        Other keywords are model inputs (pixel_values, image_grid_thw, ...); an unknown one
        raises."""
        request = from_call(self.model, input_ids, attention_mask, max_new_tokens=max_new_tokens,
                            max_length=max_length, eos_token_id=eos_token_id, streamer=streamer,
                            generation_config=generation_config, logits_processor=logits_processor,
                            stopping_criteria=stopping_criteria, seed=seed, kwargs=kwargs)
        return self.run(request, memory_scope=memory_scope)

    @torch.no_grad()
    def run(self, request: Request, *, memory_scope: str | None = None,
            pool: MemoryPool | None = None) -> torch.Tensor:
        """Decodes one validated request (`recap.request`), in `memory_scope` of `pool` (the
        decoder's own pool by default) when a scope is given."""
        pool = pool if pool is not None else self.pool
        if memory_scope is None:
            scoped = contextlib.nullcontext(None)
        elif pool is None:
            raise ValueError(f"memory_scope={memory_scope!r}: expected a decoder built with "
                             "memory=recap.MemoryPool(...) (or memory_pool= given to recap.generate); it has none")
        elif drafters.spec(self.drafter_name).cross_request:
            raise ValueError(f"memory_scope: the {self.drafter_name!r} drafter keeps cross-request state that "
                             "scopes do not cover; use one with a persistent memory (recap, tr, tr_bf, sam_tr)")
        else:
            scoped = pool.scope(memory_scope, self.adapter.vocab_size, self.config.k, owner=self)
        self._prepare()
        with scoped as scope:
            memory, calibration = (self.memory, None) if scope is None else scope
            if memory is None:  # a drafter without a persistent memory
                session = self._drafter.session()
            else:
                session = self._drafter.session(memory=memory, calibration=calibration)
            with session, self.verifying():
                return self._generate(request, session)

    # ---- snapshots ------------------------------------------------------------------------
    def save_memory(self, path) -> None:
        """Snapshot of this decoder's own persistent memory, tied to its model (atomic)."""
        if self.memory is None:
            raise ValueError(f"the {self.drafter_name!r} drafter keeps no persistent memory to save")
        self.memory.save(os.fspath(path), fingerprint=memory_fingerprint(self.model))

    def load_memory(self, path) -> None:
        """Replaces this decoder's own memory with a snapshot made with the same model and K
        (a mismatched, truncated or corrupted file raises ValueError and changes nothing)."""
        if self.memory is None:
            raise ValueError(f"the {self.drafter_name!r} drafter keeps no persistent memory to load")
        loaded = PersistentMemory.load(os.fspath(path), vocab_size=self.adapter.vocab_size, k=self.config.k,
                                       fingerprint=memory_fingerprint(self.model))
        self.memory = loaded  # requests that start from now on draw on it; running ones keep theirs

    def _generate(self, req: Request, drafter) -> torch.Tensor:
        input_ids, attention_mask, max_new, eos = req.input_ids, req.attention_mask, req.max_new, req.eos
        streamer, model_inputs, chooser = req.streamer, req.model_inputs, req.chooser
        stats = GenerationStats()
        self._local.stats = self._last_stats = stats
        t_start = time.perf_counter()
        model = self.model
        device = input_ids.device
        prompt = input_ids[0].tolist()

        adapter = self.adapter
        # Room for the prompt, every new token and one more tree (the cache grows past it if needed).
        cache_size = input_ids.shape[1] + min(max_new, 1 << 16) + drafter.max_nodes + 1
        cache = adapter.new_cache(cache_size)
        # A family that keeps per-request state on the model (M-RoPE offsets) prefills under the
        # model's lock, so a concurrent request cannot overwrite the state before it is read.
        shared = state_of(model).prefill_lock if adapter.keeps_request_state else contextlib.nullcontext()
        with shared:
            adapter.before_prefill()
            first, seed_ids, seed_probs = self._prefill(input_ids, attention_mask, cache, model_inputs, chooser)
            offset = adapter.position_offset()
        stats.prefill_s = time.perf_counter() - t_start
        router = getattr(peek(model), "router", None)  # routing stats are kept per thread
        if router is not None and router.last_stats is not None:
            stats.routing = router.last_stats.as_dict()
        if streamer is not None and not req.streamer_has_prompt:
            streamer.put(input_ids.cpu())
        out = [first]
        if streamer is not None:
            streamer.put(torch.tensor([first]))
        done = first in eos or len(out) >= max_new or self._stop(req, prompt, out)
        if not done:
            drafter.begin(np.asarray(prompt + [first], dtype=np.int64))
            drafter.seed(seed_ids, seed_probs)
        past = len(prompt)
        k = self.config.k
        bufs = StepBuffers(drafter.max_nodes, cache_size, adapter.dtype, device)
        # Processed or sampled: each node's own pick, on the device (greedy reads the argmax).
        picks = None if chooser.plain_greedy else NodePicks(chooser, prompt + [first], cache_size,
                                                            drafter.max_nodes, device)
        phase = stats.phase_s
        host_s = None  # the previous step's host time, reported with this step's pass
        while not done:
            t0 = time.perf_counter()
            n, deepest = bufs.draft(drafter, adapter.position_base(past, offset))
            t1 = time.perf_counter()
            tokens, depths, positions = bufs.upload(n)
            mask = adapter.per_layer_type(bufs.full_mask(n, past), depths, past, deepest)
            t2 = time.perf_counter()
            logits = adapter.forward(cache, tokens, mask, positions)
            ta = time.perf_counter()
            pred = None if picks is None else picks.pick(logits, bufs.tokens[:n], bufs.parents[:n],
                                                         bufs.depths[:n], deepest, len(out))
            tb = time.perf_counter()
            packed = self._topk_packed(logits, k, pred)
            t3 = time.perf_counter()
            timed = self._cost is not None  # the budget controller learns from every step's timings
            path, committed = drafter.observe_packed(packed, k, t3 - t2 if timed else None, host_s)
            t4 = time.perf_counter()
            adapter.compact_cache(cache, path, n)
            past += len(path)
            t5 = time.perf_counter()
            new = committed.tolist()
            for i, tok in enumerate(new):
                out.append(tok)
                if tok in eos or len(out) >= max_new or self._stop(req, prompt, out):
                    new = new[:i + 1]
                    done = True
                    break
            if picks is not None:
                picks.commit(new)
            if streamer is not None:
                streamer.put(torch.tensor(new))
            stats.steps += 1
            stats.accepted_lengths[len(path) - 1] += 1
            stats.tree_sizes.append(n)
            if self._cost is not None:
                selection = drafter.last_selection
                if selection is not None:
                    stats.offered_nodes += selection[0]
                    stats.predicted_accepted += selection[2]
            t6 = time.perf_counter()
            phase["draft"] += t1 - t0
            phase["pack"] += t2 - t1
            phase["forward"] += (ta - t2) + (t3 - tb)
            phase["pick"] += tb - ta  # on a CPU the processors and picks run on the host
            phase["update"] += t4 - t3
            phase["compact"] += t5 - t4
            phase["other"] += t6 - t5
            host_s = (t2 - t0) + (tb - ta) + (t6 - t3)
        if streamer is not None:
            streamer.end()
        if self._cost is not None:
            stats.cost = drafter.cost_state()
        stats.new_tokens = len(out)
        stats.total_s = time.perf_counter() - t_start
        result = torch.tensor([prompt + out], dtype=input_ids.dtype, device=device)
        return result

    @staticmethod
    def _stop(req: Request, prompt: list[int], out: list[int]) -> bool:
        """Stopping criteria beyond length and EOS (stop strings, max_time, a user's own), per
        committed token, exactly where generate would have stopped."""
        if req.stopping is None:
            return False
        ids = torch.tensor([prompt + out], device=req.input_ids.device)
        return bool(req.stopping(ids, None).any())

    def _prefill(self, input_ids, attention_mask, cache, model_inputs, chooser: TokenChooser):
        """Runs the prompt; returns the first token and the prompt's top-K rows for seeding.

        Final hidden states are captured at the decoder's last norm, and the LM head runs over
        them in chunks, so full-vocabulary logits are never held for the whole prompt."""
        captured: list[torch.Tensor] = []
        norm = self.adapter.final_norm
        me = threading.get_ident()  # the norm is shared: other threads' forwards pass this hook too

        def capture(_m, _i, o):
            if threading.get_ident() == me:
                captured.append(o)

        handle = norm.register_forward_hook(capture) if norm is not None else None
        try:
            out = self.model(input_ids=input_ids, attention_mask=attention_mask,
                             **{self.adapter.cache_keyword: cache}, use_cache=True, logits_to_keep=1, **model_inputs)
        finally:
            if handle is not None:
                handle.remove()
        first = chooser.choose(input_ids[0].tolist(), out.logits[0, -1], 0)
        k = self.config.k
        if not captured:
            empty = np.zeros((0, k))
            return first, empty.astype(np.int64), empty.astype(np.float32)
        hidden = captured[-1][0]
        head = self.adapter.lm_head
        ids_chunks, prob_chunks = [], []
        for s in range(0, hidden.shape[0], PREFILL_SEED_CHUNK):
            logits = head(hidden[s:s + PREFILL_SEED_CHUNK])
            p, i = torch.softmax(logits.float(), dim=-1).topk(k, dim=-1)
            ids_chunks.append(i)
            prob_chunks.append(p)
        ids = torch.cat(ids_chunks).cpu().numpy().astype(np.int64)
        probs = torch.cat(prob_chunks).cpu().numpy().astype(np.float32)
        return first, ids, probs

    @staticmethod
    def _topk_packed(logits: torch.Tensor, k: int, pred: torch.Tensor | None = None) -> np.ndarray:
        """Each node's pick (the argmax unless `pred` gives the processed or sampled picks),
        top-k ids and top-k probabilities per node, moved to the host in one transfer."""
        pred = logits.argmax(dim=-1) if pred is None else pred
        probs, ids = torch.softmax(logits.float(), dim=-1).topk(k, dim=-1)
        # Token ids < 2**24 are exact in float32; larger vocabularies go through float64.
        dt = torch.float32 if logits.shape[-1] < (1 << 24) else torch.float64
        packed = torch.cat([pred.unsqueeze(-1).to(dt), ids.to(dt), probs.to(dt)], dim=-1)
        return packed.cpu().numpy()
