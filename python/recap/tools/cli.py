"""Command line: `recap demo` runs RECAP against plain greedy on the embedded SmolLM2-135M-Instruct."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from typing import Any


def _encode(tok, messages):
    import torch

    ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt")
    if not isinstance(ids, torch.Tensor):
        ids = ids["input_ids"]
    return ids


def demo(args: argparse.Namespace) -> int:
    import torch

    import recap
    from recap.tools.models import load_smollm2
    from recap.tools.prompts import load_prompts

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


DTYPES = ("float32", "float64", "bfloat16", "float16")


def _load_local(path: str, dtype: str = "float32"):
    """(model, tokenizer, encode, is_vision) of a local model folder or GGUF file. Vision-language
    models get their processor; an image prompt's image goes first in the user turn."""
    import torch
    from transformers import AutoConfig

    if path.lower().endswith(".gguf"):
        from pathlib import Path

        from transformers import AutoModelForCausalLM, AutoTokenizer

        file = Path(path)
        if not file.is_file():
            raise FileNotFoundError(f"--model: expected a GGUF file or a model folder, got {path!r} (no such file)")
        tok = AutoTokenizer.from_pretrained(str(file.parent), gguf_file=file.name)
        model = AutoModelForCausalLM.from_pretrained(str(file.parent), gguf_file=file.name,
                                                     dtype=getattr(torch, dtype)).eval()
        return model, tok, lambda messages, image: _encode(tok, messages), False

    from recap.adapters import is_vision_language

    if is_vision_language(AutoConfig.from_pretrained(path)):
        from PIL import Image
        from transformers import AutoModelForImageTextToText, AutoProcessor

        proc = AutoProcessor.from_pretrained(path)
        model = AutoModelForImageTextToText.from_pretrained(path, dtype=getattr(torch, dtype)).eval()

        def encode(messages, image):
            turns = []
            for i, m in enumerate(messages):
                content = [{"type": "text", "text": m["content"]}]
                if i == 0 and image is not None:
                    content.insert(0, {"type": "image", "image": Image.open(image).convert("RGB")})
                turns.append({"role": m["role"], "content": content})
            return proc.apply_chat_template(turns, add_generation_prompt=True, tokenize=True,
                                            return_dict=True, return_tensors="pt")

        return model, proc.tokenizer, encode, True
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).eval()
    return model, tok, lambda messages, image: _encode(tok, messages), False


def _positive(text: str) -> int:
    """An argparse type: an int >= 1."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an int >= 1, got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected an int >= 1, got {n}")
    return n


def argv_of(args: argparse.Namespace) -> list[str]:
    """The command line this run was given (as parsed), for the record."""
    return list(getattr(args, "argv", None) or sys.argv[1:])


def _interleaved(prompts: list) -> list:
    """Prompts with the sets taken in turn (a batch cut from the front mixes them)."""
    by_set: dict[str, list] = {}
    for p in prompts:
        by_set.setdefault(p.set, []).append(p)
    out, queues = [], list(by_set.values())
    while any(queues):
        for q in queues:
            if q:
                out.append(q.pop(0))
    return out


def batch_bench(args: argparse.Namespace, model, tok, encode, model_name: str, prompts: list) -> int:
    """`recap bench --batch B ...`: batched RECAP@auto against batched greedy (see recap.tools.batch_bench)."""
    from pathlib import Path

    from recap.tools.batch_bench import BatchBench
    from recap.tools.bench import machine, source_commit

    rows = [encode([{"role": "user", "content": p.turns[0]}], None) for p in _interleaved(prompts)]
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    b = BatchBench(model, [r["input_ids"] if isinstance(r, dict) else r for r in rows], pad_id=int(pad),
                   eos={int(tok.eos_token_id)}, max_new_tokens=args.max_new_tokens, rounds=args.rounds)
    say = (lambda s: None) if args.quiet else (lambda s: print(s, flush=True))
    print(f"{len(rows)} prompts, batch sizes {args.batch}, {args.max_new_tokens} new tokens, {args.rounds} rounds")
    b.warm_up()
    b.run(args.batch, progress=say)
    if args.references:
        b.run_references(progress=say)
    m = machine()
    head = (f"`recap bench {' '.join(argv_of(args))}` on {time.strftime('%Y-%m-%d', time.gmtime())}, commit "
            f"`{source_commit() or 'unknown'}`, {m['processor']} ({m['platform']}), {m['threads']} threads, "
            f"torch {m['torch']}, transformers {m['transformers']}; {model_name}, {len(rows)} prompts.")
    report = "\n".join([head, "", "```", b.verdict(), "```", "", b.markdown(), ""])
    print()
    print(report)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "batch.md").write_text(report)
    written = [out / "batch.md"]
    if args.page:
        Path(args.page).parent.mkdir(parents=True, exist_ok=True)
        Path(args.page).write_text(f"# {args.page_title or 'Batched decoding'}\n\nWritten by {report}")
        written.append(Path(args.page))
    print("wrote " + ", ".join(str(p) for p in written))
    bad = sum(rows - eq for eq, rows in b.equal.values())
    if bad and args.dtype == "float32":
        print(f"{bad} row(s) differ from batched greedy (float32 rounding of tree passes can flip near-ties)")
    return 0


def bench_entries(drafters: list[str], anchor: bool) -> list[Any]:
    """The bench's columns: each drafter named once, in order, then the anchor (transformers'
    prompt lookup) unless named already. A drafter named twice would run twice under one
    label, and its rounds would be paired with the wrong runs."""
    from recap.tools.bench import ANCHOR, Entry

    entries: dict[str, Any] = {}
    for text in [*drafters, *([ANCHOR] if anchor else [])]:
        entry = Entry.parse(text)
        entries.setdefault(entry.label, entry)
    return list(entries.values())


def bench(args: argparse.Namespace) -> int:
    from pathlib import Path

    import torch

    from recap.tools.bench import Bench, machine, page, source_commit
    from recap.tools.prompts import load_prompts

    entries = bench_entries(args.drafters, args.anchor)
    t0 = time.perf_counter()
    vision = False
    if args.model is None:
        from recap.tools.models import load_smollm2

        model, tok = load_smollm2(threads=args.threads, dtype=getattr(torch, args.dtype))
        model_name = f"SmolLM2-135M-Instruct ({args.dtype})"
        encode = lambda messages, image: _encode(tok, messages)  # noqa: E731
    else:
        if args.threads:
            torch.set_num_threads(args.threads)
        model, tok, encode, vision = _load_local(args.model, args.dtype)
        model_name = f"{args.model} ({args.dtype})"
    print(f"loaded {model_name} ({torch.get_num_threads()} threads) in {time.perf_counter() - t0:.1f} s")
    prompts = load_prompts(args.prompts, sets=args.sets, per_set=args.per_set, images=vision, skip=args.skip)
    if args.turns is not None:
        prompts = [dataclasses.replace(p, turns=p.turns[:args.turns]) for p in prompts]
    if not prompts:
        print(f"no prompts selected (sets {args.sets}); image prompts need a vision-language model", file=sys.stderr)
        return 2
    if args.batch:
        return batch_bench(args, model, tok, encode, model_name, prompts)
    sampling = None
    if args.do_sample:
        sampling = {"do_sample": True, **{k: v for k, v in [("temperature", args.temperature), ("top_p", args.top_p),
                                                             ("top_k", args.top_k)] if v is not None}}
    b = Bench(model, encode, entries, budget=args.budget, max_new_tokens=args.max_new_tokens,
              eos_token_id=tok.eos_token_id, decode=lambda ids: tok.decode(ids, skip_special_tokens=True),
              sampling=sampling, seed=args.seed, rounds=args.rounds)
    print(f"{len(prompts)} prompts ({', '.join(sorted({p.set for p in prompts}))}), drafters "
          f"{', '.join(e.label for e in b.entries)}, budget {args.budget}, {args.max_new_tokens} new tokens, "
          f"{args.rounds} interleaved round(s) per prompt")
    if args.memory:  # a warm start: every decoder with a persistent memory begins from the snapshot
        for dec in b.decoders.values():
            if dec.memory is not None:
                dec.load_memory(args.memory)
        rows = {label: len(d.memory) for label, d in b.decoders.items() if d.memory is not None}
        print(f"memory: started from {args.memory} ({rows} rows)")
    b.warm_up(image=next((p.image for p in prompts if p.image is not None), None))
    meta = {"model": model_name, "dtype": args.dtype, "memory": args.memory, "skip": args.skip,
            "budget": args.budget, "max_new_tokens": args.max_new_tokens, "rounds": args.rounds,
            "sampling": sampling,
            "seed": args.seed,
            "prompts": len(prompts), "linear_layout": b.decoders["ar"].linear_layout_used, "machine": machine(),
            "commit": source_commit(), "command": "recap bench " + " ".join(argv_of(args))}
    print(f"linear layout: {meta['linear_layout']}")
    b.run(prompts, progress=not args.quiet, checkpoint=Path(args.out), meta=meta)
    print()
    print(b.verdict())
    print()
    print(b.markdown())
    written = b.save(Path(args.out), meta)
    if args.page:
        Path(args.page).parent.mkdir(parents=True, exist_ok=True)
        Path(args.page).write_text(page(args.page_title or "Benchmark", meta["command"], meta, b))
        written.append(Path(args.page))
    if args.save_memory:
        keeper = next((d for label, d in b.decoders.items() if label.startswith("recap") and d.memory is not None),
                      None)
        if keeper is None:
            print("--save-memory: no recap drafter in this run", file=sys.stderr)
        else:
            keeper.save_memory(args.save_memory)
            written.append(Path(args.save_memory))
    print("\nwrote " + ", ".join(str(p) for p in written))
    bad = sum(f["mismatches"] for label, f in b.summary()["overall"].items() if label in b.decoders)
    if bad and args.dtype in ("bfloat16", "float16"):
        # Expected: a tree pass rounds differently from one-token passes and near-ties flip.
        print(f"{bad} prompt(s) differ from ar's output in {args.dtype} (the agreement figures above)")
        return 0
    if bad:
        print(f"{bad} prompt(s) differ from ar's output", file=sys.stderr)
    return 1 if bad else 0


def serve(args: argparse.Namespace) -> int:
    """`recap serve`: the OpenAI API over a RECAP decoder (recap.serve; docs/serve.md)."""
    try:
        from recap import serve as server
    except ModuleNotFoundError as e:
        print(f"recap serve needs the serve extra (pip install 'recap-rs[serve]'): {e}", file=sys.stderr)
        return 2
    import torch

    from recap.decoding import drafters

    t0 = time.perf_counter()
    try:
        drafters.spec(args.drafter)
    except ValueError as e:
        print(f"--drafter: {e}", file=sys.stderr)
        return 2
    try:
        keys = server.read_keys(args.api_key, args.keys_file)
    except (OSError, ValueError) as e:
        print(f"--keys-file: {e}", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.model is None:
        from recap.tools.models import load_smollm2

        model, tok = load_smollm2(dtype=getattr(torch, args.dtype))
        name = "SmolLM2-135M-Instruct"
    else:
        model, tok, _encode_fn, vision = _load_local(args.model, args.dtype)
        if vision:
            print("--model: recap serve answers text prompts; a vision-language model is not served yet",
                  file=sys.stderr)
            return 2
        name = args.served_name or args.model.rstrip("/").rsplit("/", 1)[-1]
    return server.run(model, tok, args.served_name or name, host=args.host, port=args.port, drafter=args.drafter,
                      keys=keys, max_running=args.max_running, max_queue=args.max_queue,
                      max_tokens=args.max_tokens, grace_s=args.grace, started=t0)


def cache(args: argparse.Namespace) -> int:
    from recap.state import measurements

    where = measurements.folder()
    if args.clear:
        print(f"removed {measurements.clear()} measurement(s) from {where}")
        return 0
    state = "on" if measurements.enabled() else "off (RECAP_CACHE=0)"
    entries = sorted(where.glob("*.json")) if where.is_dir() else []
    print(f"{where}: {len(entries)} measurement(s), store {state}")
    for e in entries:
        print(f"  {e.name}  {e.stat().st_size} bytes")
    return 0


def catchup_bench(args: argparse.Namespace) -> int:
    """Routing modes and budgets side by side (see recap.catchup.bench)."""
    import json
    from pathlib import Path

    import torch

    from recap.catchup import bench as cb
    from recap.tools.bench import machine

    if args.threads:
        torch.set_num_threads(args.threads)
    cases = [cb.Case(m, b) for b in args.budgets for m in args.modes]
    answer = None
    if args.model is None:
        model = cb.tiny_llava()
        images = sorted((Path(__file__).parents[1] / "data" / "images").glob("*.png"))[: args.limit]
        prompts = [{"inputs": cb.tiny_inputs(model, img, [17 + i, 40, 23, 88, 2])} for i, img in enumerate(images)]
        name = "tiny random LLaVA-1.5-shaped model (32 layers, hidden 256, 576 visual tokens)"
    else:
        from recap.adapters.registry import routed_families

        model, tok, encode, vision = _load_local(args.model)
        if not vision:
            print(f"--model: expected a vision-language model ({', '.join(routed_families())})", file=sys.stderr)
            return 2
        shipped = Path(__file__).parents[1] / "data" / "easy_vqa_questions.jsonl"
        qfile = Path(args.questions) if args.questions else shipped
        rows = [json.loads(line) for line in qfile.read_text().splitlines() if line.strip()][: args.limit]
        prompts = []
        for q in rows:
            enc = encode([{"role": "user", "content": q["question"]}], str(qfile.parent / q["image"]))
            prompts.append({"inputs": dict(enc), "answer": q["answer"]})
        name = args.model

        def answer(p):
            n = p["inputs"]["input_ids"].shape[1]
            with torch.no_grad():
                out = model.generate(**p["inputs"], do_sample=False, max_new_tokens=args.max_new_tokens)
            return tok.decode(out[0, n:], skip_special_tokens=True)

    print(f"{name}: {len(prompts)} prompts, {len(cases) + 1} routing cases, {args.reps} timing repetitions, "
          f"{torch.get_num_threads()} threads")
    table = cb.summary(cb.run(model, prompts, cases, reps=args.reps, answer=answer, progress=not args.quiet))
    print(cb.markdown(table))
    written = cb.save(Path(args.out), table, {"model": name, "prompts": len(prompts), "reps": args.reps,
                                              "machine": machine()})
    print("\nwrote " + ", ".join(str(p) for p in written))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="recap", description="RECAP speculative decoding")
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="RECAP vs plain greedy on the embedded SmolLM2-135M-Instruct")
    d.add_argument("--max-new-tokens", type=int, default=128)
    d.add_argument("--budget", type=int, default=16, help="tree nodes per step (root not counted)")
    d.add_argument("--per-set", type=int, default=1, help="prompts per data set")
    d.add_argument("--sets", nargs="*", default=None, help="mt_bench humaneval summarisation copy")
    d.add_argument("--threads", type=int, default=None)
    from recap.tools.bench import DEFAULT_DRAFTERS

    b = sub.add_parser("bench", help="every drafter behind one verifier, side by side",
                       description="Runs the chosen drafters on the same prompts in one process and "
                       "reports tau, speedup over ar, tree size and host time per step.")
    b.add_argument("--drafters", nargs="+", default=list(DEFAULT_DRAFTERS),
                   help="names from recap.DRAFTERS, optionally NAME@BUDGET (e.g. recap@16); ar is always added")
    b.add_argument("--budget", default=32, type=lambda v: v if v == "auto" else int(v),
                   help="tree nodes per step for RECAP and best-first drafters (default 32)")
    b.add_argument("--max-new-tokens", type=int, default=200)
    b.add_argument("--sets", nargs="*", default=None, help="mt_bench humaneval summarisation copy (default: all)")
    b.add_argument("--per-set", type=int, default=None, help="prompts per data set (default: all)")
    b.add_argument("--prompts", default=None, help="a JSONL of {set, id, turns} (default: the shipped set)")
    b.add_argument("--model", default=None,
                   help="a local transformers model folder or GGUF file (default: the embedded SmolLM2-135M)")
    b.add_argument("--page", default=None,
                   help="also write a results page (Markdown: the command, commit, machine, verdict and table) here")
    b.add_argument("--page-title", default=None, help="the page's title")
    b.add_argument("--rounds", type=int, default=3,
                   help="interleaved timing rounds per prompt (default 3; speedups are medians of paired ratios)")
    b.add_argument("--threads", type=int, default=None)
    b.add_argument("--batch", type=int, nargs="+", default=None, metavar="B",
                   help="batch sizes: batched RECAP@auto against batched greedy generate at each (tokens per "
                        "second over all rows), instead of the per-drafter table")
    b.add_argument("--no-references", dest="references", action="store_false",
                   help="with --batch: skip the batch-1 RECAP, prompt lookup and greedy reference runs")
    b.add_argument("--skip", type=int, default=0, help="skip the first N prompts of each data set")
    b.add_argument("--turns", type=_positive, default=None,
                   help="answer at most the first N turns of each prompt (default: all)")
    b.add_argument("--memory", default=None,
                   help="start every persistent memory from this snapshot (made with --save-memory)")
    b.add_argument("--save-memory", default=None, help="write the recap drafter's memory here after the run")
    b.add_argument("--dtype", choices=DTYPES, default="float32",
                   help="model dtype; in bfloat16/float16 the table's last column is the agreement with ar")
    b.add_argument("--out", default="bench-out", help="folder for bench.json, bench.md and bench.png")
    b.add_argument("--no-anchor", dest="anchor", action="store_false",
                   help="skip transformers' prompt lookup anchor")
    b.add_argument("--quiet", action="store_true", help="no progress bar")
    b.add_argument("--do-sample", action="store_true", help="sample instead of greedy decoding (same seed per "
                   "prompt for every drafter, so each must reproduce ar's tokens)")
    b.add_argument("--temperature", type=float, default=None)
    b.add_argument("--top-p", type=float, default=None)
    b.add_argument("--top-k", type=int, default=None)
    b.add_argument("--seed", type=int, default=0, help="base seed of the sampled runs")
    c = sub.add_parser("catchup", help="visual-token routing modes and budgets side by side",
                       description="KV cache, prefill FLOPs and prefill time of every routing mode at each "
                       "budget against dense, on a tiny random LLaVA-shaped model or, with --model and "
                       "--questions, a real vision-language model (then also accuracy and agreement with dense).")
    c.add_argument("--budgets", nargs="+", type=int, default=[64, 128, 192],
                   help="average visual tokens per layer (default 64 128 192)")
    c.add_argument("--modes", nargs="+", default=["fastv", "pyramiddrop", "reroute", "catchup"],
                   choices=["fastv", "pyramiddrop", "reroute", "catchup"])
    c.add_argument("--model", default=None, help="a local LLaVA / LLaVA-NeXT / Qwen2.5-VL folder")
    c.add_argument("--questions", default=None,
                   help="with --model: a JSONL of {question, answer, image}, image paths relative to the file "
                   "(default: the 61 shipped easy-VQA questions)")
    c.add_argument("--limit", type=int, default=None, help="at most this many prompts")
    c.add_argument("--max-new-tokens", type=int, default=16, help="answer length with --model")
    c.add_argument("--reps", type=int, default=5, help="timed prefills per case and prompt (at least 1)")
    c.add_argument("--threads", type=int, default=None)
    c.add_argument("--out", default="catchup-out", help="folder for catchup.json and catchup.md")
    c.add_argument("--quiet", action="store_true")
    s = sub.add_parser("serve", help="an OpenAI-compatible server (chat and text completions, streaming)",
                       description="Serves /v1/chat/completions, /v1/completions, /v1/models, /health and "
                       "/metrics with RECAP drafting; greedy answers equal the model's greedy output.")
    s.add_argument("--model", default=None,
                   help="a local transformers model folder or GGUF file (default: the embedded SmolLM2-135M)")
    s.add_argument("--served-name", default=None, help="the model id clients name (default: from --model)")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--api-key", default=None, help="require this key (Authorization: Bearer KEY)")
    s.add_argument("--keys-file", default=None,
                   help="one 'KEY [SCOPE]' per line: each key's requests draft from their own memory scope")
    s.add_argument("--max-running", type=_positive, default=4, help="requests decoding at once (default 4)")
    s.add_argument("--max-queue", type=int, default=64, help="admitted requests waiting beyond those; more get 429")
    s.add_argument("--max-tokens", type=_positive, default=2048, help="the largest max_tokens a request may ask")
    s.add_argument("--drafter", default="recap", help="a name from recap.DRAFTERS (ar: drafting off)")
    s.add_argument("--dtype", choices=DTYPES, default="float32")
    s.add_argument("--threads", type=int, default=None)
    s.add_argument("--grace", type=float, default=30.0,
                   help="seconds running requests get to finish after SIGTERM before they are cancelled")
    k = sub.add_parser("cache", help="the first-use measurements kept across processes (recap.state.measurements)",
                       description="Lists (or with --clear removes) the stored cost curves and linear-layout "
                                   "choices; RECAP_CACHE=0 turns the store off, RECAP_CACHE_DIR moves it.")
    k.add_argument("--clear", action="store_true", help="remove every stored measurement")
    args = parser.parse_args(argv)
    args.argv = (argv if argv is not None else sys.argv[1:])[1:]  # without the subcommand
    if args.command == "cache":
        return cache(args)
    if args.command == "demo":
        return demo(args)
    if args.command == "bench":
        return bench(args)
    if args.command == "catchup":
        return catchup_bench(args)
    if args.command == "serve":
        return serve(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
