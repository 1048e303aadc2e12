"""The automatic budget's choices in modeled time, so changes to the controller compare
without the machine's timing noise.

Every verification pass is charged a fixed cost curve instead of the clock (the controller's
online corrections then stay at 1, host time is a constant), and the seeding share stays
where first use put it (prefills do not correct it, the measurement store is off), so two
runs of one build make the same choices and print the same figures: what differs between two
builds is what their controllers chose. Each prompt is decoded once, greedy, by
one decoder whose calibration carries over from prompt to prompt (as in a server). A
request's modeled speedup is (new tokens - 1) x c(1) over the sum of c(tree size) over its
steps: the passes plain decoding would take over the passes the chosen trees take (prefill
and host time left out). On a 2-core VM a wall-clock run of the same prompts moves by 5% per
prompt from run to run; this does not move at all.

    python benches/modeled_budget.py [--prompts FILE] [--sets mt_bench humaneval ...]
        [--curve 1:38.4,4:61.3,12:81,30:96.4,50:123,64:140] [--max-new-tokens 128] [--out DIR]
        [--drafter sam]      # a peer charged the same curve
    python benches/modeled_budget.py --tiny      # a tiny random model, synthetic prompts (CI)

The default curve is SmolLM2-135M-Instruct's on the 2-core x86 VM, float32, in ms.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

DEFAULT_CURVE = "1:38.4,4:61.3,12:81,30:96.4,50:123,64:140"
HOST_S = 0.00025  # the host time every step reports
BELOW = 0.97  # a request this much slower than plain decoding counts as slower


def parse_curve(text: str) -> tuple[list[int], list[float]]:
    """"1:38.4,4:61.3" -> ([1, 4], [38.4, 61.3]) (tokens, ms); points rising from 1 token."""
    try:
        pairs = [(int(n), float(ms)) for n, ms in (p.split(":") for p in text.split(","))]
    except ValueError as e:
        raise ValueError(f"--curve: expected 'tokens:ms,...' such as {DEFAULT_CURVE!r}, got {text!r}") from e
    points, ms = [n for n, _ in pairs], [m for _, m in pairs]
    if points[0] != 1 or points != sorted(set(points)) or min(ms) <= 0:
        raise ValueError(f"--curve: expected rising token counts from 1 and times > 0, got {text!r}")
    return points, ms


class _ModeledSession:
    """A session whose every pass reports the curve's time for its size."""

    def __init__(self, session: Any, cost) -> None:
        self._session, self._cost = session, cost

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)

    def observe_packed(self, packed, k, pass_s=None, host_s=None):
        selection = self._session.last_selection
        n = 1 if selection is None else selection[1] + 1
        return self._session.observe_packed(packed, k, None if pass_s is None else self._cost(n) / 1e3,
                                            None if host_s is None else HOST_S)


@contextmanager
def modeled(decoder, points: list[int], ms: list[float]):
    """Inside: `decoder` prices with the fixed curve (a peer's decoder, whose drafter does not
    size its trees to the hardware, keeps its own sizes), every decoder of the process is charged
    it for every pass (the hook is the class's), prefills do not correct the seeding share,
    and the measurement store is off, first use included (a modeled curve must never be kept
    as a measured one, and a stored share or curve would make runs differ)."""
    from recap.decoding import decoder as decoder_module
    from recap.verify import seeding

    def cost(n: int) -> float:
        return float(np.interp(n, points, ms))

    original, observe, store = decoder_module.decode, seeding.observe, os.environ.get("RECAP_CACHE")

    def decode(dec, req, sessions):  # the request loop (`recap.decoding.loop.decode`), on modeled sessions
        return original(dec, req, [_ModeledSession(session, cost) for session in sessions])

    os.environ["RECAP_CACHE"] = "0"
    try:
        if decoder._auto_budget:
            decoder.calibrate()  # first use, then the fixed curve replaces what it measured
            decoder._drafter.set_cost_points(points, [m / 1e3 for m in ms])
        else:  # a peer keeps its own tree sizes (a curve handed to its drafter would cut them)
            decoder._prepare(settle=True)
        decoder_module.decode, seeding.observe = decode, (lambda *a, **k: None)
        yield cost
    finally:
        decoder_module.decode, seeding.observe = original, observe
        if store is None:
            os.environ.pop("RECAP_CACHE", None)
        else:
            os.environ["RECAP_CACHE"] = store


def run(model, prompts: list[tuple[str, str, torch.Tensor]], points: list[int], ms: list[float],
        max_new: int, eos: int | None = None, progress: bool = True, drafter: str = "recap") -> list[dict]:
    """One modeled request per (set, id, input ids), in order, by one decoder of `drafter`
    (a peer's passes are charged the same curve, so RECAP and its peers compare without noise)."""
    from recap import Decoder, RecapConfig

    dec = Decoder(model, RecapConfig(budget="auto"), drafter=drafter)
    rows = []
    with modeled(dec, points, ms) as cost:
        for set_, pid, ids in prompts:
            t = time.perf_counter()
            dec.generate(ids, max_new_tokens=max_new, eos_token_id=eos)
            s = dec.last_stats
            assert s is not None
            plain = (s.new_tokens - 1) * cost(1)
            spent = sum(cost(n) for n in s.tree_sizes)
            rows.append(dict(set=set_, id=pid, drafter=drafter, speedup=plain / spent if spent else 1.0, tau=s.tau,
                             steps=s.steps,
                             tree_sizes=list(s.tree_sizes), nodes_per_step=s.mean_tree_size,
                             predicted=s.predicted_accepted, observed=s.observed_accepted,
                             wall_s=time.perf_counter() - t))
            if progress:
                r = rows[-1]
                print(f"{pid:40s} {r['speedup']:.3f}x  tau {r['tau']:.2f}  {r['nodes_per_step']:5.1f} nodes/step",
                      flush=True)
    return rows


def summary(rows: list[dict]) -> dict[str, dict]:
    """Per set and overall: geometric-mean speedup, the slowest request, and how many are
    slower than plain decoding by more than 3%."""
    out = {}
    for name in [*dict.fromkeys(r["set"] for r in rows), "all"]:
        v = [r["speedup"] for r in rows if name in ("all", r["set"])]
        out[name] = dict(prompts=len(v), geomean=math.exp(sum(map(math.log, v)) / len(v)), min=min(v),
                         slower=sum(x < BELOW for x in v))
    return out


def markdown(rows: list[dict], curve: str) -> str:
    lines = [f"modeled curve (tokens:ms) {curve}", "", "| prompt | speedup | tau | nodes/step |", "|---|---|---|---|"]
    lines += [f"| {r['id']} | {r['speedup']:.3f}x | {r['tau']:.2f} | {r['nodes_per_step']:.1f} |" for r in rows]
    lines += ["", "| set | prompts | geomean | min | slower than 0.97x |", "|---|---|---|---|---|"]
    lines += [f"| {k} | {v['prompts']} | {v['geomean']:.4f}x | {v['min']:.3f}x | {v['slower']} |"
              for k, v in summary(rows).items()]
    return "\n".join(lines) + "\n"


def tiny_prompts() -> tuple[Any, list[tuple[str, str, torch.Tensor]]]:
    """A tiny random Llama (float64) and prompts that repeat themselves, so drafts are offered
    and sometimes accepted."""
    import transformers

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)
    model = transformers.LlamaForCausalLM(cfg).to(torch.float64).eval()
    g = torch.Generator().manual_seed(1)
    prompts = []
    for i in range(4):
        motif = torch.randint(3, 128, (6 + 3 * i,), generator=g)
        prompts.append(("tiny", f"tiny/{i}", motif.repeat(4).unsqueeze(0)))
    return model, prompts


def shipped_prompts(path: str | None, sets: list[str] | None) -> tuple[Any, list[tuple[str, str, torch.Tensor]], int]:
    """SmolLM2-135M-Instruct and the first turns of the prompt file's text prompts."""
    from recap.tools.models import load_smollm2
    from recap.tools.prompts import load_prompts

    model, tok = load_smollm2()
    prompts = []
    for p in load_prompts(path, sets):
        if p.image is not None:
            continue
        ids = tok.apply_chat_template([{"role": "user", "content": p.turns[0]}], add_generation_prompt=True,
                                      return_tensors="pt", return_dict=True)["input_ids"]
        prompts.append((p.set, p.id, ids))
    return model, prompts, tok.eos_token_id


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", help="a prompt file (default: the shipped prompts)")
    ap.add_argument("--sets", nargs="*", help="only these sets")
    ap.add_argument("--curve", default=DEFAULT_CURVE, help="tokens:ms points of the modeled cost curve")
    ap.add_argument("--drafter", default="recap", help="the drafter to decode with (recap, sam, pld, suffix, ...)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--tiny", action="store_true", help="a tiny random model and synthetic prompts")
    ap.add_argument("--out", help="a folder for modeled_budget.json and .md")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    points, ms = parse_curve(args.curve)
    threads = torch.get_num_threads()
    torch.set_num_threads(min(2, threads))  # the default curve's thread count
    try:
        return _main(args, points, ms)
    finally:
        torch.set_num_threads(threads)


def _main(args: argparse.Namespace, points: list[int], ms: list[float]) -> int:
    if args.tiny:
        model, prompts = tiny_prompts()
        eos = None
        max_new = min(args.max_new_tokens, 32)
    else:
        model, prompts, eos = shipped_prompts(args.prompts, args.sets)
        max_new = args.max_new_tokens
    rows = run(model, prompts, points, ms, max_new, eos, progress=not args.quiet, drafter=args.drafter)
    text = markdown(rows, args.curve)
    print(text)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "modeled_budget.json").write_text(json.dumps(dict(curve=args.curve, rows=rows,
                                                                 summary=summary(rows)), indent=1))
        (out / "modeled_budget.md").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
