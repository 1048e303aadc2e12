"""`recap.Decoder`: generation with tree-verified RECAP drafts.

One step: draft (Rust, into the tree pass's buffers) -> pack (mask, positions) -> verify (one
forward over the tree, `recap.verify.tree_pass`) -> pick (each node's token under sampling or
processors, on the device, `recap.decoding.acceptance`) -> accept + update (Rust) -> compact the KV
cache -> commit tokens. Greedy output equals `model.generate(do_sample=False)` token for
token; sampled output equals one-token sampling with the same seed.
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Any

import torch

from recap._core import BatchWidth, PersistentMemory
from recap.adapters import ModelAdapter, adapter_for
from recap.decoding import drafters
from recap.decoding.config import RecapConfig
from recap.decoding.loop import decode
from recap.decoding.request import UNSET, Request, from_call
from recap.decoding.stats import GenerationStats
from recap.first_use import layout_choice
from recap.first_use.budget import POINTS as _COST_POINTS
from recap.first_use.budget import ChainPasses, CostModel, cost_model, model_key
from recap.first_use.conformance import probe
from recap.state.memory_pool import MemoryPool, memory_fingerprint
from recap.state.model_state import state_of
from recap.verify import linear_layout as layouts
from recap.verify import seeding
from recap.verify.tree_pass import TreePass

# The cost curve's sizes while the linear layout's choice waits and the conformance probe's
# passes are not at hand: each pass is one more first-use cost (0.3 s at 12 tokens on the
# 0.5B-shaped model), and the layout probe measures 16 tokens anyway.
_PENDING_POINTS = (1, 2, 4)


class _PassFactory:
    """Makes this decoder's tree passes for calibration and the linear-layout probe (the pass
    decoding runs)."""

    def __init__(self, decoder: Decoder) -> None:
        self.adapter, self.k = decoder.adapter, decoder.config.k
        self.excluded = decoder.adapter.excluded

    def __call__(self, capacity: int, max_tokens: int) -> TreePass:
        return TreePass(self.adapter, max_tokens - 1, capacity, self.k)


class _FirstUsePasses:
    """The linear-layout probe's verification passes and then the cost curve's share one
    context of random tokens, built only if one of them measures."""

    def __init__(self, decoder: Decoder) -> None:
        self.decoder = decoder
        self.built: ChainPasses | None = None
        self.tokens: dict[int, torch.Tensor] = {}
        # Probe times by the product a pass ran (`recap.verify.linear_layout.PRODUCTS`) and its size.
        self.seen: dict[tuple[str, int], list[float]] = {}

    def _passes(self) -> ChainPasses:
        if self.built is None:
            # The probe's sizes are the curve's points: the longest is the last point.
            self.built = ChainPasses(self.decoder.model, _PassFactory(self.decoder), _COST_POINTS[-1])
        return self.built

    def layout_probe(self, sizes: tuple[int, ...] = layout_choice.PROBE_TOKENS) -> dict[int, float]:
        """One verification pass of each of `sizes` (`recap.first_use.layout_choice.PROBE_TOKENS`):
        seconds by size, without the context the first call builds."""
        passes = self._passes()
        plan = layouts.layout_of(self.decoder.model).plan
        took = {}
        for n in sizes:
            if n not in self.tokens:
                self.tokens[n] = passes.draw(n)
            took[n] = t = passes.run(self.tokens[n])
            self.seen.setdefault((plan.product(n), n), []).append(t)
        return took

    def warm_copy(self) -> None:
        """The transposed copy's first pass, untimed: the cheapest pass that reads every
        weight (one token), since the first read of a fresh copy is the slow one (0.14 s
        against 0.11 s later on the 0.5B-shaped model)."""
        passes = self._passes()
        passes.run(passes.draw(1))

    def known(self, plan: layouts.Plan) -> dict[int, float]:
        """What the probe measured with the products `plan` runs: points of the cost curve."""
        return {n: min(times) for (product, n), times in self.seen.items() if plan.product(n) == product}


class Decoder:
    """Wraps a transformers model and generates with tree-verified drafts: greedy by default,
    or sampled with any of generate's settings, with the same tokens one-token decoding gives.

    ``drafter`` names the draft source (``"recap"``, its ablations or a peer; see
    `recap.decoding.drafters.DRAFTERS`). The drafter lives as long as the Decoder and opens one
    session per request, so what it keeps across requests (RECAP's U, Token Recycling's
    rows, the budget's calibration) carries over between calls; pass a
    `recap.PersistentMemory` as ``memory`` to share those rows between decoders, or a
    `recap.MemoryPool` to keep them per ``memory_scope`` (one scope per tenant: a request
    drafts from and writes to its scope's memory only; see `recap.state.memory_pool`). One Decoder
    serves any number of threads at once: each request has its own session, KV cache and
    buffers; only the prefill of a family that keeps per-request state on the model (M-RoPE
    offsets) is serialised.

    ``linear_layout`` (``"auto"`` or a plan's name: ``"default"``, ``"transposed"``,
    ``"swapped"``, ``"transposed+swapped"``, ...): on a CPU, ``"auto"`` times verification
    passes with the model's linear layers as they are, as the swapped product (W @ x^T) and
    against a transposed copy of their weights (see `recap.verify.linear_layout`), and keeps the
    fastest for one row and for a tree's rows; `linear_layout_used` names the plan. Other
    devices keep the model's own. Where nothing is
    decided for the model yet (in this process or the measurement store), the first request
    runs in the model's own layout and the choice is made before the model's next one (or
    when `linear_layout_used`, `cost`, `verifying()` or `calibrate()` is first used).
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
        self._batch_cost: BatchWidth | None = None
        # Construction runs no forward pass: the first use does (see _prepare).
        if linear_layout not in layout_choice.LAYOUTS:
            raise ValueError(f"linear_layout: expected one of {', '.join(layout_choice.LAYOUTS)}; "
                             f"got {linear_layout!r}")
        self._linear_layout = linear_layout
        self._auto_budget = spec.adapts_budget and self.config.auto_budget
        # Only drafters with a persistent memory learn from the prompt's rows; the others'
        # prefill computes the head at the last position only, as generate's does.
        self._seeds = spec.uses_memory
        self._head_share: float | None = None  # what the first prefill seeds by (recap.verify.seeding)
        self._plan: layouts.Plan = layouts.DEFAULT  # the products its passes run (recap.verify.linear_layout)
        self._layout_pending = False  # linear_layout="auto" not chosen yet (see _prepare)
        self._prepared = False

    def _prepare(self, settle: bool = False) -> None:
        """First use (generate, calibrate, or reading `cost` / `linear_layout_used`): the
        conformance probe, the linear layout choice and, with budget="auto", the cost curve.
        Each is measured once per model and cached with it. With linear_layout="auto" on a
        CPU and no choice made yet for the model, a request defers the choice to a later
        request (`_admitted`): timing both layouts takes a copy of every linear weight and a
        few passes, seconds on a 0.5B model, which a user who calls once would pay for
        nothing. `settle`: make the choice now (what reports the layout or the curve)."""
        if self._prepared:
            if settle and self._layout_pending:
                self._settle_layout()
            return
        with self._prepare_lock:
            if self._prepared:
                return
            warm = probe(self.adapter)  # tree passes equal one-token passes on this model, or a clear error
            self._layout_pending = not settle and layout_choice.undecided(self.model, model_key(self.model),
                                                                    self._linear_layout)
            if not self._layout_pending:
                self._choose_layout(probe_warm=warm, curve_warm=warm)
            elif self._auto_budget:
                self._calibrate(**self._pending_curve(warm))
            if self._seeds:
                self._head_share = seeding.head_share(self.adapter)
            self._prepared = True

    def _pending_curve(self, probed: bool) -> dict:
        """How to take the cost curve while the layout choice waits: small trees only, at
        _PENDING_POINTS and the sizes the conformance probe has just timed (its passes join
        as samples); the layout probe adds 16 tokens later."""
        timed = dict(state_of(self.model).probe_passes) if probed else {}
        return dict(known=timed, points=tuple(sorted(set(_PENDING_POINTS) | set(timed))))

    def _choose_layout(self, probe_warm: bool, curve_warm: bool) -> None:
        """The linear layout (`recap.first_use.layout_choice.choose`) and, with budget="auto", the cost
        curve at 1, 4 and 16 tokens in it: the layout probe's passes with the products the
        plan runs are its points, and in the model's own layout so are the points it had (a
        deferred choice's), so no new pass. `*_warm`: the model has just run passes."""
        passes = _FirstUsePasses(self)
        self._plan = layout_choice.choose(self.model, passes.layout_probe, model_key(self.model),
                                          self._linear_layout, warm=probe_warm, warm_copy=passes.warm_copy)
        if self._auto_budget:
            known = passes.known(self._plan)
            if self._plan == layouts.DEFAULT and self._cost is not None:
                known = dict(zip(self._cost.points, self._cost.seconds, strict=True)) | known
            self._calibrate(passes=passes.built, known=known)
            self._batch_cost = None

    def _settle_layout(self) -> None:
        """The linear-layout choice a first use deferred (`_choose_layout`; the model is warm:
        a request ran)."""
        with state_of(self.model).layout_lock, self._prepare_lock:
            if self._layout_pending:
                self._choose_layout(probe_warm=True, curve_warm=False)
                self._layout_pending = False

    @contextlib.contextmanager
    def _admitted(self):
        """One request on the model, counted. Where the layout choice is pending, a request
        that is not the model's first and finds none running makes it first (beside another
        request's passes the timings would measure the contention); one arriving meanwhile
        waits for it."""
        state = state_of(self.model)
        if self._layout_pending:
            with state.layout_lock:
                if state.served and not state.running:
                    self._settle_layout()
                state.enter()
        else:
            state.enter()
        try:
            yield
        finally:
            state.leave()

    def seed_share(self) -> float | None:
        """The head share prefills seed by (`recap.verify.seeding`; corrected by every prefill that
        seeds), or None for a drafter that does not seed."""
        if self._head_share is None:
            return None
        return state_of(self.model).head_share or self._head_share

    @property
    def last_stats(self) -> GenerationStats | None:
        """This thread's last request's statistics (another thread's when this one has run none)."""
        return getattr(self._local, "stats", None) or self._last_stats

    @property
    def linear_layout_used(self) -> str:
        """The name of the plan this decoder's passes run ("default", "swapped",
        "transposed+swapped", ...: `recap.verify.linear_layout.Plan`; reading it makes a choice that
        `generate` would defer to a later request)."""
        self._prepare(settle=True)
        return self._layout_name()

    def _layout_name(self) -> str:
        return self._plan.name

    @property
    def cost(self) -> CostModel | None:
        """The measured cost curve behind budget="auto" (taken on first use, or replaced by
        what decoding measured when that showed it wrong: `recap.first_use.budget.settle`); the drafter
        corrects it online (`last_stats.cost` shows its state)."""
        self._prepare(settle=True)
        return self._cost

    def verifying(self):
        """The context this decoder's passes run in (its linear layout): other generation on
        the same model can share it, e.g. to compare like with like."""
        self._prepare(settle=True)
        return self._layout_context()

    def _layout_context(self):
        if self._plan == layouts.DEFAULT:
            return contextlib.nullcontext()
        return layouts.layout_of(self.model).using(self._plan)

    # ---- hardware-aware budget ----------------------------------------------------------
    def calibrate(self, refresh: bool = False) -> CostModel:
        """Measures (or takes from the model's cache) the verification cost curve c(n) of this
        model, device, dtype, thread count and linear layout; with budget="auto", trees are
        sized with it from now on (a fixed budget or a peer drafter keeps its own tree sizes)."""
        self._prepare(settle=True)
        with self._prepare_lock:
            return self._calibrate(refresh)

    def _calibrate(self, refresh: bool = False, passes: ChainPasses | None = None,
                   known: dict[int, float] | None = None,
                   points: tuple[int, ...] = _COST_POINTS) -> CostModel:
        new_pass = _PassFactory(self)
        with self._layout_context():  # not verifying(): this runs inside the first use
            self._cost = cost_model(self.model, new_pass, self._drafter.max_nodes + 1, variant=(self._layout_name(),),
                                    refresh=refresh, passes=passes, known=known, points=points)
        if self._auto_budget:  # a curve handed to the drafter would cut every tree it drafts
            self._drafter.set_cost_points(self._cost.points, self._cost.seconds)
        return self._cost

    # ---- the loop ---------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                 max_new_tokens: int | None = None, max_length: int | None = None,
                 eos_token_id: int | list[int] | None = UNSET, streamer: Any = None,
                 generation_config: Any = None, logits_processor: Any = None, stopping_criteria: Any = None,
                 seed: int | list[int] | None = None, memory_scope: str | list[str | None] | None = None,
                 **kwargs: Any) -> Any:
        """Returns prompt + new tokens shaped [B, L] like `model.generate` (with
        ``return_dict_in_generate=True``, a `recap.decoding.outputs.RecapGenerateOutput`: sequences,
        ``output_scores`` / ``output_logits`` as generate returns them, and `recap_stats`).

        Greedy unless ``do_sample=True``; every other `generate` setting (temperature, top_k,
        top_p, min_p, typical_p, repetition_penalty, no_repeat_ngram_size, bad_words_ids,
        min_new_tokens, stop_strings with ``tokenizer=``, ...) and a ``logits_processor`` or
        ``stopping_criteria`` list mean what they mean there. ``seed`` makes sampling
        reproducible: the same seed gives the same tokens whatever the drafter or budget.
        Like `generate`, an explicit ``eos_token_id=None`` disables stopping on EOS; leaving
        it out uses the generation config's. ``memory_scope`` names the pool scope whose
        memory this request drafts from and writes to (the decoder needs a `MemoryPool`).
        Other keywords are model inputs (pixel_values, image_grid_thw, ...); an unknown one
        raises.

        A batch is input_ids [B, L] with the left-padded ``attention_mask`` a tokenizer with
        ``padding_side="left"`` returns: every row is decoded with its own drafts in one
        verification pass per step and equals its own generate at batch 1; rows that end
        early are padded with the pad token, as batched generate does. ``seed`` is then one
        int per row, or one int s giving row i the seed s + i; ``memory_scope`` one scope for
        all rows or one per row."""
        request = self.request(input_ids, attention_mask, max_new_tokens=max_new_tokens, max_length=max_length,
                               eos_token_id=eos_token_id, streamer=streamer, generation_config=generation_config,
                               logits_processor=logits_processor, stopping_criteria=stopping_criteria, seed=seed,
                               **kwargs)
        return self.run(request, memory_scope=memory_scope)

    def request(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                max_new_tokens: int | None = None, max_length: int | None = None,
                eos_token_id: int | list[int] | None = UNSET, streamer: Any = None,
                generation_config: Any = None, logits_processor: Any = None, stopping_criteria: Any = None,
                seed: int | list[int] | None = None, **kwargs: Any) -> Request:
        """The validated request `generate` would decode (same arguments, no memory scope):
        what `run` and `recap.ContinuousBatch.join` take."""
        return from_call(self.model, input_ids, attention_mask, max_new_tokens=max_new_tokens,
                         max_length=max_length, eos_token_id=eos_token_id, streamer=streamer,
                         generation_config=generation_config, logits_processor=logits_processor,
                         stopping_criteria=stopping_criteria, seed=seed, kwargs=kwargs)

    @torch.no_grad()
    def run(self, request: Request, *, memory_scope: str | list[str | None] | None = None,
            pool: MemoryPool | None = None) -> Any:
        """Decodes one validated request (`recap.decoding.request`), in `memory_scope` of `pool` (the
        decoder's own pool by default) when a scope is given; a batch takes one scope for
        every row or a list with one per row (None: the decoder's own memory)."""
        pool = pool if pool is not None else self.pool
        scopes = list(memory_scope) if isinstance(memory_scope, (list, tuple)) else [memory_scope] * request.batch
        if len(scopes) != request.batch:
            raise ValueError(f"memory_scope: expected one scope per row ({request.batch}), got {len(scopes)}")
        self._prepare()
        with contextlib.ExitStack() as stack:
            stack.enter_context(self._admitted())
            sessions = [stack.enter_context(self._session(stack, scope, pool)) for scope in scopes]
            stack.enter_context(self._layout_context())
            return decode(self, request, sessions)

    def _session(self, stack: contextlib.ExitStack, memory_scope: str | None, pool: MemoryPool | None):
        """A session on this decoder's drafter, drafting from and writing to the scope's
        memory (held by `stack` for the request) or the decoder's own."""
        if memory_scope is None:
            scope = None
        elif pool is None:
            raise ValueError(f"memory_scope={memory_scope!r}: expected a decoder built with "
                             "memory=recap.MemoryPool(...) (or memory_pool= given to recap.generate); it has none")
        elif drafters.spec(self.drafter_name).cross_request:
            raise ValueError(f"memory_scope: the {self.drafter_name!r} drafter keeps cross-request state that "
                             "scopes do not cover; use one with a persistent memory (recap, tr, tr_bf, sam_tr)")
        else:
            scope = stack.enter_context(pool.scope(memory_scope, self.adapter.vocab_size, self.config.k, owner=self))
        if self.memory is None:  # a drafter without a persistent memory: a scope has nothing to hold
            return self._drafter.session()
        memory, calibration = (self.memory, None) if scope is None else scope
        return self._drafter.session(memory=memory, calibration=calibration)

    def _batch_budget(self) -> BatchWidth | None:
        """The width controller of batched steps with budget="auto" (None: fixed budgets): one
        tree width per step from every row's ranked gains, priced by the measured curve at
        rows x width tokens and corrected online (Rust, beside the single request's budget)."""
        if not self._auto_budget or self._cost is None:
            return None
        with self._prepare_lock:
            if self._batch_cost is None:
                cost = self._cost
                self._batch_cost = BatchWidth([float(p) for p in cost.points], list(cost.seconds),
                                              self._drafter.max_nodes + 1)
            return self._batch_cost

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

    @staticmethod
    def _stop(req: Request, prompt: list[int], out: list[int]) -> bool:
        """Stopping criteria beyond length and EOS (stop strings, max_time, a user's own), per
        committed token, exactly where generate would have stopped."""
        if req.stopping is None:
            return False
        ids = torch.tensor([prompt + out], device=req.input_ids.device)
        return bool(req.stopping(ids, None).any())
