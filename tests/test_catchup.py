"""recap.catchup: visual-token routing on tiny random LLaVA, Qwen2-VL and Qwen2.5-VL models with real images.

The compact routed path is checked against slow references that run every token through
every layer with a 4D mask hiding deferred keys (deferred rows copied through), against
physical deletion, against eager attention for the scorer, and against a teacher-forced
prefill for decoding; LTC is checked by its defining properties.
"""

import copy
import math

import pytest
import recap
import recap.catchup as catchup
import torch
from recap import RecapConfig
from recap.adapters import adapter_for
from recap.catchup import CatchUpConfig, last_token_attention, transition_correct
from tiny_models import (
    IMAGE_TOKEN,
    gemma3_vl_inputs,
    llava_inputs,
    llava_next_inputs,
    qwen25_vl_inputs,
    qwen_vl_inputs,
    text_model,
)

LAYERS = 8
PREFIX, SUFFIX = [5, 9, 14], [21, 7, 33, 8, 51, 12]


def llava_case(prefix=PREFIX, suffix=SUFFIX):
    return llava_inputs(prefix, suffix, layers=LAYERS, image_size=112)  # 64 visual tokens, 8x8 grid


def qwen_case(prefix=PREFIX, suffix=SUFFIX):
    return qwen25_vl_inputs(prefix, suffix, layers=LAYERS, side=224)  # a 7x10 grid of merged patches


def qwen2_case(prefix=PREFIX, suffix=SUFFIX):
    return qwen_vl_inputs(prefix, suffix, layers=LAYERS, side=224, family="qwen2_vl")


CASES = {"llava": llava_case, "qwen2.5-vl": qwen_case, "qwen2-vl": qwen2_case}
arch = pytest.mark.parametrize("case", list(CASES), ids=list(CASES))


@pytest.fixture(autouse=True)
def _no_routing_left_behind():
    yield
    for build in CASES.values():
        catchup.disable(build()[0])


def logits(model, inputs):
    with torch.no_grad():
        return model(**inputs).logits[0]


def visual_positions(inputs):
    return (inputs["input_ids"][0] == IMAGE_TOKEN).nonzero().squeeze(1)


def grid(case, inputs):
    """(image, row, col) of each visual token, computed here independently of the router."""
    if "image_grid_thw" in inputs:  # Qwen2.5-VL: one row-major grid of 2x2-merged patches
        _, rows, cols = (inputs["image_grid_thw"][0] // torch.tensor([1, 2, 2])).tolist()
    else:  # LLaVA: a square grid
        rows = cols = math.isqrt(visual_positions(inputs).numel())
    r, c = torch.meshgrid(torch.arange(rows), torch.arange(cols), indexing="ij")
    return torch.stack([torch.zeros_like(r), r, c], -1).reshape(-1, 3)


def layer_inputs(model, inputs):
    """Hidden states and keyword inputs of decoder layer 0 on a dense run."""
    lm = model.model.language_model
    seen = {}

    def grab(_m, args, kwargs):
        seen.update(h=(args[0] if args else kwargs["hidden_states"]).clone(), kw=kwargs)

    handle = lm.layers[0].register_forward_pre_hook(grab, with_kwargs=True)
    try:
        logits(model, inputs)
    finally:
        handle.remove()
    return seen["h"], seen["kw"]


def masked_reference(model, inputs, cfg: CatchUpConfig, stats, case):
    """Every token through every layer; deferred keys hidden by the mask, deferred rows
    copied through, LTC applied at re-admission; the selections are replayed from `stats`
    and must also be what scoring these states picks (for non-monotonic modes)."""
    lm = model.model.language_model
    h, kw = layer_inputs(model, inputs)
    pe, pid = kw["position_embeddings"], kw.get("position_ids")
    n_tok = h.shape[1]
    vis = visual_positions(inputs)
    n = vis.numel()
    coords = grid(case, inputs)
    norm = math.hypot(float(coords[:, 1].max()), float(coords[:, 2].max()))
    stage_of = {layer: s for s, layer in enumerate(stats.routing_layers)}
    selected = torch.ones(n, dtype=torch.bool)
    deferred_at = torch.full((n,), -1)
    since = torch.full((n,), -1)
    snaps = {}
    active = torch.ones(n_tok, dtype=torch.bool)
    causal = torch.ones(n_tok, n_tok, dtype=torch.bool).tril()
    with torch.no_grad():
        for j, layer in enumerate(lm.layers):
            if j in stage_of:
                s = stage_of[j]
                if not cfg.monotonic:
                    parts = adapter_for(model).attention_parts(layer)
                    score = last_token_attention(parts, h[0], pe[0][0], pe[1][0], n_tok - 1)[vis]
                    assert sorted(score.topk(len(stats.selections[s])).indices.tolist()) == stats.selections[s]
                new = torch.zeros(n, dtype=torch.bool)
                new[stats.selections[s]] = True
                readmit = new & ~selected
                if cfg.gamma_used:
                    for p in readmit.nonzero().squeeze(1).tolist():
                        sp = int(deferred_at[p])
                        anchors = (selected & (since <= sp)).nonzero().squeeze(1)
                        dist = torch.cdist(coords[[p]].float()[:, 1:], coords[anchors].float()[:, 1:]) / norm
                        h[0, vis[p]] = transition_correct(h[0, vis[[p]]], snaps[sp][anchors], h[0, vis[anchors]],
                                                          dist, m=cfg.m, lam=cfg.lam, gamma=cfg.gamma, tau=cfg.tau)[0]
                deferred = selected & ~new
                deferred_at[deferred] = s
                since[deferred] = 1 << 30
                since[readmit] = s
                selected = new
                snaps[s] = h[0, vis].clone()
                active = torch.ones(n_tok, dtype=torch.bool)
                active[vis[~new]] = False
            visible = causal & active[None, :]
            mask = torch.zeros(1, 1, n_tok, n_tok, dtype=h.dtype).masked_fill(~visible, torch.finfo(h.dtype).min)
            out = layer(h, attention_mask=mask, position_embeddings=pe, position_ids=pid)
            out = out[0] if isinstance(out, tuple) else out
            h = torch.where(active[None, :, None], out, h)
        return model.lm_head(lm.norm(h))[0]


def deleted_reference(model, inputs, stats):
    """Monotonic routing as physical deletion: deferred tokens are removed from the sequence
    for good, the rest keep their original positions. Returns the last position's logits."""
    lm = model.model.language_model
    h, kw = layer_inputs(model, inputs)
    cos, sin = kw["position_embeddings"]
    vis = visual_positions(inputs)
    keep = torch.arange(h.shape[1])
    stage_of = {layer: s for s, layer in enumerate(stats.routing_layers)}
    with torch.no_grad():
        for j, layer in enumerate(lm.layers):
            if j in stage_of:
                gone = set(vis[[i for i in range(vis.numel()) if i not in stats.selections[stage_of[j]]]].tolist())
                rows = [i for i, pos in enumerate(keep.tolist()) if pos not in gone]
                h, cos, sin, keep = h[:, rows], cos[:, rows], sin[:, rows], keep[rows]
            n = h.shape[1]
            mask = torch.zeros(1, 1, n, n, dtype=h.dtype).masked_fill(
                ~torch.ones(n, n, dtype=torch.bool).tril(), torch.finfo(h.dtype).min)
            out = layer(h, attention_mask=mask, position_embeddings=(cos, sin))
            h = out[0] if isinstance(out, tuple) else out
        return model.lm_head(lm.norm(h))[0, -1]


# ---- equivalences ------------------------------------------------------------------------
@arch
@pytest.mark.parametrize("mode", ["catchup", "reroute", "pyramiddrop", "fastv"])
def test_budget_of_every_visual_token_is_bit_identical_to_dense(case, mode):
    model, inputs = CASES[case]()
    n = visual_positions(inputs).numel()
    dense = logits(model, inputs)
    want = model.generate(**inputs, do_sample=False, max_new_tokens=8, pad_token_id=0)
    router = catchup.enable(model, budget=n, mode=mode)
    assert torch.equal(logits(model, inputs), dense)
    stats = router.last_stats
    assert stats.routed and set(stats.stage_budgets) == {n} and stats.kv_ratio == 1.0
    assert torch.equal(model.generate(**inputs, do_sample=False, max_new_tokens=8, pad_token_id=0), want)


@arch
@pytest.mark.parametrize("mode", ["catchup", "reroute", "pyramiddrop", "fastv"])
def test_compact_path_equals_masked_reference(case, mode):
    model, inputs = CASES[case]()
    cfg = CatchUpConfig(mode=mode, budget=20)
    router = catchup.enable(model, cfg)
    got = logits(model, inputs)
    stats = router.last_stats
    catchup.disable(model)
    want = masked_reference(model, inputs, cfg, stats, case)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)
    if cfg.monotonic:
        torch.testing.assert_close(got[-1], deleted_reference(model, inputs, stats), rtol=1e-9, atol=1e-9)


@arch
def test_recoverable_routing_readmits_and_ltc_moves_readmitted_states(case):
    model, inputs = CASES[case]()
    router = catchup.enable(model, budget=16, mode="reroute")
    reroute = logits(model, inputs)
    assert sum(router.last_stats.readmitted) > 0  # relevance moved between stages
    catchup.enable(model, budget=16, mode="catchup", gamma=0.0)
    assert torch.equal(logits(model, inputs), reroute)  # gamma = 0 is plain recoverable routing
    router = catchup.enable(model, budget=16, mode="catchup")
    assert not torch.allclose(logits(model, inputs), reroute)
    assert router.last_stats.snapshot_bytes > 0


@arch
def test_decode_step_equals_teacher_forced_prefill_with_frozen_decisions(case):
    from transformers import DynamicCache

    model, inputs = CASES[case]()
    router = catchup.enable(model, budget=20)
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        first = model(**inputs, cache=cache, use_cache=True).logits[0, -1].argmax()
        step = model(input_ids=first.view(1, 1), cache=cache, use_cache=True).logits[0, -1]
    router.freeze(router.last_stats.selections)
    ids = torch.cat([inputs["input_ids"], first.view(1, 1)], dim=1)
    longer = dict(inputs, input_ids=ids, attention_mask=torch.ones_like(ids))
    if "mm_token_type_ids" in inputs:
        longer["mm_token_type_ids"] = (ids == IMAGE_TOKEN).long()
    torch.testing.assert_close(step, logits(model, longer)[-1], rtol=1e-9, atol=1e-9)


@arch
def test_each_layer_caches_text_plus_its_stage_budget(case):
    from transformers import DynamicCache

    model, inputs = CASES[case]()
    router = catchup.enable(model, budget=20, mode="pyramiddrop")
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(**inputs, cache=cache, use_cache=True)
    stats = router.last_stats
    n, text = stats.visual_tokens, stats.text_tokens
    assert stats.routing_layers == [1, 2, 4, 6]  # 2, 7, 15, 23 scaled to 8 layers
    assert stats.stage_budgets == sorted(stats.stage_budgets, reverse=True)  # a monotonic cascade
    for j, layer in enumerate(cache.layers):
        stage = sum(r <= j for r in stats.routing_layers) - 1
        want = n if stage < 0 else stats.stage_budgets[stage]
        assert layer.keys.shape[-2] == text + want == text + stats.active_visual[j]
    assert abs(stats.mean_active_visual - 20) <= 1  # the average budget is met
    assert stats.kv_bytes == sum(layer.keys.numel() * 2 * layer.keys.element_size() for layer in cache.layers)
    assert stats.kv_ratio < 0.5 and stats.flops_ratio < 0.6


@arch
def test_scorer_equals_eager_attention_last_row(case):
    model, inputs = CASES[case]()
    eager = copy.deepcopy(model)
    eager.set_attn_implementation("eager")
    lm = eager.model.language_model
    seen = {}
    handles = [layer.register_forward_pre_hook(
        lambda _m, args, kwargs, j=j: seen.__setitem__(j, (args[0].clone(), kwargs["position_embeddings"])),
        with_kwargs=True) for j, layer in enumerate(lm.layers)]
    with torch.no_grad():
        out = eager(**inputs, output_attentions=True)
    for h in handles:
        h.remove()
    last = inputs["input_ids"].shape[1] - 1
    for j in (1, 4, 7):
        states, (cos, sin) = seen[j]
        parts = adapter_for(eager).attention_parts(lm.layers[j])
        got = last_token_attention(parts, states[0], cos[0], sin[0], last)
        torch.testing.assert_close(got.to(torch.float64), out.attentions[j][0, :, -1, :].mean(0), rtol=1e-6, atol=1e-9)


def test_routing_reads_attention_only_through_the_adapter():
    """A family with fused projections is one `attention_parts` override: here the layer's
    q/k/v weights are moved into one fused linear map, the separate ones are deleted, and
    the scores read through the override are the dense model's."""
    from recap.adapters.base import AttentionParts

    model, inputs = CASES["llava"]()
    model = copy.deepcopy(model)  # the tiny models are shared between tests; this one is taken apart
    layer = model.model.language_model.layers[1]
    parts = adapter_for(model).attention_parts(layer)
    states = torch.randn(inputs["input_ids"].shape[1], parts.hidden, dtype=torch.float64)
    pos = torch.randn(states.shape[0], parts.head_dim, dtype=torch.float64)
    want = last_token_attention(parts, states, pos.cos(), pos.sin(), states.shape[0] - 1)
    attn = layer.self_attn
    q, k = attn.q_proj.out_features, attn.k_proj.out_features
    fused = torch.nn.Linear(parts.hidden, q + 2 * k, bias=False, dtype=torch.float64)
    with torch.no_grad():
        fused.weight.copy_(torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]))
    norm = layer.input_layernorm
    del attn.q_proj, attn.k_proj, attn.v_proj, layer.input_layernorm  # nothing Llama-shaped is left to read
    fused_parts = AttentionParts(norm=norm, query=lambda x: fused(x)[..., :q], key=lambda x: fused(x)[..., q:q + k],
                                 head_dim=parts.head_dim, scaling=parts.scaling, query_features=q,
                                 key_features=k, hidden=parts.hidden)
    got = last_token_attention(fused_parts, states, pos.cos(), pos.sin(), states.shape[0] - 1)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)


# ---- composition with RECAP -------------------------------------------------------------------
ROUTED_FAMILIES = {
    "qwen2-vl": lambda i: qwen_vl_inputs([5 + i], [7, 8, 9, 7, 8, 9][: 3 + i % 4], layers=8, side=224,
                                         family="qwen2_vl"),
    "qwen2.5-vl": lambda i: qwen25_vl_inputs([5 + i], [7, 8, 9, 7, 8, 9][: 3 + i % 4], layers=8, side=224),
    "llava": lambda i: llava_inputs([5 + i], [7, 8, 9, 7, 8, 9][: 3 + i % 4], layers=8, image_size=112),
    "llava-next": lambda i: llava_next_inputs([5 + i], [7, 8, 9, 7, 8, 9][: 3 + i % 4], layers=8),
}


@pytest.mark.parametrize("family", list(ROUTED_FAMILIES))
def test_decoder_equals_the_routed_models_own_generate(family):
    """On a routed model, recap.Decoder (one-token decoding and RECAP) gives what the routed
    model's own `generate` gives, prompt by prompt. (`generate` encodes the images before
    calling the model, so routing must find the patch grid without `image_grid_thw`.)"""
    for i in range(5):
        model, inputs = ROUTED_FAMILIES[family](i)
        with catchup.routed(model, budget=16):
            want = model.generate(**inputs, do_sample=False, max_new_tokens=24, eos_token_id=None, pad_token_id=0)
            for drafter in ("ar", "recap"):
                got = recap.Decoder(model, RecapConfig(budget=12), drafter=drafter).generate(
                    **inputs, max_new_tokens=24, eos_token_id=None)
                assert torch.equal(got, want), (family, i, drafter)


def test_qwen_patch_grid_from_positions_equals_the_grid_from_image_sizes():
    model, inputs = qwen_case()
    adapter = adapter_for(model)
    ids = inputs["input_ids"]
    vis = (ids[0] == adapter.image_token_id).nonzero().squeeze(1)
    pos, _ = model.model.get_rope_index(ids, inputs["mm_token_type_ids"], inputs["image_grid_thw"],
                                        attention_mask=inputs["attention_mask"])
    from_sizes = adapter.visual_grid(vis.numel(), {"image_grid_thw": inputs["image_grid_thw"]}, vis)
    from_positions = adapter.visual_grid(vis.numel(), {"position_ids": pos}, vis)
    assert torch.equal(from_sizes, from_positions)
    assert int(from_sizes[:, 1].max()) > 0 and int(from_sizes[:, 2].max()) > 0  # a real 2D grid, not a line


@arch
@pytest.mark.parametrize("budget", [4, "auto"])
@pytest.mark.parametrize("mode", ["catchup", "fastv"])
def test_recap_decoder_equals_generate_on_the_routed_model(case, budget, mode):
    model, inputs = CASES[case]()
    catchup.enable(model, budget=16, mode=mode)
    want = model.generate(**inputs, do_sample=False, max_new_tokens=24, pad_token_id=0)
    dec = recap.Decoder(model, RecapConfig(budget=budget))
    got = dec.generate(**inputs, max_new_tokens=24)
    assert got.tolist() == want.tolist()
    routing = dec.last_stats.as_dict()["routing"]
    assert routing["routed"] and routing["kv_ratio"] < 1  # the decoder reports the prefill's routing


def test_llava_next_tiles_route_and_stay_exact_at_full_budget():
    model, inputs = llava_next_inputs(PREFIX, SUFFIX, layers=LAYERS)
    dense = logits(model, inputs)
    n = visual_positions(inputs).numel()
    try:
        router = catchup.enable(model, budget=n)
        assert torch.equal(logits(model, inputs), dense)
        catchup.enable(model, budget=n // 3)
        want = model.generate(**inputs, do_sample=False, max_new_tokens=12, pad_token_id=0)
        got = recap.Decoder(model, RecapConfig(budget=6)).generate(**inputs, max_new_tokens=12)
        assert got.tolist() == want.tolist()
        assert catchup.router_of(model).last_stats.kv_ratio < 1
        assert router is not catchup.router_of(model)  # enabling again replaced the router
    finally:
        catchup.disable(model)


# ---- requests, fallbacks, bad input -----------------------------------------------------------
def test_state_resets_between_requests_and_text_only_prompts_run_dense():
    model, inputs = llava_case()
    router = catchup.enable(model, budget=16)
    first = logits(model, inputs)
    selections = router.last_stats.selections
    text = torch.tensor([[5, 9, 14, 21, 7, 33]])
    with torch.no_grad():
        routed_text = model(input_ids=text).logits
    assert not router.last_stats.routed and router.last_stats.visual_tokens == 0
    catchup.disable(model)
    with torch.no_grad():
        assert torch.equal(routed_text, model(input_ids=text).logits)
    router = catchup.enable(model, budget=16)
    assert torch.equal(logits(model, inputs), first) and router.last_stats.selections == selections


def test_dense_mode_reports_dense_figures():
    model, inputs = qwen_case()
    dense = logits(model, inputs)
    router = catchup.enable(model, mode="dense")
    assert torch.equal(logits(model, inputs), dense)
    stats = router.last_stats
    assert not stats.routed and stats.kv_ratio == 1.0 and stats.flops_ratio == 1.0
    assert stats.active_visual == [stats.visual_tokens] * LAYERS


@pytest.mark.parametrize("settings, error, fragment", [
    (dict(budget=65), ValueError, "64 visual tokens"),
    (dict(budget=2), ValueError, "cannot be met"),
    (dict(stage_budgets=(8, 8)), ValueError, "one K per routing layer"),
    (dict(stage_budgets=(8, 8, 8, 80)), ValueError, "at most the 64"),
])
def test_budgets_the_prompt_cannot_meet_are_named(settings, error, fragment):
    model, inputs = llava_case()
    with pytest.raises(error, match=fragment):
        catchup.enable(model, **settings)
        logits(model, inputs)


@pytest.mark.parametrize("settings, fragment", [
    (dict(layers=(2, 9)), "out of range"),
    (dict(layers=(4, 2)), "strictly increasing"),
    (dict(mode="sparse"), "mode"),
    (dict(budget=0), "budget"),
    (dict(tau=0), "tau"),
    (dict(distance="manhattan"), "distance"),
])
def test_bad_settings_are_rejected_at_enable(settings, fragment):
    model, _ = llava_case()
    with pytest.raises(ValueError, match=fragment):
        catchup.enable(model, **settings)
    assert catchup.router_of(model) is None


def test_unsupported_models_and_batches_are_refused():
    with pytest.raises(TypeError, match="does not route LlamaForCausalLM.*routed families: llava, llava_next, qwen2_5"):
        catchup.enable(text_model("Llama"), budget=8)
    gemma3, _ = gemma3_vl_inputs([5], [6])  # sliding-window layers and bidirectional image attention: not routed
    with pytest.raises(TypeError, match="does not route Gemma3ForConditionalGeneration"):
        catchup.enable(gemma3, budget=8)
    model, inputs = llava_case()
    catchup.enable(model, budget=16)
    batch = {k: torch.cat([v, v]) for k, v in inputs.items()}
    with pytest.raises(ValueError, match="batch of 2"):
        logits(model, batch)


def test_context_manager_removes_the_hooks():
    model, inputs = llava_case()
    dense = logits(model, inputs)
    with catchup.routed(model, budget=16) as router:
        assert not torch.equal(logits(model, inputs), dense)
        assert router.last_stats.routed
    assert catchup.router_of(model) is None
    assert torch.equal(logits(model, inputs), dense)


# ---- LTC ---------------------------------------------------------------------------------------
def _ltc_case(r=3, a=6, d=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    stale = torch.randn(r, d, generator=g, dtype=torch.float64)
    then = torch.randn(a, d, generator=g, dtype=torch.float64)
    now = torch.randn(a, d, generator=g, dtype=torch.float64)
    dist = torch.rand(r, a, generator=g, dtype=torch.float64)
    return stale, then, now, dist


def test_ltc_common_displacement_moves_by_gamma_times_it():
    stale, then, _, dist = _ltc_case()
    delta = torch.randn(5, dtype=torch.float64)
    got = transition_correct(stale, then, then + delta, dist, m=4, lam=0.15, gamma=0.8, tau=0.07)
    torch.testing.assert_close(got, stale + 0.8 * delta)


def test_ltc_gamma_zero_and_no_anchors_leave_states_unchanged():
    stale, then, now, dist = _ltc_case()
    assert torch.equal(transition_correct(stale, then, now, dist, m=8, lam=0.15, gamma=0.0, tau=0.07), stale)
    empty = then[:0]
    assert torch.equal(transition_correct(stale, empty, empty, dist[:, :0], m=8, lam=0.15, gamma=0.8, tau=0.07),
                       stale)


def test_ltc_tiny_tau_follows_the_best_anchor_and_huge_lambda_the_nearest_patch():
    stale, then, now, dist = _ltc_case()
    got = transition_correct(stale, then, now, dist, m=6, lam=0.15, gamma=1.0, tau=1e-9)
    cos = torch.nn.functional.normalize(stale, dim=-1) @ torch.nn.functional.normalize(then, dim=-1).T
    best = (cos - 0.15 * dist).argmax(-1)
    torch.testing.assert_close(got, stale + (now - then)[best])
    got = transition_correct(stale, then, now, dist, m=6, lam=1e6, gamma=1.0, tau=0.07)
    torch.testing.assert_close(got, stale + (now - then)[dist.argmin(-1)])


def test_ltc_weights_only_the_top_m_anchors():
    stale, then, now, dist = _ltc_case(r=1, a=6)
    cos = torch.nn.functional.normalize(stale, dim=-1) @ torch.nn.functional.normalize(then, dim=-1).T
    score = (cos - 0.15 * dist)[0]
    top = score.topk(2).indices
    w = torch.softmax(score[top] / 0.07, dim=0)
    want = stale[0] + 0.8 * (w[:, None] * (now - then)[top]).sum(0)
    got = transition_correct(stale, then, now, dist, m=2, lam=0.15, gamma=0.8, tau=0.07)[0]
    torch.testing.assert_close(got, want)


def test_average_budgets_map_to_stage_budgets():
    cfg = CatchUpConfig(budget=64)
    layers = cfg.routing_layers(32)
    assert layers == (2, 7, 15, 23)
    ks = cfg.stage_ks(576, 32, layers)
    assert ks == [round((64 * 32 - 2 * 576) / 30)] * 4  # the dense prefix counts at 576
    pyramid = CatchUpConfig(budget=64, mode="pyramiddrop").stage_ks(576, 32, layers)
    assert pyramid == sorted(pyramid, reverse=True) and pyramid[1] * 2 == pytest.approx(pyramid[0], abs=1)
    lengths = [5, 8, 8, 9]
    assert abs((2 * 576 + sum(k * n for k, n in zip(pyramid, lengths, strict=True))) / 32 - 64) < 1
    assert CatchUpConfig(budget=64, mode="fastv").routing_layers(32) == (2,)


# ---- the benchmark ---------------------------------------------------------------------------
CHAT = ("{% for m in messages %}{{ m['role'] }}: {% for c in m['content'] %}{% if c['type'] == 'image' %}<image> "
        "{% else %}{{ c['text'] }}{% endif %}{% endfor %} {% endfor %}assistant:")


def _local_llava(folder):
    """The tiny LLaVA saved as a model folder with a word-level tokenizer and a processor."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import CLIPImageProcessorPil, LlavaProcessor, PreTrainedTokenizerFast

    model, _ = llava_inputs([], [])
    vocab = {f"w{i}": i for i in range(model.config.text_config.vocab_size)}
    vocab["<image>"] = vocab.pop(f"w{IMAGE_TOKEN}")
    vocab["<unk>"] = vocab.pop("w3")
    inner = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    inner.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=inner, unk_token="<unk>", eos_token="w1", pad_token="w0",
                                  extra_special_tokens={"image_token": "<image>"})
    proc = LlavaProcessor(image_processor=CLIPImageProcessorPil(size={"shortest_edge": 56},
                                                                crop_size={"height": 56, "width": 56}),
                          tokenizer=tok, patch_size=14, vision_feature_select_strategy="default",
                          num_additional_image_tokens=1, image_token="<image>", chat_template=CHAT)
    model.save_pretrained(folder)
    proc.save_pretrained(folder)


def test_catchup_cli_on_a_local_model_reports_accuracy_and_agreement(tmp_path, capsys):
    import json

    from recap.tools.cli import main

    _local_llava(tmp_path / "model")
    out = tmp_path / "out"
    assert main(["catchup", "--model", str(tmp_path / "model"), "--budgets", "10", "14", "--modes", "catchup",
                 "fastv", "--reps", "1", "--limit", "3", "--max-new-tokens", "4", "--out", str(out), "--quiet"]) == 0
    rows = {r["case"]: r for r in json.loads((out / "catchup.json").read_text())["rows"]}
    assert set(rows) == {"dense", "catchup@10", "fastv@10", "catchup@14", "fastv@14"}
    assert rows["dense"]["agree_with_dense"] == 1.0 and rows["dense"]["kv_ratio"] == 1.0
    assert rows["catchup@10"]["kv_ratio"] < rows["catchup@14"]["kv_ratio"] < 1.0
    # Accuracy is a share of the 3 questions; a case that always answers as dense scores as dense.
    assert all(abs(r["accuracy"] * 3 - round(r["accuracy"] * 3)) < 1e-9 for r in rows.values())
    assert all(r["accuracy"] == rows["dense"]["accuracy"] for r in rows.values() if r["agree_with_dense"] == 1.0)
    assert "same answer as dense" in (out / "catchup.md").read_text()
    assert catchup.router_of(llava_inputs([], [])[0]) is None  # nothing left enabled


def test_catchup_cli_on_the_tiny_default_model(tmp_path):
    import json

    from recap.tools.cli import main

    assert main(["catchup", "--budgets", "64", "--modes", "reroute", "catchup", "--reps", "1", "--limit", "1",
                 "--out", str(tmp_path), "--quiet"]) == 0
    rows = {r["case"]: r for r in json.loads((tmp_path / "catchup.json").read_text())["rows"]}
    assert rows["dense"]["visual_tokens"] == 576
    for case in ("reroute@64", "catchup@64"):
        assert abs(rows[case]["mean_active_visual"] - 64) < 1 and rows[case]["kv_ratio"] < 0.2
    assert rows["catchup@64"]["snapshot_kib"] > 0 == rows["reroute@64"]["snapshot_kib"]
