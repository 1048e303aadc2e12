"""What grouped attention saves a verification pass (recap.verify.grouped_attention), paired.

For each context length and tree size, one request's tree pass (`TreePass.chain`, exactly
as decoding runs it, in the decoder's linear layout) alternates between transformers' own
path, which copies the cache's key/value heads once per query head, and the grouped one.
Each pair runs back to back, so a busy machine slows both alike; the figure is the median of
the pairs' ratios. Every pair's packed outputs (pick, top-k ids and probabilities) are
compared: they must be the same bits.

    python benches/grouped_attention.py [--contexts 200 800 1400 2000] [--sizes 4 8 16 32]
        [--reps 15] [--out FILE.json]
    python benches/grouped_attention.py --tiny     # a tiny random model (the tests run this)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time

import recap
import recap.verify.tree_pass as tree_pass_module
import torch
from recap.verify.grouped_attention import grouped
from recap.verify.tree_pass import TreePass


def _copying(tokens: int):
    return contextlib.nullcontext(False)


def _tiny_model():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)
    return LlamaForCausalLM(cfg).eval()


def measure(model, contexts: list[int], sizes: list[int], reps: int) -> list[dict]:
    dec = recap.Decoder(model)
    vocab = model.get_output_embeddings().weight.shape[0]
    gen = torch.Generator().manual_seed(0)
    try:
        return _pairs(dec, vocab, gen, contexts, sizes, reps)
    finally:  # the library's own path again, whatever happened
        tree_pass_module.grouped = grouped


def _pairs(dec, vocab: int, gen, contexts: list[int], sizes: list[int], reps: int) -> list[dict]:
    rows = []
    with torch.no_grad(), dec.verifying():
        for ctx in contexts:
            tp = TreePass(dec.adapter, max(sizes), ctx + max(sizes) + 8)
            tp.prefill(torch.randint(3, vocab - 1, (1, ctx), generator=gen), None, {})
            for n in sizes:
                toks = torch.randint(3, vocab - 1, (n,), generator=gen).tolist()
                ratios, own, shared, same = [], [], [], True
                for r in range(reps + 1):  # the first pair warms up
                    times, outs = [], []
                    for path in (_copying, grouped):
                        tree_pass_module.grouped = path
                        t = time.perf_counter()
                        outs.append(tp.chain(toks))
                        times.append(time.perf_counter() - t)
                    same &= bool((outs[0] == outs[1]).all())
                    if r:
                        own.append(times[0])
                        shared.append(times[1])
                        ratios.append(times[1] / times[0])
                rows.append({"context": ctx, "tokens": n, "own_ms": statistics.median(own) * 1e3,
                             "grouped_ms": statistics.median(shared) * 1e3,
                             "ratio": statistics.median(ratios), "same_bits": same})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--contexts", type=int, nargs="+", default=[200, 800, 1400, 2000])
    ap.add_argument("--sizes", type=int, nargs="+", default=[4, 8, 16, 32])
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--tiny", action="store_true", help="a tiny random model, two contexts, 3 pairs")
    ap.add_argument("--out", help="also write the rows here (JSON)")
    args = ap.parse_args(argv)
    if args.tiny:
        model, contexts, sizes, reps = _tiny_model(), [16, 64], [2, 5], 3
    else:
        from recap.tools.models import load_smollm2

        model, contexts, sizes, reps = load_smollm2()[0], args.contexts, args.sizes, args.reps
    rows = measure(model, contexts, sizes, reps)
    print("| context | tokens | own (copies K/V) ms | grouped ms | paired ratio | same bits |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['context']} | {r['tokens']} | {r['own_ms']:.1f} | {r['grouped_ms']:.1f} | "
              f"{r['ratio']:.3f} | {'yes' if r['same_bits'] else 'NO'} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    return 0 if all(r["same_bits"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
