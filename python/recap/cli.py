"""Command line: `recap demo` runs RECAP against plain greedy on the embedded SmolLM2-135M-Instruct."""

from __future__ import annotations

import argparse
import sys
import time


def _encode(tok, messages):
    import torch

    ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt")
    if not isinstance(ids, torch.Tensor):
        ids = ids["input_ids"]
    return ids


def demo(args: argparse.Namespace) -> int:
    import torch

    import recap
    from recap.models import load_smollm2
    from recap.prompts import load_prompts

    t0 = time.perf_counter()
    model, tok = load_smollm2(threads=args.threads)
    print(f"loaded SmolLM2-135M-Instruct (float32, {torch.get_num_threads()} threads) "
          f"in {time.perf_counter() - t0:.1f} s")
    config = recap.RecapConfig(budget=args.budget)
    dec = recap.Decoder(model, config)
    prompts = load_prompts(sets=args.sets, per_set=args.per_set)
    eos = tok.eos_token_id
    warm = _encode(tok, [{"role": "user", "content": "Hi"}])
    model.generate(warm, attention_mask=torch.ones_like(warm), do_sample=False, max_new_tokens=4)
    dec.generate(warm, max_new_tokens=4)
    rows = []
    for p in prompts:
        messages = [{"role": "user", "content": p.turns[0]}]
        ids = _encode(tok, messages)
        t = time.perf_counter()
        want = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                              max_new_tokens=args.max_new_tokens, eos_token_id=eos)
        t_ar = time.perf_counter() - t
        t = time.perf_counter()
        got = dec.generate(ids, max_new_tokens=args.max_new_tokens, eos_token_id=eos)
        t_recap = time.perf_counter() - t
        s = dec.last_stats
        equal = got.tolist() == want.tolist()
        us = s.per_step_us()
        rows.append((p, equal, s, t_ar, t_recap))
        print(f"\n[{p.set}] {p.id}: {ids.shape[1]} prompt tokens, {s.new_tokens} new")
        print("  answer:", tok.decode(got[0, ids.shape[1]:], skip_special_tokens=True).strip()[:300].replace("\n", " "))
        print(f"  equal to greedy: {equal} | tau {s.tau:.2f} | speedup {t_ar / t_recap:.2f}x "
              f"({t_ar:.2f} s -> {t_recap:.2f} s) | mean tree {s.mean_tree_size:.1f} nodes | host/step "
              f"{us['host']:.0f} us (draft {us['draft']:.0f}, pack {us['pack']:.0f}, update {us['update']:.0f}, "
              f"kv {us['compact']:.0f}, other {us['other']:.0f}) | forward/step {us['forward'] / 1000:.1f} ms")
    total_ar = sum(r[3] for r in rows)
    total_recap = sum(r[4] for r in rows)
    steps = sum(r[2].steps for r in rows)
    toks = sum(r[2].new_tokens - 1 for r in rows)
    host = sum(r[2].host_s for r in rows)
    print(f"\nall {len(rows)} prompts: outputs equal {sum(r[1] for r in rows)}/{len(rows)} | "
          f"tau {toks / max(steps, 1):.2f} | speedup {total_ar / total_recap:.2f}x | "
          f"host overhead {host / max(steps, 1) * 1e6:.0f} us/step")
    return 0 if all(r[1] for r in rows) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="recap", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="RECAP vs plain greedy on the embedded SmolLM2-135M-Instruct")
    d.add_argument("--max-new-tokens", type=int, default=128)
    d.add_argument("--budget", type=int, default=16, help="tree nodes per step (root not counted)")
    d.add_argument("--per-set", type=int, default=1, help="prompts per data set")
    d.add_argument("--sets", nargs="*", default=None, help="mt_bench humaneval summarisation")
    d.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    if args.command == "demo":
        return demo(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
