"""recap.verify.linear_layout and recap.first_use.layout_choice: linear layers as the product of the same
weights that is fastest for a pass's rows (own, a transposed copy, swapped), chosen by
measurement."""

import copy

import numpy as np
import pytest
import recap
import torch
from recap import RecapConfig
from recap._core import skinny_matmul, transpose_into
from recap.first_use.budget import POINTS
from recap.first_use.layout_choice import PROBE_TOKENS, choose
from recap.verify.linear_layout import DEFAULT, SKINNY, SWAPPED, TRANSPOSED, LinearLayout, Plan, transposed
from tiny_models import llava_inputs, text_model

IDS = torch.tensor([[5, 9, 14, 21, 7, 33, 5, 9, 14, 21]])


def test_layout_computes_the_same_outputs_and_restores_the_modules():
    model = text_model("Llama")
    with torch.no_grad():
        want = model(input_ids=IDS).logits
        layout = LinearLayout(model)
        with layout:
            with layout:  # nested use keeps it active until the outer exit
                got = model(input_ids=IDS).logits
            assert all("forward" in m.__dict__ for m in layout.modules)
        assert all("forward" not in m.__dict__ for m in layout.modules)
        assert torch.equal(model(input_ids=IDS).logits, want)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    weights = sum(m.weight.numel() * m.weight.element_size() for m in layout.modules)
    assert layout.bytes == weights  # one transposed copy of every linear weight
    layout.release()
    assert layout.bytes == 0


@pytest.mark.parametrize("plan", [SWAPPED, Plan("copy", "swapped"), Plan("own", "copy")])
@pytest.mark.parametrize("rows", [1, 2, 7, 9, 12, 16, 25, 70])
def test_every_plan_computes_what_the_module_computes_at_every_row_count(plan, rows):
    """Rows past a multiple of 16 by more than 8 are padded inside the swapped product; past
    FEW_ROWS every plan runs the module's own forward."""
    model = text_model("Llama")
    ids = torch.randint(3, 60, (1, rows))
    with torch.no_grad():
        want = model(input_ids=ids).logits
        with LinearLayout(model).using(plan) as layout:
            assert layout.plan == plan
            got = model(input_ids=ids).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert (layout.bytes > 0) == plan.needs_copy  # a copy only where the plan runs it


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8, 16, 33, 64])
def test_the_skinny_product_computes_what_the_module_computes_in_float32(rows, monkeypatch):
    """The Rust kernel on every linear layer of a float32 model (the tiny models are float64,
    where the skinny product runs the own)."""
    import recap.verify.linear_layout as layouts

    calls = []
    monkeypatch.setattr(layouts, "skinny_matmul", lambda *a: calls.append(1) or skinny_matmul(*a))
    model = copy.deepcopy(text_model("Llama")).float()
    ids = torch.randint(3, 60, (1, rows))
    with torch.no_grad():
        want = model(input_ids=ids).logits
        with LinearLayout(model).using(SKINNY) as layout:
            got = model(input_ids=ids).logits
    assert layout.bytes == 0  # no copy
    assert len(calls) == len(layout.modules)  # every linear layer ran the kernel
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(("rows", "cols", "n"), [(1, 1, 1), (4, 8, 1), (7, 13, 3), (64, 576, 16), (130, 40, 5)])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_skinny_matmul_matches_torch_at_odd_shapes_and_thread_counts(rows, cols, n, threads):
    w, x = torch.randn(rows, cols), torch.randn(n, cols)
    y = torch.full((n, rows), float("nan"))
    skinny_matmul(w.numpy(), x.numpy(), y.numpy(), threads)
    torch.testing.assert_close(y, (x.double() @ w.double().T).float(), rtol=1e-4, atol=1e-4)


def test_skinny_matmul_names_what_it_expected():
    w, x, y = np.zeros((4, 8), np.float32), np.zeros((2, 8), np.float32), np.zeros((2, 4), np.float32)
    with pytest.raises(TypeError, match="w: expected a C-contiguous 2-D float32 numpy array"):
        skinny_matmul(w.astype(np.float64), x, y)
    with pytest.raises(ValueError, match=r"x: expected shape \[n, 8\]"):
        skinny_matmul(w, np.zeros((2, 7), np.float32), y)
    with pytest.raises(ValueError, match=r"y: expected shape \[2, 4\]"):
        skinny_matmul(w, x, np.zeros((4, 2), np.float32))
    with pytest.raises(ValueError, match="C-contiguous"):
        skinny_matmul(w, x, np.zeros((4, 2), np.float32).T)


def test_a_plan_names_the_product_for_each_row_class():
    assert SWAPPED.product(1) == "own" and SWAPPED.product(2) == SWAPPED.product(64) == "swapped"
    assert SWAPPED.product(65) == TRANSPOSED.product(65) == "own"  # a prompt runs as generate runs it
    assert TRANSPOSED.product(1) == TRANSPOSED.product(12) == "copy" and not SWAPPED.needs_copy
    names = {"default": DEFAULT, "transposed": TRANSPOSED, "swapped": SWAPPED,
             "transposed+swapped": Plan("copy", "swapped"), "transposed+default": Plan("copy", "own"),
             "skinny": SKINNY, "skinny+swapped": Plan("skinny", "swapped"), "default+skinny": Plan("own", "skinny")}
    for name, plan in names.items():
        assert plan.name == name and Plan.named(name) == plan
    with pytest.raises(ValueError, match="expected one of default, .*skinny; got 'fast'"):
        Plan.named("fast")
    with pytest.raises(ValueError, match="one in own, copy, skinny"):
        Plan("swapped", "own")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(1, 1), (3, 70), (97, 33), (64, 64)])
def test_transposed_copy_is_exact_in_every_dtype(dtype, shape):
    w = torch.randn(shape, dtype=torch.float64).to(dtype)
    wt = transposed(w)
    assert wt.shape == (shape[1], shape[0]) and wt.is_contiguous() and wt.dtype == dtype
    assert torch.equal(wt, w.T)
    assert torch.equal(transposed(w.T), w)  # a strided weight takes torch's copy


def test_transpose_into_names_what_it_expected():
    src = np.arange(6, dtype=np.uint32).reshape(2, 3)
    with pytest.raises(ValueError, match=r"dst: expected shape \[3, 2\] \(src transposed\), got \[2, 3\]"):
        transpose_into(src, np.zeros((2, 3), np.uint32))
    with pytest.raises(TypeError, match="dst: expected a writable 2-D array of the same dtype as src"):
        transpose_into(src, np.zeros((3, 2), np.uint16))
    with pytest.raises(TypeError, match="src: expected a 2-D numpy array of uint16, uint32 or uint64"):
        transpose_into(src.astype(np.float32), np.zeros((3, 2), np.float32))
    with pytest.raises(ValueError, match="C-contiguous"):
        transpose_into(src.T, np.zeros((2, 3), np.uint32))
    dst = np.zeros((3, 2), np.uint32)
    transpose_into(src, dst, threads=4)
    assert (dst == src.T).all()


def test_layout_follows_weights_changed_in_place():
    model = text_model("Qwen2")
    layout = LinearLayout(model)
    head = model.get_output_embeddings()
    with torch.no_grad():
        with layout:
            before = model(input_ids=IDS).logits
        saved = head.weight.clone()
        head.weight.mul_(2.0)
        try:
            with layout:
                got = model(input_ids=IDS).logits
            want = model(input_ids=IDS).logits
        finally:
            head.weight.copy_(saved)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert not torch.allclose(got, before)


def test_choose_measures_once_per_key_and_validates():
    model = text_model("Mistral")
    calls = []
    probe = lambda *sizes: calls.append(1)  # noqa: E731
    assert choose(model, probe, ("test", 1), "default") == DEFAULT
    assert choose(model, probe, ("test", 1), "transposed") == TRANSPOSED
    assert choose(model, probe, ("test", 1), "transposed+swapped") == Plan("copy", "swapped")
    assert calls == []  # named plans are not measured
    first = choose(model, probe, ("test", 2), "auto")
    # A warm-up, the model's own products, the copy's untimed first pass, the trial plan (a
    # probe that gives no sizes decides nothing, so no second round).
    assert len(calls) == 4
    assert choose(model, probe, ("test", 2), "auto") == first and len(calls) == 4
    with pytest.raises(ValueError, match="linear_layout: expected one of auto, default, .*; got 'fast'"):
        choose(model, probe, ("test", 3), "fast")


def _fake_timings(monkeypatch, layout, own: dict, trial: dict, timed: list):
    """The probe's passes take `own[n]` seconds in the model's own products and `trial[n]`
    in the trial plan's (the copy for one row, swapped for more)."""
    import recap.first_use.layout_choice as choice

    def fake_time(probe, sizes):
        timed.append((layout.plan.name, sizes))
        return {n: (trial if layout.active else own)[n] for n in sizes}

    monkeypatch.setattr(choice, "_time", fake_time)


@pytest.mark.parametrize(("trial_s", "rounds", "plan"), [
    (0.5, 1, "transposed+swapped"),  # a wide gain in both classes: one round decides
    (1.5, 2, "default"),  # a loss is timed twice
    (0.9, 2, "transposed+swapped"),  # a narrow gain too
    (1.0, 2, "default"),
])
def test_one_round_of_probe_passes_decides_only_a_wide_gain(monkeypatch, trial_s, rounds, plan):
    import recap.first_use.layout_choice as choice

    model = copy.deepcopy(text_model("Qwen2"))
    timed = []
    _fake_timings(monkeypatch, choice.layout_of(model), dict.fromkeys(PROBE_TOKENS, 1.0),
                  dict.fromkeys(PROBE_TOKENS, trial_s), timed)
    assert choose(model, lambda *a: None, ("rounds", trial_s), "auto").name == plan
    assert timed == [("default", PROBE_TOKENS), ("transposed+swapped", PROBE_TOKENS)] * rounds


def test_each_row_class_is_decided_and_retimed_on_its_own(monkeypatch):
    """The copy takes 0.9x at one row (narrow: retimed), the swapped product 0.5x and 1.2x at
    4 and 16 rows and their geometric mean at 2 (0.77x over the class: decided at once, each
    size counting alike)."""
    import recap.first_use.layout_choice as choice

    model = copy.deepcopy(text_model("Qwen2"))
    timed = []
    _fake_timings(monkeypatch, choice.layout_of(model), {1: 0.2, 2: 0.3, 4: 0.4, 16: 1.0},
                  {1: 0.18, 2: 0.3 * (0.5 * 1.2) ** 0.5, 4: 0.2, 16: 1.2},
                  timed)
    assert choose(model, lambda *a: None, ("classes", 1), "auto") == Plan("copy", "swapped")
    assert timed[2:] == [("default", (1,)), ("transposed+swapped", (1,))]  # the one-row class only
    timed.clear()
    _fake_timings(monkeypatch, choice.layout_of(model), {1: 0.2, 2: 0.3, 4: 0.4, 16: 1.0},
                  {1: 0.2, 2: 0.3 * (0.9 * 1.1) ** 0.5, 4: 0.36, 16: 1.1},
                  timed)
    assert choose(model, lambda *a: None, ("classes", 2), "auto") == DEFAULT  # 1.0x; 0.99x over 2, 4 and 16


def test_probe_times_come_from_the_probe_where_it_gives_them():
    """The probe's own figures (its passes, not the context it built first), else the clock."""
    import recap.first_use.layout_choice as choice

    assert choice._time(lambda sizes: {n: n / 4 for n in sizes}, (1, 2)) == {1: 0.25, 2: 0.5}
    assert set(choice._time(lambda sizes: None, (1,))) == {0}


def test_a_warm_model_skips_the_warm_up_and_the_copy_is_warmed_untimed(monkeypatch):
    import recap.first_use.layout_choice as choice

    model = copy.deepcopy(text_model("Llama"))
    layout = choice.layout_of(model)
    events = []

    def fake_time(probe, sizes):
        events.append(("timed", layout.plan.name))
        return {n: 0.5 if layout.active else 1.0 for n in sizes}  # a decisive gain: one round

    monkeypatch.setattr(choice, "_time", fake_time)
    chosen = choose(model, lambda *a: None, ("warm", 1), "auto", warm=True,
                    warm_copy=lambda: events.append(("warm copy", layout.plan.name)))
    assert events == [("timed", "default"), ("warm copy", "transposed+swapped"), ("timed", "transposed+swapped")]
    assert chosen == Plan("copy", "swapped")


@pytest.mark.parametrize("budget", [6, "auto"])
@pytest.mark.parametrize("layout", ["transposed", "swapped", "transposed+swapped"])
def test_decoder_with_a_named_layout_equals_generate(budget, layout):
    from recap.verify.linear_layout import layout_of

    model, inputs = llava_inputs([5, 9], [21, 7, 33, 5, 9, 21, 7, 33])
    want = model.generate(**inputs, do_sample=False, max_new_tokens=20, pad_token_id=0)
    dec = recap.Decoder(model, RecapConfig(budget=budget), linear_layout=layout)
    assert dec.linear_layout_used == layout
    assert dec.generate(**inputs, max_new_tokens=20).tolist() == want.tolist()
    assert all("forward" not in m.__dict__ for m in layout_of(model).modules)  # only active inside generate
    with pytest.raises(ValueError, match="linear_layout"):
        recap.Decoder(model, linear_layout="fast")


def test_auto_skips_a_copy_that_would_crowd_out_memory(monkeypatch):
    import recap.first_use.layout_choice as choice

    model = copy.deepcopy(text_model("Gemma"))
    layout = choice.layout_of(model)
    plans = []
    monkeypatch.setattr(choice, "available_memory", lambda: 1024)
    monkeypatch.setattr(choice, "_time", lambda probe, sizes: plans.append(layout.plan) or dict.fromkeys(sizes, 0.5))
    assert choose(model, lambda *a: None, ("test", 4), "auto") == DEFAULT  # nothing was faster
    assert plans == [DEFAULT, SWAPPED] * 2 and layout.bytes == 0  # only the swapped product was tried
    assert choose(model, lambda *a: None, ("test", 4), "transposed") == TRANSPOSED  # named: taken as given


def test_decoders_on_one_model_share_its_layout_and_survive_a_release():
    from recap.verify.linear_layout import layout_of

    model, inputs = llava_inputs([5, 9], [21, 7, 33, 5, 9, 21, 7, 33])
    want = model.generate(**inputs, do_sample=False, max_new_tokens=12, pad_token_id=0)
    first = recap.Decoder(model, RecapConfig(budget=6), linear_layout="transposed")
    second = recap.Decoder(model, RecapConfig(budget=4), linear_layout="transposed")
    assert first.linear_layout_used == second.linear_layout_used == "transposed"  # chosen on first use
    with second.verifying():  # another decoder's call ending must not switch it off here
        assert first.generate(**inputs, max_new_tokens=12).tolist() == want.tolist()
        assert all("forward" in m.__dict__ for m in layout_of(model).modules)
        layout_of(model).release()  # ignored while active
        assert layout_of(model).bytes > 0
    layout_of(model).release()  # what an "auto" decoder that rejected the layout does
    assert layout_of(model).bytes == 0
    assert second.generate(**inputs, max_new_tokens=12).tolist() == want.tolist()  # rebuilt on use


def test_another_layout_on_the_model_cannot_take_the_shared_layouts_copies():
    from recap.verify.linear_layout import layout_of

    model = text_model("Qwen2")
    with torch.no_grad():
        want = model(input_ids=IDS).logits
        shared = layout_of(model)
        with shared:  # builds its copies
            model(input_ids=IDS)
        other = LinearLayout(model)  # e.g. a user's own, or one from before a deepcopy
        with other:
            model(input_ids=IDS)
        other.release()
        assert other.bytes == 0 and shared.bytes > 0
        with shared:  # its weights are unchanged, so it reuses its copies: they must still be there
            got = model(input_ids=IDS).logits
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_a_deepcopy_made_while_active_is_plain_and_carries_no_copies():
    import copy

    from recap.verify.linear_layout import layout_of

    model = copy.deepcopy(text_model("Llama"))
    with torch.no_grad():
        want = model(input_ids=IDS).logits
        with layout_of(model):
            twin = copy.deepcopy(model)
        got = twin(input_ids=IDS).logits
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert not any("forward" in m.__dict__ for m in twin.modules())  # no trace left on the copy
    assert layout_of(twin).bytes == 0 and layout_of(twin).modules[0] is twin.model.layers[0].self_attn.q_proj


def test_modules_with_hooks_or_their_own_forward_are_never_patched():
    import copy

    from recap.verify.linear_layout import LinearLayout

    model = copy.deepcopy(text_model("Llama"))
    seen = []
    hooked = model.model.layers[0].self_attn.q_proj
    hooked.register_forward_hook(lambda m, i, o: seen.append(o.shape))
    own = model.model.layers[0].self_attn.k_proj
    own.forward = lambda x, _m=own: torch.nn.functional.linear(x, _m.weight, _m.bias)  # e.g. an offload wrapper
    layout = LinearLayout(model)
    assert hooked not in layout.modules and own not in layout.modules
    with torch.no_grad(), layout:
        model(input_ids=IDS)
        assert "forward" not in hooked.__dict__ and seen  # its hook ran, on its own forward
    assert "forward" in own.__dict__  # the user's forward is still there afterwards


def test_autograd_and_other_threads_run_the_modules_own_forward():
    import copy
    import threading

    from recap.verify.linear_layout import LinearLayout

    model = copy.deepcopy(text_model("Llama"))
    layout = LinearLayout(model)
    head = model.lm_head
    with layout:
        out = model(input_ids=IDS).logits.sum()
        out.backward()  # gradients flow: the transposed path is never used under autograd
        assert head.weight.grad is not None and head.weight.grad.abs().sum() > 0
        # Spy: zero the transposed copy, so the path each call takes shows in its output.
        layout._copies[head.forward.index] = torch.zeros_like(layout._copies[head.forward.index])
        x = torch.randn(2, head.in_features, dtype=head.weight.dtype)
        with torch.no_grad():
            assert head(x).abs().sum() == 0  # this thread activated the layout: transposed path
            other = {}

            def call():
                with torch.no_grad():  # grad mode is per thread: no autograd there either
                    other.update(y=head(x))

            t = threading.Thread(target=call)
            t.start()
            t.join()
            torch.testing.assert_close(other["y"], torch.nn.functional.linear(x, head.weight, head.bias))


def test_auto_defers_the_choice_past_a_models_first_request(monkeypatch):
    """A first request runs in the model's own layout (no weight copy, no layout timing); the
    model's next request, finding none running, makes the choice; outputs equal generate's."""
    import recap.first_use.layout_choice as layouts
    from recap.state.model_state import state_of
    from recap.verify.linear_layout import layout_of

    model, inputs = llava_inputs([5, 9], [21, 7, 33, 5, 9, 21, 7, 33])
    model = copy.deepcopy(model)  # nothing decided on it (the cached model has served other tests)
    want = model.generate(**inputs, do_sample=False, max_new_tokens=12, pad_token_id=0)
    timed = []
    real = layouts._measure
    monkeypatch.setattr(layouts, "_measure", lambda *a: timed.append(1) or real(*a))
    dec = recap.Decoder(model, RecapConfig(budget="auto"), linear_layout="auto")
    assert dec.generate(**inputs, max_new_tokens=12).tolist() == want.tolist()
    assert timed == [] and layout_of(model).bytes == 0 and dec._plan == DEFAULT
    state = state_of(model)
    # Small trees only until the layout probe's 16 tokens: the pending points and the
    # conformance probe's own passes.
    assert dec._cost.points == [1, 2, 4, 6] and state.probe_passes.keys() == {1, 6}
    assert (state.served, state.running) == (1, 0)
    state.running += 1  # another request in flight: its passes would disturb the timings
    assert dec.generate(**inputs, max_new_tokens=12).tolist() == want.tolist()
    assert timed == [] and state.served == 2
    state.running -= 1
    assert dec.generate(**inputs, max_new_tokens=12).tolist() == want.tolist()
    assert timed == [1] and len(state.layout_choice) == 1  # chosen once, for the model
    assert dec._cost.points == list(POINTS)
    chosen = next(iter(state.layout_choice.values()))
    assert dec.linear_layout_used == chosen.name
    assert (layout_of(model).bytes > 0) == chosen.needs_copy and not dec._layout_pending  # an unused copy is released
    other = recap.Decoder(model, RecapConfig(budget=4), linear_layout="auto")
    assert other.generate(**inputs, max_new_tokens=12).tolist() == want.tolist()
    assert timed == [1] and not other._layout_pending  # the model's decision: nothing left to defer


def test_reading_the_layout_makes_the_deferred_choice_at_once(monkeypatch):
    import recap.first_use.layout_choice as layouts

    model, inputs = llava_inputs([5, 9], [21, 7, 33, 5, 9, 21, 7, 33])
    model = copy.deepcopy(model)
    monkeypatch.setattr(layouts, "_measure", lambda *a: SWAPPED)  # swapped measured faster
    dec = recap.Decoder(model, RecapConfig(budget="auto"), linear_layout="auto")
    dec.generate(**inputs, max_new_tokens=4)
    assert dec._plan == DEFAULT
    assert dec.linear_layout_used == "swapped"  # decided now, not at the next request
    assert dec.cost is dec._cost and dec._cost.points  # the curve in the layout chosen
    want = model.generate(**inputs, do_sample=False, max_new_tokens=12, pad_token_id=0)
    assert dec.generate(**inputs, max_new_tokens=12).tolist() == want.tolist()


def test_auto_tries_the_skinny_product_on_float32_weights_and_keeps_it_where_fastest(monkeypatch):
    """Float32 weights: the skinny product is a third plan, timed beside the others; it wins
    here in both row classes. The float64 tiny models never try it (it would run the own)."""
    import recap.first_use.layout_choice as choice

    model = copy.deepcopy(text_model("Qwen2")).float()
    layout = choice.layout_of(model)
    share = {"default": 1.0, "transposed+swapped": 0.7, "skinny": 0.5}
    timed = []

    def fake_time(probe, sizes):
        timed.append(layout.plan.name)
        return dict.fromkeys(sizes, share[layout.plan.name])

    monkeypatch.setattr(choice, "_time", fake_time)
    assert choose(model, lambda *a: None, ("skinny", 1), "auto") == SKINNY
    assert timed == ["default", "transposed+swapped", "skinny"]  # one round: the gain is wide
    assert layout.bytes == 0  # the copy the other trial made is dropped
    share["skinny"] = 0.9  # now the swapped product and the copy win
    assert choose(model, lambda *a: None, ("skinny", 2), "auto") == Plan("copy", "swapped")
    float64 = copy.deepcopy(text_model("Qwen2"))
    timed.clear()
    layout = choice.layout_of(float64)
    choose(float64, lambda *a: None, ("skinny", 3), "auto")
    assert "skinny" not in timed
    monkeypatch.setattr(choice, "skinny_is_vectorised", lambda: False)  # a CPU without AVX2 and FMA
    timed.clear()
    model = copy.deepcopy(text_model("Qwen2")).float()
    layout = choice.layout_of(model)
    choose(model, lambda *a: None, ("skinny", 4), "auto")
    assert timed and "skinny" not in timed  # its portable loop is never timed


def test_the_skinny_product_follows_weights_changed_in_place_or_replaced():
    model = copy.deepcopy(text_model("Llama")).float()
    layout = LinearLayout(model)
    ids = torch.randint(3, 60, (1, 4))
    with torch.no_grad():
        for change in ("in place", "replaced"):
            m = layout.modules[0]
            if change == "in place":
                m.weight.mul_(1.5)
            else:
                m.weight = torch.nn.Parameter(m.weight.detach() * -2.0)
            want = model(input_ids=ids).logits
            with layout.using(SKINNY):
                got = model(input_ids=ids).logits
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_the_skinny_product_runs_on_torchs_openmp_team_where_torch_uses_openmp():
    """A second set of spinning threads beside torch's team made a whole pass 1.7-2.1x slower, so
    where torch's backend is OpenMP the kernel must have found its runtime."""
    import recap.verify.linear_layout as layouts

    if "parallel backend: OpenMP" not in torch.__config__.parallel_info():
        pytest.skip("torch runs another parallel backend here")
    assert layouts._on_torchs_threads()
