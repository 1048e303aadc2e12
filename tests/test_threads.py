"""Concurrent requests, as the README documents them: one decoder or one model serving many threads,
sharing a memory. Every output equals `generate`, and every request is seeded from its own
prompt (checked on what the drafter received, not only on the output)."""

import threading

import numpy as np
import pytest
import recap
import recap.catchup as catchup
import torch
from recap import RecapConfig
from session_spy import DrafterSpy
from tiny_models import llava_inputs, qwen_vl_inputs, text_family

THREADS = 4


def run_threads(model, requests, memory=None):
    """requests: per thread, a list of generate inputs; returns per thread (outputs, seed rows)."""
    barrier = threading.Barrier(len(requests))

    def work(i):
        dec = recap.Decoder(model, RecapConfig(budget=12), memory=memory)
        spy = DrafterSpy.install(dec)
        barrier.wait()
        outs = [dec.generate(**inputs, max_new_tokens=24, eos_token_id=None).tolist() for inputs in requests[i]]
        return outs, spy.seeded

    return on_threads(len(requests), work)


def reference_seed_rows(model, inputs):
    dec = recap.Decoder(model, RecapConfig(budget=12))
    spy = DrafterSpy.install(dec)
    dec.generate(**inputs, max_new_tokens=24, eos_token_id=None)
    return spy.seeded[0]


def test_decoders_on_threads_sharing_a_memory_stay_exact_and_seed_from_their_own_prompt():
    model = text_family("Llama")
    memory = recap.Decoder(model).memory
    rng = np.random.default_rng(0)
    requests = []
    for i in range(THREADS):  # prompts of different lengths, so a stolen seed would also change the shape
        reqs = []
        for j in range(3):
            base = rng.integers(3, 100, size=3 + i).tolist()
            ids = torch.tensor([(base * 8)[: 6 + 5 * i + j]])
            reqs.append(dict(input_ids=ids, attention_mask=torch.ones_like(ids)))
        requests.append(reqs)
    results = run_threads(model, requests, memory)
    for reqs, (outs, seeded) in zip(requests, results, strict=True):
        assert len(seeded) == len(reqs)
        for inputs, out, rows in zip(reqs, outs, seeded, strict=True):
            want = model.generate(**inputs, do_sample=False, max_new_tokens=24, eos_token_id=None, pad_token_id=0)
            assert out == want.tolist()
            assert np.array_equal(rows, reference_seed_rows(model, inputs))


@pytest.mark.parametrize("build", ["llava", "qwen2.5-vl"])
def test_routed_models_serve_threads_with_per_request_routing(build):
    if build == "llava":  # 8 layers, 64 visual tokens, as in test_catchup
        make = lambda i: llava_inputs([5 + i], [7, 8, 9, 7, 8, 9][: 3 + i], layers=8, image_size=112)  # noqa: E731
    else:
        make = lambda i: qwen_vl_inputs([5 + i], [7, 8, 9, 7, 8, 9][: 3 + i], layers=8, side=224)  # noqa: E731
    model = make(0)[0]
    requests = [[make(i)[1]] for i in range(THREADS)]
    with catchup.routed(model, budget=16):
        # Each request alone, one after another, equals the routed model's generate; then all
        # at once on threads: the same tokens.
        alone = [recap.Decoder(model, RecapConfig(budget=12)).generate(**r[0], max_new_tokens=24,
                                                                       eos_token_id=None).tolist() for r in requests]
        assert alone == [model.generate(**r[0], do_sample=False, max_new_tokens=24, eos_token_id=None,
                                        pad_token_id=0).tolist() for r in requests]
        results = run_threads(model, requests)
    for want, (outs, _) in zip(alone, results, strict=True):
        assert outs[0] == want


class MeetInForward:
    """A forward pre-hook that makes the first forward of each of `n` threads wait for the
    others: if requests were serialised (one lock per decoder or per model), the first
    thread's request could never reach the others' first forward and the barrier breaks."""

    def __init__(self, model, n):
        self.barrier, self.seen = threading.Barrier(n, timeout=60), set()
        self.handle = model.register_forward_pre_hook(self)

    def __call__(self, _module, _args):
        me = threading.get_ident()
        if me not in self.seen:
            self.seen.add(me)
            self.barrier.wait()


def on_threads(n, work):
    results, errors = [None] * n, []

    def run(i):
        try:
            results[i] = work(i)
        except BaseException as e:  # noqa: BLE001 - reported below with the thread
            errors.append((i, repr(e)))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return results


def prompts(n):
    rng = np.random.default_rng(1)
    return [torch.tensor([(rng.integers(3, 100, size=3 + i).tolist() * 6)[: 9 + 4 * i]]) for i in range(n)]


def test_one_decoder_serves_two_threads_at_once_and_each_output_equals_generate():
    model = text_family("Llama")
    dec = recap.Decoder(model, RecapConfig(budget=12))
    dec.generate(prompts(1)[0], max_new_tokens=4)  # first use out of the way
    _ = dec.linear_layout_used  # make the layout choice generate may defer now: no thread waits for it
    ids = prompts(2)
    meet = MeetInForward(model, 2)
    try:
        outs = on_threads(2, lambda i: (dec.generate(ids[i], max_new_tokens=24, eos_token_id=None),
                                        dec.last_stats.new_tokens))
    finally:
        meet.handle.remove()
    for x, (out, new) in zip(ids, outs, strict=True):
        want = model.generate(x, do_sample=False, max_new_tokens=24, eos_token_id=None, pad_token_id=0)
        assert torch.equal(out, want)
        assert new == 24  # each thread sees its own request's statistics


def test_threads_calling_model_generate_with_recap_run_concurrently_and_exactly():
    model = text_family("Qwen2")
    ids = prompts(THREADS)
    config = RecapConfig(budget=8)
    kw = dict(do_sample=False, max_new_tokens=20, eos_token_id=None, pad_token_id=0)
    model.generate(ids[0], custom_generate=recap.generate, recap_config=config, drafter="recap", **kw)
    decoders = dict(recap.decoding.generation.state_of(model).decoders)
    # The layout choice the first call deferred would run first in whichever thread comes
    # first, the others waiting for it (tests/test_linear_layout.py): made here instead.
    for dec in decoders.values():
        _ = dec.linear_layout_used
    meet = MeetInForward(model, THREADS)
    try:
        outs = on_threads(THREADS, lambda i: model.generate(ids[i], custom_generate=recap.generate,
                                                            recap_config=config, drafter="recap", **kw))
    finally:
        meet.handle.remove()
    for x, out in zip(ids, outs, strict=True):
        assert torch.equal(out, model.generate(x, **kw))
    # One decoder per (drafter, configuration), made by the first call and shared by the threads.
    assert recap.decoding.generation.state_of(model).decoders == decoders and ("recap", config) in decoders


def test_recap_generate_takes_a_configuration_and_a_drafter_name():
    model = text_family("Llama")
    x = prompts(3)[2]
    kw = dict(do_sample=False, max_new_tokens=16, eos_token_id=None, pad_token_id=0)
    want = model.generate(x, **kw)
    for drafter, config in [("pld", None), ("recap", RecapConfig(budget=3)), ("suffix", None)]:
        out = model.generate(x, custom_generate=recap.generate, drafter=drafter, recap_config=config, **kw)
        assert torch.equal(out, want)
    dec = recap.decoding.generation.decoder_for(model, RecapConfig(budget=3), "recap")
    assert dec.config.budget == 3 and dec.drafter_name == "recap"
    assert recap.decoding.generation.decoder_for(model, None, "pld").drafter_name == "pld"
    with pytest.raises(ValueError, match="drafter: expected one of"):
        model.generate(x, custom_generate=recap.generate, drafter="nope", **kw)
    with pytest.raises(TypeError, match="recap_config: expected a recap.RecapConfig"):
        model.generate(x, custom_generate=recap.generate, recap_config={"budget": 3}, **kw)
    with pytest.raises(ValueError, match="not used by the model"):
        model.generate(x, custom_generate=recap.generate, recap_confg=RecapConfig(), **kw)


def test_a_deferred_layout_choice_is_made_once_while_concurrent_requests_wait(monkeypatch):
    import copy

    import recap.first_use.layout_choice as layouts
    from recap.state.model_state import state_of

    model = copy.deepcopy(text_family("Llama"))  # nothing decided on it
    timed = []
    real = layouts._measure
    monkeypatch.setattr(layouts, "_measure", lambda *a: timed.append(1) or real(*a))
    dec = recap.Decoder(model, RecapConfig(budget="auto"))
    dec.generate(prompts(1)[0], max_new_tokens=4)
    assert timed == []  # the first request ran in the model's own layout
    ids = prompts(3)
    outs = on_threads(3, lambda i: dec.generate(ids[i], max_new_tokens=16, eos_token_id=None))
    for x, out in zip(ids, outs, strict=True):
        assert torch.equal(out, model.generate(x, do_sample=False, max_new_tokens=16, eos_token_id=None,
                                               pad_token_id=0))
    state = state_of(model)
    assert timed == [1] and not dec._layout_pending and (state.served, state.running) == (4, 0)
