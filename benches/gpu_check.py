"""A short, prepared check of recap.Decoder on an accelerator (or, with --tiny, on the CPU).

On a random-weight model with the shapes of Qwen2.5-VL-7B's language model (no download):

1. c(n): the time of one verification pass over n = 1..128 tree tokens after a 64-token
   context, top-k and the device-to-host copy included, exactly as a decoding step runs it;
2. the host time per step of `recap.Decoder` (everything outside the forward pass), and
   its phases, over one generation;
3. argmax agreement between a tree pass and one-token passes in the given dtype (bfloat16 by
   default): the share of 64 chain positions where the tree pass's argmax equals the argmax
   of the same token fed one at a time;
4. batches: at B = 1, 8, 32 (--tiny: 1, 2, 4) prompts of mixed lengths that repeat
   themselves, left-padded, committed tokens per second of batched greedy `generate` and of
   RECAP@auto's batched `Decoder.generate`, and how many rows are identical.

    python benches/gpu_check.py --device cuda --dtype bfloat16 --out gpu-check.json
    python benches/gpu_check.py --tiny --out tiny.json       # CI: a tiny model on the CPU

Prints a short report and writes every figure as JSON.
"""

from __future__ import annotations

import argparse
import json
import platform
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
    from recap.budget import ChainPasses
    from recap.decoder import _PassFactory

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
    from recap.tree_pass import TreePass
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


def batches(model, sizes: list[int], vocab: int, new_tokens: int, device: str) -> dict:
    """Batched greedy generate against RECAP@auto's batched decoding (see the module doc)."""
    import recap
    from recap.batch_bench import left_pad

    dec = recap.Decoder(model, recap.RecapConfig(budget="auto"), linear_layout="default")
    g = torch.Generator().manual_seed(3)
    out = {}
    for b in sizes:
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
        out[b] = {"greedy_tok_s": tokens / greedy_s, "recap_tok_s": tokens / recap_s, "speedup": greedy_s / recap_s,
                  "tau": stats.tau if stats else None, "rows_equal": same, "rows": b}
    return out


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def main(argv: list[str] | None = None) -> int:
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

    t0 = time.perf_counter()
    model = build(shapes, device, dtype)
    built_s = time.perf_counter() - t0
    dec = recap.Decoder(model, recap.RecapConfig(budget=32), linear_layout="default")
    curve = cost_curve(dec, sizes, reps=3 if args.tiny else 5)
    prompt = torch.randint(3, shapes["vocab_size"] - 1, (1, 256), generator=torch.Generator().manual_seed(2))
    prompt = torch.cat([prompt, prompt[:, :64]], 1).to(device)  # a repeat, so drafts get accepted
    dec.generate(prompt, max_new_tokens=8, eos_token_id=None)  # warm-up
    dec.generate(prompt, max_new_tokens=new_tokens, eos_token_id=None)
    stats = dec.last_stats
    agree = agreement(dec)
    batch = batches(model, [1, 2, 4] if args.tiny else [1, 8, 32], shapes["vocab_size"], new_tokens, device)
    report = {
        "device": str(device), "device_name": torch.cuda.get_device_name() if device.startswith("cuda") else
        platform.processor() or platform.machine(), "dtype": str(dtype), "shapes": shapes,
        "build_s": built_s, "cost_ms": {n: t * 1e3 for n, t in curve.items()},
        "cost_ratio_vs_1": {n: t / curve[1] for n, t in curve.items()},
        "steps": stats.steps, "tau": stats.tau, "new_tokens": stats.new_tokens,
        "host_us_per_step": stats.per_step_us(), "tree_vs_one_token_argmax_agreement": agree,
        "batches": batch, "torch": torch.__version__,
    }
    Path(args.out).write_text(json.dumps(report, indent=1))
    picks = [n for n in (1, 8, 16, 32, 64, 128) if n in curve]
    print(f"{report['device_name']} ({device}, {dtype}), model built in {built_s:.1f} s")
    print("c(n) ms: " + ", ".join(f"{n}: {curve[n] * 1e3:.2f}" for n in picks))
    us = stats.per_step_us()
    print(f"host us/step {us['host']:.0f} (draft {us['draft']:.0f}, pack {us['pack']:.0f}, update {us['update']:.0f}, "
          f"kv {us['compact']:.0f}), forward ms/step {us['forward'] / 1e3:.2f}, tau {stats.tau:.2f}")
    print(f"tree vs one-token argmax agreement: {agree:.3f}")
    for b, r in batch.items():
        print(f"B={b}: batched greedy {r['greedy_tok_s']:.1f} tok/s, RECAP@auto {r['recap_tok_s']:.1f} tok/s "
              f"({r['speedup']:.2f}x, tau {r['tau']:.2f}), {r['rows_equal']}/{r['rows']} rows identical")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
