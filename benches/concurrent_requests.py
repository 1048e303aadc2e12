"""Four requests on one `recap.Decoder`: one after another against all at once on four
threads, on the embedded SmolLM2-135M-Instruct. Every output is checked against plain greedy.

    python benches/concurrent_requests.py [--requests 4] [--new-tokens 96] [--reps 3]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import recap
import torch
from recap.tools.models import load_smollm2
from recap.tools.prompts import load_prompts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=4)
    p.add_argument("--new-tokens", type=int, default=96)
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args(argv)
    model, tok = load_smollm2()
    ids = []
    for prompt in load_prompts(per_set=2)[: args.requests]:
        x = tok.apply_chat_template([{"role": "user", "content": prompt.turns[0]}], add_generation_prompt=True,
                                    return_tensors="pt")
        ids.append(x if isinstance(x, torch.Tensor) else x["input_ids"])
    dec = recap.Decoder(model)
    dec.generate(ids[0], max_new_tokens=8)  # first use (probe, layout, cost curve) out of the way
    kw = dict(max_new_tokens=args.new_tokens, eos_token_id=None)
    want = [model.generate(x, do_sample=False, pad_token_id=0, **kw) for x in ids]
    ratios = []
    for rep in range(args.reps):
        t = time.perf_counter()
        sequential = [dec.generate(x, **kw) for x in ids]
        t_seq = time.perf_counter() - t
        concurrent: list = [None] * len(ids)

        def work(i: int, out: list = concurrent) -> None:
            out[i] = dec.generate(ids[i], **kw)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(len(ids))]
        t = time.perf_counter()
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        t_con = time.perf_counter() - t
        if not all(torch.equal(a, b) for a, b in zip(sequential + concurrent, want + want, strict=True)):
            print("an output differs from greedy")
            return 1
        ratios.append(t_seq / t_con)
        print(f"rep {rep}: sequential {t_seq:.2f} s, concurrent {t_con:.2f} s, ratio {t_seq / t_con:.2f}")
    print(f"median ratio sequential / concurrent: {statistics.median(ratios):.2f} "
          f"({len(ids)} requests, {torch.get_num_threads()} torch threads)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
