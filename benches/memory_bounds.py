"""Bounds under long runs: the bytes of every drafter structure over many requests and over
one long generation, a memory pool's bytes under tenant churn, and the process's peak RSS.

    python benches/memory_bounds.py                     # 10,000 requests and a 10,000-token
                                                        # generation at vocabulary 151,936
    python benches/memory_bounds.py --tiny              # a few seconds (the tests run this)

No model: requests are synthetic (Zipf-distributed prompts, so contexts repeat as text does;
random top-k rows; the target never accepts a draft, so each step commits one token and
every step writes new rows). Cross-request structures must stay within their bound however
many requests pass; request-local ones grow with the request and are reported per token.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

import numpy as np
from recap import Drafter, MemoryPool, RecapConfig
from recap._core import Session

K = 8
DRAFTERS = ("recap", "tr", "sam_tr", "suffix_x", "pld")


def build(name: str, vocab: int) -> Drafter:
    if name == "recap":
        return RecapConfig(budget="auto").new_drafter(vocab)
    if name == "tr":
        return Drafter.tr(vocab, k=K)
    if name == "sam_tr":
        return Drafter.sam(vocab, fallback_tr=True, k=K)
    if name == "suffix_x":
        return Drafter.suffix(vocab, cross_request=True)
    return Drafter.pld(vocab)


class Synthetic:
    def __init__(self, vocab: int, seed: int = 0) -> None:
        self.vocab, self.rng = vocab, np.random.default_rng(seed)
        self.probs = np.sort(self.rng.dirichlet(np.ones(K), 4096).astype(np.float32), axis=1)[:, ::-1].copy()

    def tokens(self, n: int) -> np.ndarray:
        return (self.rng.zipf(1.3, n) % self.vocab).astype(np.int64)

    def rows(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        ids = (self.rng.zipf(1.3, (n, K)) % self.vocab).astype(np.int64)
        return ids, self.probs[self.rng.integers(0, len(self.probs), n)]


def run_request(d: Session, syn: Synthetic, prompt_len: int, new_tokens: int) -> None:
    prompt = syn.tokens(prompt_len)
    d.begin(prompt)
    d.seed(*syn.rows(prompt_len))
    for _ in range(new_tokens):
        n = len(d.propose())
        ids, probs = syn.rows(n)
        d.observe(syn.tokens(n), ids, probs)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux


def many_requests(name: str, vocab: int, requests: int, every: int) -> dict:
    d, syn = build(name, vocab).session(), Synthetic(vocab)  # one session, reused by each request
    samples, t0 = [], time.perf_counter()
    for i in range(1, requests + 1):
        run_request(d, syn, prompt_len=int(syn.rng.integers(16, 256)), new_tokens=16)
        if i % every == 0 or i == requests:
            samples.append({"requests": i, **dict(d.bytes_by_part())})
    return {"drafter": name, "samples": samples, "seconds": time.perf_counter() - t0}


def long_generation(name: str, vocab: int, tokens: int, every: int) -> dict:
    d, syn = build(name, vocab).session(), Synthetic(vocab, seed=1)
    d.begin(syn.tokens(64))
    samples = []
    for t in range(1, tokens + 1):
        n = len(d.propose())
        ids, probs = syn.rows(n)
        d.observe(syn.tokens(n), ids, probs)
        if t % every == 0 or t == tokens:
            samples.append({"tokens": 64 + t, **dict(d.bytes_by_part())})
    return {"drafter": name, "samples": samples}


def pool_churn(vocab: int, requests: int, tenants: int, max_bytes: int, every: int) -> dict:
    """Requests from `tenants` scopes (Zipf-popular) through one pool bounded by max_bytes."""
    pool, syn = MemoryPool(max_bytes, rows_per_scope=4096), Synthetic(vocab, seed=2)
    d = RecapConfig(budget="auto").new_drafter(vocab)
    samples, peak = [], 0
    for i in range(1, requests + 1):
        scope = f"tenant-{int(syn.rng.zipf(1.5)) % tenants}"
        with pool.use(scope, vocab, K) as memory, d.session(memory=memory) as session:
            run_request(session, syn, prompt_len=int(syn.rng.integers(16, 256)), new_tokens=16)
        peak = max(peak, pool.bytes())
        if i % every == 0 or i == requests:
            samples.append({"requests": i, "pool_bytes": pool.bytes(), "scopes": len(pool.stats()),
                            "evictions": pool.evictions})
    return {"max_bytes": max_bytes, "peak_bytes_after_requests": peak, "samples": samples}


def markdown(report: dict) -> str:
    lines = [f"vocabulary {report['vocab']}, {report['requests']} requests (16 new tokens each), "
             f"one generation of {report['long_tokens']} tokens, peak RSS {report['peak_rss_mb']:.0f} MB", "",
             "| drafter | structure | bytes after 10% of requests | bytes at the end | bytes after a long "
             "generation | per generated token |", "|---|---|---|---|---|---|"]
    for many, long in zip(report["many"], report["long"], strict=True):
        first, last = many["samples"][max(len(many["samples"]) // 10 - 1, 0)], many["samples"][-1]
        grow = long["samples"]
        for part in last:
            if part == "requests":
                continue
            slope = (grow[-1][part] - grow[0][part]) / max(grow[-1]["tokens"] - grow[0]["tokens"], 1)
            lines.append(f"| {many['drafter']} | {part} | {first[part]:,} | {last[part]:,} | {grow[-1][part]:,} | "
                         f"{slope:.1f} |")
    p = report["pool"]
    lines += ["", f"Pool (bound {p['max_bytes']:,} bytes): largest size after a request "
              f"{p['peak_bytes_after_requests']:,} bytes; {p['samples'][-1]['scopes']} scopes live, "
              f"{p['samples'][-1]['evictions']} evicted."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", type=int, default=151_936)
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--long", type=int, default=10_000, help="tokens of the single long generation")
    ap.add_argument("--drafters", nargs="+", default=list(DRAFTERS), choices=DRAFTERS)
    ap.add_argument("--pool-bytes", type=int, default=8 << 20, help="the memory pool's bound")
    ap.add_argument("--tiny", action="store_true", help="small sizes (the tests run this)")
    ap.add_argument("--out", default="bounds-out")
    args = ap.parse_args(argv)
    if args.tiny:
        args.vocab, args.requests, args.long, args.pool_bytes = 2_000, 60, 400, 300_000
    every = max(args.requests // 20, 1)
    report = {"vocab": args.vocab, "requests": args.requests, "long_tokens": args.long,
              "many": [many_requests(n, args.vocab, args.requests, every) for n in args.drafters],
              "long": [long_generation(n, args.vocab, args.long, max(args.long // 20, 1)) for n in args.drafters],
              "pool": pool_churn(args.vocab, args.requests, tenants=50, max_bytes=args.pool_bytes,
                                 every=every)}
    report["peak_rss_mb"] = peak_rss_mb()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bounds.json").write_text(json.dumps(report, indent=1))
    (out / "bounds.md").write_text(markdown(report) + "\n")
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
