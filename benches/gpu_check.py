"""A short, prepared check of recap.Decoder on an accelerator (or, with --tiny, on the CPU).

On a random-weight model with the shapes of Qwen2.5-VL-7B's language model (no download):

1. c(n): the time of one verification pass over n = 1..128 tree tokens after a 64-token
   context, top-k and the device-to-host copy included, exactly as a decoding step runs it;
2. the host time per step of `recap.Decoder` (everything outside the forward pass), and
   its phases, over one generation;
3. argmax agreement between a tree pass and one-token passes in the given dtype (bfloat16 by
   default): the share of 64 chain positions where the tree pass's argmax equals the argmax
   of the same token fed one at a time;
4. first use: what `budget="auto"` measures before it decodes (`Decoder.calibrate()`, in an
   empty measurement store of the check's own, as on a new machine);
5. batches: at B = 1, 8, 32 (--tiny: 1, 2, 4) prompts of mixed lengths that repeat
   themselves, left-padded, committed tokens per second of batched greedy `generate` and of
   RECAP@auto's batched `Decoder.generate`, and how many rows are identical.

    python benches/gpu_check.py --device cuda --dtype bfloat16 --out gpu-check.json
    python benches/gpu_check.py --tiny --out tiny.json       # CI: a tiny model on the CPU

Prints each phase's figures as soon as they are measured and writes them as JSON at once, so a
run cut short by a time limit keeps what it measured.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import torch

# Qwen2.5-VL-7B-Instruct's language model (its config.json's text part).
QWEN25_VL_7B = dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                    num_attention_heads=28, num_key_value_heads=4, max_position_embeddings=32768)
TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=4096)


def build(shapes: dict, device: str, dtype: torch.dtype) -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(**shapes, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
                      bos_token_id=0, eos_token_id=1, pad_token_id=0)
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # random weights created in the target dtype, on the device
    try:
        with torch.device(device):
            model = Qwen2ForCausalLM(cfg)
    finally:
        torch.set_default_dtype(previous)
    return model.eval()


def cost_curve(dec, sizes: list[int], reps: int) -> dict[int, float]:
    from recap.decoding.decoder import _PassFactory
    from recap.first_use.budget import ChainPasses

    passes = ChainPasses(dec.model, _PassFactory(dec), max(sizes))
    out = {}
    for n in sizes:
        tokens = passes.draw(n)
        times = [passes.run(tokens) for _ in range(reps + 1)][1:]  # the first pass of each size warms up
        out[n] = sorted(times)[len(times) // 2]
    return out


@torch.no_grad()
def agreement(dec, n: int = 64, context: int = 128) -> float:
    """Share of chain positions whose tree-pass argmax equals the one-token-pass argmax."""
    from recap.verify.tree_pass import TreePass
    from transformers import DynamicCache

    model, adapter = dec.model, dec.adapter
    device = adapter.lm_head.weight.device
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(3, adapter.vocab_size - 1, (1, context + n), generator=gen).to(device)
    kw = adapter.cache_keyword
    ref_cache = DynamicCache(config=model.config)
    model(input_ids=ids[:, :context], **{kw: ref_cache}, use_cache=True)
    one = [int(model(input_ids=ids[:, i:i + 1], **{kw: ref_cache}, use_cache=True).logits[0, -1].argmax())
           for i in range(context, context + n)]
    tp = TreePass(adapter, n, context + n + 1)
    tp.prefill(ids[:, :context], None, {})
    tree = tp.verify(*tp.load_chain(ids[0, context:].tolist())).argmax(-1)
    return sum(int(a == b) for a, b in zip(tree.tolist(), one, strict=True)) / n


def batch(dec, b: int, vocab: int, new_tokens: int, device: str) -> dict:
    """Batched greedy generate against RECAP@auto's batched decoding at B = b (see the module doc)."""
    from recap.tools.batch_bench import left_pad

    model = dec.model
    g = torch.Generator().manual_seed(3)
    rows = []
    for i in range(b):
        n = 48 + (i * 37) % 160
        head = torch.randint(3, vocab - 1, (1, n), generator=g)
        rows.append(torch.cat([head, head[:, : n // 2]], 1))  # a repeat, so drafts get accepted
    ids, mask = left_pad(rows, 0)
    ids, mask = ids.to(device), mask.to(device)
    kw = dict(max_new_tokens=new_tokens, eos_token_id=None, pad_token_id=0)
    dec.generate(ids[:, -16:], attention_mask=mask[:, -16:], **{**kw, "max_new_tokens": 4})  # warm-up
    model.generate(input_ids=ids[:, -16:], attention_mask=mask[:, -16:], do_sample=False,
                   **{**kw, "max_new_tokens": 4})
    timed = {}
    for name in ("greedy", "recap", "greedy again", "recap again"):
        _sync(device)
        t = time.perf_counter()
        if name.startswith("greedy"):
            seq = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, **kw)
        else:
            seq = dec.generate(ids, attention_mask=mask, **kw)
        _sync(device)
        timed.setdefault(name.split()[0], []).append((time.perf_counter() - t, seq))
    tokens = b * new_tokens
    greedy_s = min(t for t, _ in timed["greedy"])
    recap_s = min(t for t, _ in timed["recap"])
    same = sum(int(torch.equal(x, y)) for x, y in zip(timed["greedy"][0][1], timed["recap"][0][1], strict=True))
    stats = dec.last_stats
    return {"greedy_tok_s": tokens / greedy_s, "recap_tok_s": tokens / recap_s, "speedup": greedy_s / recap_s,
            "tau": stats.tau if stats else None, "rows_equal": same, "rows": b}


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def main(argv: list[str] | None = None) -> int:
    with tempfile.TemporaryDirectory() as store:  # an empty measurement store of its own
        saved = {k: os.environ.pop(k, None) for k in ("RECAP_CACHE_DIR", "RECAP_CACHE")}
        os.environ["RECAP_CACHE_DIR"] = store
        try:
            return check(argv)
        finally:
            for k, v in saved.items():
                os.environ.pop(k, None)
                if v is not None:
                    os.environ[k] = v


def check(argv: list[str] | None) -> int:
    import recap

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default=None, help="bfloat16 (default), float16, float32, float64")
    p.add_argument("--tiny", action="store_true", help="a tiny model on the CPU in float64 (for CI)")
    p.add_argument("--new-tokens", type=int, default=None, help="tokens generated for the host-time figure")
    p.add_argument("--out", default="gpu-check.json")
    args = p.parse_args(argv)
    device = "cpu" if args.tiny else args.device
    dtype = getattr(torch, args.dtype or ("float64" if args.tiny else "bfloat16"))
    shapes = TINY if args.tiny else QWEN25_VL_7B
    sizes = [1, 2, 4, 8, 16, 32, 64, 128] if args.tiny else list(range(1, 129))
    new_tokens = args.new_tokens or (32 if args.tiny else 128)

    report: dict = {"device": str(device), "dtype": str(dtype), "shapes": shapes, "torch": torch.__version__}
    out = Path(args.out)

    def done(phase: str, line: str, **figures) -> None:
        """Each phase's figures are written as soon as they are measured: a run cut short keeps them."""
        report.update(figures)
        out.write_text(json.dumps(report, indent=1))
        print(f"[{time.perf_counter() - t0:6.1f} s] {phase}: {line}", flush=True)

    t0 = time.perf_counter()
    model = build(shapes, device, dtype)
    name = torch.cuda.get_device_name() if device.startswith("cuda") else platform.processor() or platform.machine()
    done("model", f"{name} ({device}, {dtype})", device_name=name, build_s=time.perf_counter() - t0)

    auto = recap.Decoder(model, recap.RecapConfig(budget="auto"), linear_layout="default")  # also for batches
    t = time.perf_counter()
    auto.calibrate()
    first_use = time.perf_counter() - t  # an empty store (main): what a new machine pays
    done("first use", f"{first_use:.2f} s (conformance probe and cost curve for budget='auto')",
         first_use_s=first_use)

    dec = recap.Decoder(model, recap.RecapConfig(budget=32), linear_layout="default")
    curve = cost_curve(dec, sizes, reps=3 if args.tiny else 5)
    picks = [n for n in (1, 8, 16, 32, 64, 128) if n in curve]
    done("c(n) ms", ", ".join(f"{n}: {curve[n] * 1e3:.2f}" for n in picks),
         cost_ms={n: t * 1e3 for n, t in curve.items()}, cost_ratio_vs_1={n: t / curve[1] for n, t in curve.items()})

    prompt = torch.randint(3, shapes["vocab_size"] - 1, (1, 256), generator=torch.Generator().manual_seed(2))
    prompt = torch.cat([prompt, prompt[:, :64]], 1).to(device)  # a repeat, so drafts get accepted
    dec.generate(prompt, max_new_tokens=8, eos_token_id=None)  # warm-up
    dec.generate(prompt, max_new_tokens=new_tokens, eos_token_id=None)
    stats = dec.last_stats
    us = stats.per_step_us()
    done("host", f"us/step {us['host']:.0f} (draft {us['draft']:.0f}, pack {us['pack']:.0f}, "
         f"update {us['update']:.0f}, kv {us['compact']:.0f}), forward ms/step {us['forward'] / 1e3:.2f}, "
         f"tau {stats.tau:.2f}", steps=stats.steps, tau=stats.tau, new_tokens=stats.new_tokens,
         host_us_per_step=us)

    agree = agreement(dec)
    done("tree vs one-token argmax agreement", f"{agree:.3f}", tree_vs_one_token_argmax_agreement=agree)

    report["batches"] = {}
    for b in [1, 2, 4] if args.tiny else [1, 8, 32]:
        r = batch(auto, b, shapes["vocab_size"], new_tokens, device)
        report["batches"][b] = r
        done(f"B={b}", f"batched greedy {r['greedy_tok_s']:.1f} tok/s, RECAP@auto {r['recap_tok_s']:.1f} tok/s "
             f"({r['speedup']:.2f}x, tau {r['tau']:.2f}), {r['rows_equal']}/{r['rows']} rows identical")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
