"""`recap serve` under a fixed Poisson arrival schedule of the shipped prompts, with drafting
on (RECAP@auto) and off (`ar`, the same server and verifier), on the embedded SmolLM2, and
transformers' own continuous batching (`model.init_continuous_batching()`, greedy, its
default settings) fed the same schedule in process (no HTTP: what it is charged is its
scheduler and passes only).

    python benches/serve_load.py [--requests 10] [--max-tokens 48] [--loads 0.5 1 2] [--rows 4]
        [--no-transformers]

The unit load is the rate plain serial decoding sustains: the drafting-off server answering
the same requests one at a time (measured first). For each load the same schedule (same
seed) runs against both servers, one after the other; every greedy answer of the drafting
server must equal the drafting-off server's. Prints output tokens per second and p50/p95
latency and time to first token per load and drafter, as a markdown table.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import threading
import time

import httpx
import torch
import uvicorn
from recap.serve import create_app
from recap.serve.server import build
from recap.tools.models import load_smollm2
from recap.tools.prompts import load_prompts

NAME = "SmolLM2-135M-Instruct"


class Served:
    def __init__(self, engine) -> None:
        app = create_app(engine, NAME, max_tokens_limit=4096)
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="error",
                                                    lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        while not self.server.started:
            time.sleep(0.02)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join()


def ask(url: str, prompt: str, max_tokens: int, t0: float, out: list, i: int) -> None:
    body = {"model": NAME, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "stream": True, "stream_options": {"include_usage": True}}
    sent = time.perf_counter()
    first, text, tokens = None, [], 0
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=600) as r:
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            for c in chunk.get("choices", []):
                if c["delta"].get("content"):
                    first = first or time.perf_counter()
                    text.append(c["delta"]["content"])
    done = time.perf_counter()
    out[i] = {"latency": done - sent, "ttft": (first or done) - sent, "tokens": tokens, "text": "".join(text),
              "end": done - t0}


class TransformersCB:
    """transformers' continuous batching manager on the same model, asked in process."""

    def __init__(self, model, tok) -> None:
        from transformers import GenerationConfig

        self.tok = tok
        gen = GenerationConfig(do_sample=False, max_new_tokens=64, eos_token_id=tok.eos_token_id,
                               pad_token_id=tok.pad_token_id)
        self.manager = model.init_continuous_batching(generation_config=gen)
        self.manager.start()

    def ids(self, prompt: str) -> list[int]:
        made = self.tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                            tokenize=True)
        return list(made["input_ids"] if hasattr(made, "keys") else made)

    def close(self) -> None:
        self.manager.stop(block=True)


def ask_cb(cb: TransformersCB, prompt: str, max_tokens: int, t0: float, out: list, i: int) -> None:
    sent = time.perf_counter()
    rid = cb.manager.add_request(cb.ids(prompt), max_new_tokens=max_tokens, streaming=True)
    first, tokens = None, []
    for result in cb.manager.request_id_iter(rid):
        if result.generated_tokens and first is None:
            first = time.perf_counter()
        tokens = result.generated_tokens
    done = time.perf_counter()
    out[i] = {"latency": done - sent, "ttft": (first or done) - sent, "tokens": len(tokens),
              "text": cb.tok.decode(tokens, skip_special_tokens=True), "end": done - t0}


def run_schedule(target, prompts: list[str], gaps: list[float], max_tokens: int) -> dict:
    """`target`: a server's URL, or a `TransformersCB`."""
    out: list = [None] * len(prompts)
    threads = []
    t0 = time.perf_counter()
    at = 0.0
    fn = ask_cb if isinstance(target, TransformersCB) else ask
    for i, (p, gap) in enumerate(zip(prompts, gaps, strict=True)):
        at += gap
        time.sleep(max(0.0, t0 + at - time.perf_counter()))
        th = threading.Thread(target=fn, args=(target, p, max_tokens, t0, out, i))
        th.start()
        threads.append(th)
    for th in threads:
        th.join()
    span = max(o["end"] for o in out)
    lat = sorted(o["latency"] for o in out)
    ttft = sorted(o["ttft"] for o in out)

    def q(xs, f):
        return xs[min(len(xs) - 1, int(round(f * (len(xs) - 1))))]

    return {"tok_s": sum(o["tokens"] for o in out) / span, "p50": statistics.median(lat), "p95": q(lat, 0.95),
            "ttft50": statistics.median(ttft), "ttft95": q(ttft, 0.95), "texts": [o["text"] for o in out]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=10)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--loads", type=float, nargs="+", default=[0.5, 1.0, 2.0])
    ap.add_argument("--rows", type=int, default=4, help="--max-running of both servers")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-transformers", action="store_true", help="leave out transformers' continuous batching")
    args = ap.parse_args(argv)
    torch.set_num_threads(2)
    model, tok = load_smollm2()
    shipped = [p.turns[0] for p in load_prompts() if p.turns]
    prompts = [shipped[i % len(shipped)] for i in range(args.requests)]
    servers = {}
    for drafter in ("ar", "recap"):
        _, engine = build(model, tok, drafter=drafter, max_running=args.rows, max_queue=4 * args.requests)
        servers[drafter] = Served(engine)
    cb = None if args.no_transformers else TransformersCB(model, tok)
    if cb is not None:  # its first pass warms it
        ask_cb(cb, prompts[0], 4, time.perf_counter(), [None], 0)
    # The unit load: the drafting-off server, one request at a time.
    serial = []
    for p in prompts:
        out: list = [None]
        ask(servers["ar"].url, p, args.max_tokens, time.perf_counter(), out, 0)
        serial.append(out[0]["latency"])
    rate = 1.0 / statistics.mean(serial)
    print(f"serial drafting-off: {statistics.mean(serial):.2f} s per request, unit load {rate:.3f} requests/s",
          flush=True)
    rows = []
    exact = True
    for load in args.loads:
        rng = random.Random(args.seed)
        gaps = [0.0] + [rng.expovariate(rate * load) for _ in prompts[1:]]
        got = {d: run_schedule(servers[d].url, prompts, gaps, args.max_tokens) for d in ("ar", "recap")}
        if cb is not None:
            got["transformers CB"] = run_schedule(cb, prompts, gaps, args.max_tokens)
        exact &= all(g["texts"] == got["ar"]["texts"] for g in got.values())
        for d in got:
            g = got[d]
            rows.append(f"| {load:g}x | {d} | {g['tok_s']:.1f} | {g['p50']:.2f} / {g['p95']:.2f} | "
                        f"{g['ttft50']:.2f} / {g['ttft95']:.2f} |")
        rows.append(f"| {load:g}x | recap / ar | {got['recap']['tok_s'] / got['ar']['tok_s']:.2f}x | | |")
        print("\n".join(rows[-len(got) - 1:]), flush=True)
    for s in servers.values():
        s.close()
    if cb is not None:
        cb.close()
    print(f"\n{args.requests} requests, {args.max_tokens} max tokens, {args.rows} rows; greedy answers identical: "
          f"{exact}\n")
    print("| load | server | output tok/s | latency p50 / p95 s | first token p50 / p95 s |\n|---|---|---|---|---|")
    print("\n".join(rows))
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
