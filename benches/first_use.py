"""What a new user pays before RECAP decodes anything, and what its prefill costs.

For the embedded SmolLM2-135M-Instruct and a random-weight model with Qwen2.5-0.5B's shapes
(24 layers, hidden 896, 14 heads, 2 KV heads, intermediate 4,864, vocabulary 151,936: random
weights, real costs), each in a fresh process-like state (an empty measurement store):

- first use: the conformance probe, the cost curve and the head share, each timed, then the
  linear-layout choice first use defers to the model's second request (the transposed weight
  copy within it), cold and then again as a later process sees it (the store filled);
- the head share the parameter counts estimate against what the prefills measured;
- time to first token on the longest shipped summarisation prompt: `Decoder.generate`
  against `model.generate` (max_new_tokens=1, medians of interleaved repetitions);
- a 128-token `model.generate`, the yardstick of the first-use target;
- what a user who calls it once sees: a new decoder's first 128-token `generate` on that
  prompt, first use included (an empty store, no copy made yet), against `model.generate`
  and the same decoder's second call (the layout choice included) and third.

    python benches/first_use.py [--model smollm2|qwen05b|both] [--reps 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from contextlib import contextmanager

import torch

SHAPES_05B = dict(num_hidden_layers=24, hidden_size=896, num_attention_heads=14, num_key_value_heads=2,
                  intermediate_size=4864, vocab_size=151936, max_position_embeddings=4096,
                  tie_word_embeddings=True)


def load(name: str):
    from recap.tools.models import load_smollm2

    model, tok = load_smollm2()[:2]
    if name == "smollm2":
        return model, tok
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    big = Qwen2ForCausalLM(Qwen2Config(**SHAPES_05B)).eval()
    return big, tok  # SmolLM2's tokenizer: its ids are valid in the larger vocabulary


@contextmanager
def timed(parts: dict, name: str):
    t = time.perf_counter()
    try:
        yield
    finally:
        parts[name] = parts.get(name, 0.0) + time.perf_counter() - t


PARTS = ["probe", "layout", "cost curve", "of which weight copy", "head share"]


@contextmanager
def instrumented(parts: dict):
    """Times each first-use step into `parts` while the block runs."""
    from recap.decoding import decoder as d

    originals = (d.probe, d.layout_choice.choose, d.Decoder._calibrate, d.seeding.head_share)
    refresh = d.layouts.LinearLayout._refresh

    def wrap(f, name):
        def inner(*a, **k):
            with timed(parts, name):
                return f(*a, **k)
        return inner

    d.probe = wrap(originals[0], "probe")
    d.layout_choice.choose = wrap(originals[1], "layout")
    d.Decoder._calibrate = wrap(originals[2], "cost curve")
    d.seeding.head_share = wrap(originals[3], "head share")
    d.layouts.LinearLayout._refresh = wrap(refresh, "of which weight copy")  # type: ignore[method-assign]
    try:
        yield
    finally:
        d.probe, d.layout_choice.choose, d.Decoder._calibrate, d.seeding.head_share = originals
        d.layouts.LinearLayout._refresh = refresh  # type: ignore[method-assign]


def first_use(model) -> tuple[dict, dict]:
    """Seconds of a new decoder's first use (what its first request pays before the prefill),
    then of the linear-layout choice that first use defers to the model's second request
    (nothing where an earlier process stored it), each with the part each step took."""
    import recap

    dec = recap.Decoder(model)
    first, deferred = dict.fromkeys(PARTS, 0.0), dict.fromkeys(PARTS, 0.0)
    with instrumented(first), timed(first, "total"):
        dec._prepare()
    with instrumented(deferred), timed(deferred, "total"):
        dec._settle_layout()
    return first, deferred


def median_time(f, reps: int) -> float:
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        f()
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def measure(name: str, prompt, reps: int) -> None:
    import recap
    from recap.state.model_state import state_of

    model, tok = load(name)
    ids = tok.apply_chat_template([{"role": "user", "content": prompt.turns[0]}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)["input_ids"]
    mask = torch.ones_like(ids)
    with torch.no_grad():
        model.generate(ids[:, :16], attention_mask=mask[:, :16], max_new_tokens=2, do_sample=False)  # warm
    cold, cold_layout = first_use(model)
    state_of(model).__init__()  # forget what this process measured: a later process
    warm, warm_layout = first_use(model)
    dec = recap.Decoder(model)
    dec._prepare()
    ttft_ours, ttft_theirs = [], []
    with torch.no_grad():
        for _ in range(reps):  # interleaved
            ttft_theirs.append(median_time(
                lambda: model.generate(ids, attention_mask=mask, max_new_tokens=1, do_sample=False), 1))
            ttft_ours.append(median_time(lambda: dec.generate(ids, max_new_tokens=1), 1))
        full = median_time(lambda: model.generate(ids[:, -64:], attention_mask=mask[:, -64:], max_new_tokens=128,
                                                  min_new_tokens=128, do_sample=False), 1)
    a, b = statistics.median(ttft_ours), statistics.median(ttft_theirs)
    from recap.verify import seeding

    print(f"{name}: head share estimated {seeding.estimated_share(model):.3f}, measured by the prefills "
          f"{state_of(model).head_share or float('nan'):.3f}; seeded positions on this prompt: "
          f"{seeding.positions(ids.shape[1], dec.seed_share() or 0.0)}")
    fmt = lambda parts: ", ".join(f"{k} {v:.2f} s" for k, v in parts.items())  # noqa: E731
    print(f"{name}: first use cold {cold['total']:.2f} s ({fmt(cold)}); the layout choice it defers to the "
          f"second request {cold_layout['total']:.2f} s ({fmt(cold_layout)}); later process "
          f"{warm['total']:.2f} s ({fmt(warm)}), then {warm_layout['total']:.2f} s at its second request; "
          f"a 128-token generate {full:.2f} s (5%: {0.05 * full:.2f} s)")
    print(f"{name}: time to first token, {ids.shape[1]}-token prompt ({prompt.id}): "
          f"recap {a:.3f} s, generate {b:.3f} s ({a / b:.2f}x)", flush=True)
    print(f"{name}: ", end="")
    first_request(model, ids, mask)


def first_request(model, ids, mask) -> None:
    """A new decoder's first 128-token request, first use included, as a new process on an
    empty store sees it; then `model.generate` and the decoder's second request."""
    import recap
    from recap.state.model_state import state_of

    state_of(model).__init__()  # nothing measured, no weight copy
    with tempfile.TemporaryDirectory() as store, torch.no_grad():
        os.environ["RECAP_CACHE_DIR"] = store
        dec = recap.Decoder(model)
        times = {}
        with timed(times, "first"):
            ours = dec.generate(ids, max_new_tokens=128)
        with timed(times, "generate"):
            theirs = model.generate(ids, attention_mask=mask, max_new_tokens=128, do_sample=False)
        with timed(times, "second"):
            dec.generate(ids, max_new_tokens=128)
        with timed(times, "third"):
            dec.generate(ids, max_new_tokens=128)
    same = ours.tolist() == theirs.tolist()
    print(f"first request ({ids.shape[1]}-token prompt, 128 new tokens): recap's first call {times['first']:.2f} s "
          f"(first use included), generate {times['generate']:.2f} s ({times['generate'] / times['first']:.2f}x), "
          f"recap's second call {times['second']:.2f} s (the layout choice included; "
          f"{times['generate'] / times['second']:.2f}x), third {times['third']:.2f} s "
          f"({times['generate'] / times['third']:.2f}x); layout {dec.linear_layout_used}; "
          f"outputs {'identical' if same else 'DIFFERENT'}", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=["smollm2", "qwen05b", "both"], default="both")
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args(argv)
    from recap.tools.prompts import load_prompts

    longest = max(load_prompts(sets=["summarisation"]), key=lambda q: len(q.turns[0]))
    for name in ["smollm2", "qwen05b"] if args.model == "both" else [args.model]:
        with tempfile.TemporaryDirectory() as store:
            os.environ["RECAP_CACHE_DIR"] = store  # an empty store: a new machine
            os.environ.pop("RECAP_CACHE", None)
            measure(name, longest, args.reps)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
