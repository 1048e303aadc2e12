"""`recap bench`: every drafter behind the one verifier, same model, prompts and process.

Timing that survives a busy machine: each prompt runs in `rounds` short interleaved rounds;
in each round every drafter answers the prompt once, in an order rotated from round to
round and prompt to prompt, so a burst of load from another program lands on every drafter
alike rather than on whichever ran during it. A drafter's speedup is the median, over
prompts and rounds, of its paired ratio ar time / its time within the same round, reported
with the interquartile range of those ratios. The disturbance itself is measured: the spread
of ar's time per step across rounds, and runs whose process CPU time fell well below their
wall time (the CPUs were busy elsewhere); when either is large the table and the terminal say
the figures are unreliable, with the measured spread.

Before every round after the first, the persistent memories are restored to their state
before the prompt, so a repeated prompt never drafts from its own earlier answer (the
cross-request suffix trie of `suffix_x` cannot be restored and does). Across prompts every
drafter keeps its cross-request state, as in real use. Multi-turn prompts keep the
conversation: each drafter's own answers are fed back. Outputs are compared token for token
with `ar`'s.

Reported per data set and overall: tau (bonus included), the median paired speedup over `ar`
and its interquartile range, prefill milliseconds, milliseconds per decoding step (so that
speedup ~= tau x ar's step time / the drafter's step time), mean verified tree size, host
microseconds per step by phase, forward milliseconds per step, mismatching prompts and, over
those, the mean number of tokens that agreed before the first difference (the agreement
figure of reduced-precision runs). transformers' own prompt lookup
(`generate(prompt_lookup_num_tokens=10)`) runs alongside as an external anchor.

With `sampling` (e.g. do_sample=True, temperature=0.7), every drafter samples with the same
seed per prompt and turn, so each must still reproduce `ar`'s tokens exactly; the anchor
samples under the same settings with torch's generator seeded alike (its tokens differ:
it is compared on speed only).
"""

from __future__ import annotations

import json
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from recap.decoding.config import RecapConfig
from recap.decoding.decoder import Decoder
from recap.decoding.drafters import spec
from recap.decoding.stats import PHASES
from recap.tools.prompts import Prompt

ANCHOR = "hf_pld"
#: A run whose CPU time per wall second is below this share of the typical run's was disturbed.
LOW_CPU_SHARE = 0.75
#: ar's time per step varying more than this across a typical prompt's rounds makes the figures unreliable.
STEP_SPREAD_LIMIT = 0.15
#: So does more than this share of runs short of CPU.
DISTURBED_SHARE = 0.05
DEFAULT_DRAFTERS = ("ar", "recap", "recap_nosuffix", "tr", "tr_bf", "pld", "sam", "sam_tr", "suffix")
#: encode(messages, image path or None) -> input ids [1, L], or a dict of model inputs
#: (input_ids plus pixel_values and the like, as a processor returns them).
Encode = Callable[[list[dict], Any], Any]
Decode = Callable[[list[int]], str]


@dataclass(frozen=True)
class Entry:
    """One column of the comparison: a drafter name, optionally at a budget ("recap@16")."""

    label: str
    name: str
    budget: int | str | None

    @staticmethod
    def parse(text: str) -> Entry:
        name, _, budget = text.partition("@")
        if name == ANCHOR:
            return Entry(text, name, None)
        spec(name)  # raises with the list of names
        if not budget:
            return Entry(text, name, None)
        if budget == "auto":
            return Entry(text, name, "auto")
        if not budget.isdigit():
            raise ValueError(f"drafter budget: expected NAME@INT or NAME@auto, got {text!r}")
        return Entry(text, name, int(budget))


@dataclass
class Run:
    label: str
    set: str
    prompt: str
    turn: int
    prompt_tokens: int
    new_tokens: int
    steps: int
    total_s: float
    prefill_s: float
    tree_nodes: int
    #: budget="auto" only: expected vs observed accepted draft nodes over the call.
    predicted_accepted: float = 0.0
    observed_accepted: int = 0
    phase_s: dict[str, float] = field(default_factory=dict)
    #: budget="auto" only: the cost curve in use at the end of the call.
    cost: dict | None = None
    output: list[int] = field(default_factory=list)
    equal: bool | None = None
    #: Index of the first token that differs from ar's output for the same turn (None: equal,
    #: or not compared).
    first_diff: int | None = None
    #: The interleaved round the run belongs to, and the process CPU time it took.
    round: int = 0
    cpu_s: float = 0.0


class _ForwardCounter:
    """Counts forward calls of a model (the anchor's verification passes)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.calls = 0
        self._handle = model.register_forward_pre_hook(self._hook)

    def _hook(self, *_: Any) -> None:
        self.calls += 1

    def close(self) -> None:
        self._handle.remove()


class Bench:
    def __init__(self, model: Any, encode: Encode, entries: list[Entry], *,
                 budget: int | str = 32, max_new_tokens: int = 200, eos_token_id: int | None = None,
                 decode: Decode | None = None, sampling: dict | None = None, seed: int = 0, rounds: int = 1,
                 clock: Callable[[], float] = time.perf_counter,
                 cpu_clock: Callable[[], float] = time.process_time) -> None:
        if not isinstance(rounds, int) or rounds < 1:
            raise ValueError(f"rounds: expected an int >= 1, got {rounds!r}")
        self.rounds, self.clock, self.cpu_clock = rounds, clock, cpu_clock
        if not any(e.label == "ar" for e in entries):
            entries = [Entry("ar", "ar", None), *entries]
        self.model, self.encode, self.decode = model, encode, decode
        self.entries = entries
        self.max_new_tokens, self.eos = max_new_tokens, eos_token_id
        self.sampling, self.seed = dict(sampling or {}), seed
        self.decoders: dict[str, Decoder] = {}
        for e in entries:
            if e.name != ANCHOR:
                b = e.budget if e.budget is not None else budget
                self.decoders[e.label] = Decoder(model, RecapConfig(budget=b), drafter=e.name)
        self.runs: list[Run] = []
        self.first_use_s: dict[str, float] = {}
        self.layout_choice_s: dict[str, float] = {}

    def _generate(self, label: str, inputs: Any, max_new: int, seed: int = 0) -> tuple[list[int], dict]:
        inputs = dict(inputs) if not isinstance(inputs, torch.Tensor) else {"input_ids": inputs}
        ids = inputs.pop("input_ids")
        attn = inputs.pop("attention_mask", None)
        attn = torch.ones_like(ids) if attn is None else attn
        cpu = self.cpu_clock()
        if label in self.decoders:
            dec = self.decoders[label]
            t = self.clock()
            sampled = dict(self.sampling, seed=seed) if self.sampling else {}
            out = dec.generate(ids, attention_mask=attn, max_new_tokens=max_new, eos_token_id=self.eos, **sampled,
                               **inputs)
            total = self.clock() - t
            s = dec.last_stats
            assert s is not None  # set by the generate call just made on this thread
            info = dict(steps=s.steps, prefill_s=s.prefill_s, tree_nodes=sum(s.tree_sizes),
                        phase_s=dict(s.phase_s), total_s=total, predicted_accepted=s.predicted_accepted,
                        observed_accepted=s.observed_accepted, cost=s.cost)
        else:
            counter = _ForwardCounter(self.model)
            try:  # in the decoders' linear layout, so only the draft and verify logic differ
                t = self.clock()
                torch.manual_seed(seed)
                settings = self.sampling or {"do_sample": False}
                with self.decoders["ar"].verifying():
                    out = self.model.generate(ids, attention_mask=attn, max_new_tokens=max_new, eos_token_id=self.eos,
                                              prompt_lookup_num_tokens=10, **settings, **inputs)
                total = self.clock() - t
            finally:
                counter.close()
            info = dict(steps=max(counter.calls - 1, 0), prefill_s=0.0, tree_nodes=0, phase_s={}, total_s=total)
        info["cpu_s"] = self.cpu_clock() - cpu
        return out[0, ids.shape[1]:].tolist(), info

    def warm_up(self, tokens: int = 8, image: Any = None) -> None:
        """Each decoder's first use (conformance probe, cost curve: what its first request
        pays), then the linear-layout choice a first request defers to a later one, each timed
        on its own (`first_use_s`, `layout_choice_s`; what one model shares is paid by the
        first decoder), then a short generation per entry."""
        for label, dec in self.decoders.items():
            t = self.clock()
            dec._prepare()
            self.first_use_s[label] = self.clock() - t
            dec.linear_layout_used  # noqa: B018 (reading it makes the layout choice)
            self.layout_choice_s[label] = self.clock() - t - self.first_use_s[label]
        inputs = self.encode([{"role": "user", "content": "Say hello."}], image)
        for e in self.entries:
            self._generate(e.label, inputs, tokens)

    def run_prompt(self, index: int, prompt: Prompt) -> None:
        labels = [e.label for e in self.entries]
        with tempfile.TemporaryDirectory(prefix="recap-bench-") as tmp:
            before = self._snapshot(Path(tmp))
            for r in range(self.rounds):
                if r:
                    self._restore(before)
                shift = (index + r) % len(labels)
                for label in labels[shift:] + labels[:shift]:
                    self._answer(label, index, prompt, r)
        self.compare(prompt.id)

    def _snapshot(self, folder: Path) -> dict[str, Path]:
        """Each persistent memory's state before a prompt (only needed with several rounds)."""
        if self.rounds == 1:
            return {}
        saved: dict[str, Path] = {}
        for label, dec in self.decoders.items():
            if dec.memory is not None:
                saved[label] = folder / f"{len(saved)}.recapmem"
                dec.save_memory(saved[label])
        return saved

    def _restore(self, saved: dict[str, Path]) -> None:
        for label, path in saved.items():
            self.decoders[label].load_memory(path)

    def _answer(self, label: str, index: int, prompt: Prompt, round_: int) -> None:
        """One drafter's answer to every turn of `prompt`, in one round."""
        messages: list[dict] = []
        for turn, text in enumerate(prompt.turns):
            messages.append({"role": "user", "content": text})
            inputs = self.encode(messages, prompt.image)
            ids = inputs if isinstance(inputs, torch.Tensor) else inputs["input_ids"]
            seed = self.seed + 7919 * index + turn  # the same for every drafter
            output, info = self._generate(label, inputs, self.max_new_tokens, seed)
            self.runs.append(Run(label=label, set=prompt.set, prompt=prompt.id, turn=turn,
                                 prompt_tokens=ids.shape[1], new_tokens=len(output), output=output,
                                 round=round_, **info))
            answer = self.decode(output) if self.decode else ""
            messages.append({"role": "assistant", "content": answer})

    def compare(self, prompt_id: str) -> None:
        """Marks each run of the prompt equal or not to ar's output for the same turn, and
        where they first differ."""
        reference = {(r.turn, r.round): r.output for r in self.runs if r.prompt == prompt_id and r.label == "ar"}
        for r in self.runs:
            if r.prompt == prompt_id:
                sampled_anchor = self.sampling and r.label not in self.decoders
                want = reference.get((r.turn, r.round))
                r.equal = None if sampled_anchor else r.output == want
                r.first_diff = None if r.equal is not False else _first_diff(r.output, want or [])

    def run(self, prompts: list[Prompt], progress: bool = True, checkpoint: Path | None = None,
            meta: dict | None = None) -> None:
        """Runs every prompt; with `checkpoint`, the reports are rewritten there after each
        prompt, so an interrupted run keeps what it measured."""
        bar = _progress(len(prompts), progress)
        for i, p in enumerate(prompts):
            self.run_prompt(i, p)
            if checkpoint is not None:
                self.save(checkpoint, {**(meta or {}), "completed_prompts": i + 1}, plot=False)
            bar(i + 1, p.id)

    # ---- reporting --------------------------------------------------------------------
    def _paired_ratios(self, runs: list[Run], label: str) -> list[float]:
        """ar's time / `label`'s time, per (prompt, round): both answered the prompt within
        the same round, so a disturbance long enough to matter usually touches both."""
        wall: dict[tuple[str, int, str], float] = {}
        for r in runs:
            wall[(r.prompt, r.round, r.label)] = wall.get((r.prompt, r.round, r.label), 0.0) + r.total_s
        return [wall[(p, rd, "ar")] / t for (p, rd, lab), t in wall.items()
                if lab == label and t > 0 and (p, rd, "ar") in wall]

    def noise(self) -> dict[str, Any]:
        """How disturbed the run was: the spread of ar's time per decoding step across the
        rounds of each prompt and turn, as a share of its median (the typical and the largest
        over prompts), and the runs whose process CPU time per wall second fell below
        LOW_CPU_SHARE of that drafter's typical run (the machine's CPUs were busy elsewhere
        during them). The figures are unreliable when the typical spread exceeds
        STEP_SPREAD_LIMIT or more than DISTURBED_SHARE of the runs were short of CPU: the
        paired medians absorb a disturbance that touches a few rounds, not one that touches
        most."""
        step: dict[tuple[str, int], list[float]] = {}
        for r in self.runs:
            if r.label == "ar" and r.steps:
                step.setdefault((r.prompt, r.turn), []).append((r.total_s - r.prefill_s) / r.steps)
        spreads = [(max(v) - min(v)) / statistics.median(v) for v in step.values() if len(v) > 1]
        shares: dict[str, list[float]] = {}  # per drafter: host-heavy drafters use fewer threads
        for r in self.runs:
            if r.total_s > 0:
                shares.setdefault(r.label, []).append(r.cpu_s / r.total_s)
        typical = {label: statistics.median(v) for label, v in shares.items()}
        low = [r for r in self.runs if r.total_s > 0 and r.cpu_s / r.total_s < LOW_CPU_SHARE * typical[r.label]]
        typical_spread = statistics.median(spreads) if spreads else None
        unreliable = (len(low) > DISTURBED_SHARE * len(self.runs)
                      or (typical_spread is not None and typical_spread > STEP_SPREAD_LIMIT))
        return {"rounds": self.rounds, "ar_step_spread": typical_spread,
                "ar_step_spread_max": max(spreads) if spreads else None, "low_cpu_runs": len(low),
                "runs": len(self.runs), "unreliable": unreliable}

    def summary(self) -> dict[str, dict[str, dict[str, Any]]]:
        """summary[set or "overall"][label] = figures."""
        sets = sorted({r.set for r in self.runs}) + ["overall"]
        out: dict[str, dict[str, dict[str, Any]]] = {}
        for s in sets:
            rows = [r for r in self.runs if s == "overall" or r.set == s]
            out[s] = {}
            for e in self.entries:
                mine = [r for r in rows if r.label == e.label]
                if not mine:
                    continue
                steps = sum(r.steps for r in mine)
                new = sum(r.new_tokens for r in mine)
                total = sum(r.total_s for r in mine)
                prefill = sum(r.prefill_s for r in mine)
                ratios = sorted(self._paired_ratios(rows, e.label))
                phases = {p: sum(r.phase_s.get(p, 0.0) for r in mine) / max(steps, 1) for p in PHASES}
                out[s][e.label] = {
                    "tau": sum(r.new_tokens - 1 for r in mine) / max(steps, 1),
                    "tokens_per_s": new / total if total else 0.0,
                    "speedup": statistics.median(ratios) if ratios else 0.0,
                    "speedup_q1": _quantile(ratios, 0.25),
                    "speedup_q3": _quantile(ratios, 0.75),
                    "paired_ratios": len(ratios),
                    "prefill_ms": prefill / len(mine) * 1e3,
                    "step_ms": (total - prefill) / max(steps, 1) * 1e3,
                    "mean_tree": sum(r.tree_nodes for r in mine) / max(steps, 1),
                    "host_us": sum(v for p, v in phases.items() if p != "forward") * 1e6,
                    **{f"{p}_us": v * 1e6 for p, v in phases.items() if p != "forward"},
                    "forward_ms": phases["forward"] * 1e3,
                    "predicted_accepted": sum(r.predicted_accepted for r in mine) / max(steps, 1),
                    "observed_accepted": sum(r.observed_accepted for r in mine) / max(steps, 1),
                    "mismatches": len({r.prompt for r in mine if r.equal is False}),
                    "prompts": len({r.prompt for r in mine}),
                    "first_divergence": _mean_first_divergence(mine),
                }
        return out

    def per_prompt(self) -> dict[str, dict[str, dict[str, float]]]:
        """per_prompt[prompt id][label] = {"speedup": median paired ratio over its rounds, "tau"}
        for every drafter but ar (the reference)."""
        out: dict[str, dict[str, dict[str, float]]] = {}
        for pid in dict.fromkeys(r.prompt for r in self.runs):  # in run order
            rows = [r for r in self.runs if r.prompt == pid]
            out[pid] = {}
            for e in self.entries:
                mine = [r for r in rows if r.label == e.label]
                ratios = self._paired_ratios(rows, e.label)
                if mine and ratios and e.label != "ar":
                    steps = sum(r.steps for r in mine)
                    out[pid][e.label] = {"speedup": statistics.median(ratios),
                                         "tau": sum(r.new_tokens - 1 for r in mine) / max(steps, 1)}
        return out

    def per_prompt_markdown(self) -> str:
        """Each prompt's speedup (and tau) per drafter: where a drafter wins or loses."""
        labels = [e.label for e in self.entries if e.label != "ar"]
        lines = ["| prompt | " + " | ".join(f"{lab} speedup (tau)" for lab in labels) + " |",
                 "|---" * (len(labels) + 1) + "|"]
        for pid, by in self.per_prompt().items():
            cells = [f"{by[lab]['speedup']:.2f}x ({by[lab]['tau']:.2f})" if lab in by else "-" for lab in labels]
            lines.append(f"| {pid} | " + " | ".join(cells) + " |")
        return "\n".join(lines)

    def markdown(self) -> str:
        summ = self.summary()
        sets = list(summ)
        lines = ["| drafter | " + " | ".join(f"{s} tau / speedup" for s in sets)
                 + " | speedup IQR | prefill ms | step ms | tree | host us/step (draft, pack, update, kv) "
                 "| fwd ms/step | mismatches (first diff) |",
                 "|---" * (len(sets) + 9) + "|"]
        for e in self.entries:
            o = summ["overall"].get(e.label)
            if o is None:
                continue
            cells = []
            for s in sets:
                f = summ[s].get(e.label)
                cells.append(f"{f['tau']:.2f} / {f['speedup']:.2f}x" if f else "-")
            ours = e.label in self.decoders
            host = (f"{o['host_us']:.0f} ({o['draft_us']:.0f}, {o['pack_us']:.0f}, {o['update_us']:.0f}, "
                    f"{o['compact_us']:.0f})" if ours else "n/a")
            fwd = f"{o['forward_ms']:.1f}" if ours else "n/a"
            tree = f"{o['mean_tree']:.1f}" if ours else "n/a"
            iqr = f"{o['speedup_q1']:.2f}-{o['speedup_q3']:.2f}x"
            prefill = f"{o['prefill_ms']:.0f}" if ours else "n/a"
            div = o["first_divergence"]
            agree = f"{o['mismatches']}/{o['prompts']}" + (f" ({div:.0f})" if div is not None else "")
            lines.append(f"| {e.label} | " + " | ".join(cells) + f" | {iqr} | {prefill} | {o['step_ms']:.1f} | "
                         f"{tree} | {host} | {fwd} | {agree} |")
        lines += ["", self.noise_line(), "", "Per prompt (median paired speedup over ar, tau):", "",
                  self.per_prompt_markdown()]
        return "\n".join(lines)

    def noise_line(self) -> str:
        n = self.noise()
        spread = n["ar_step_spread"]
        measured = (f"ar's time per step varied by {spread:.0%} across rounds (typical prompt; "
                    f"{n['ar_step_spread_max']:.0%} at most)" if spread is not None
                    else "one round per prompt, so the spread across rounds is not measured")
        low = f"{n['low_cpu_runs']} of {n['runs']} runs got less CPU than their wall time"
        if n["unreliable"]:
            return (f"WARNING: these figures are unreliable: the machine was busy ({measured}; {low}). "
                    "Rerun on a quiet machine, or with more --rounds.")
        return f"Disturbance: {measured}; {low}."

    def verdict(self) -> str:
        """One line per RECAP entry a newcomer reads at a glance, then the noise line."""
        summ = self.summary()["overall"]
        lines = []
        for e in self.entries:
            f = summ.get(e.label)
            if f is None or e.label == "ar" or not e.name.startswith("recap"):
                continue
            word = "faster" if f["speedup"] >= 1.0 else "slower"
            factor = f["speedup"] if f["speedup"] >= 1.0 else 1.0 / max(f["speedup"], 1e-9)
            same = f["prompts"] - f["mismatches"]
            first = self.first_use_s.get(e.label)
            speeds = {pid: by[e.label]["speedup"] for pid, by in self.per_prompt().items() if e.label in by}
            slowest = min(speeds, key=lambda k: speeds[k]) if speeds else None
            lines.append(f"{e.label}: {factor:.2f}x {word} than greedy (interquartile "
                         f"{f['speedup_q1']:.2f}-{f['speedup_q3']:.2f}x over {f['prompts']} prompts x "
                         f"{self.rounds} rounds), outputs identical on {same}/{f['prompts']}"
                         + (f"; slowest prompt {speeds[slowest]:.2f}x ({slowest})" if slowest is not None else "")
                         + (f"; first use {first:.1f} s" if first is not None else "")
                         + (f" (+{self.layout_choice_s[e.label]:.1f} s layout choice, at the second request)"
                            if self.layout_choice_s.get(e.label, 0.0) >= 0.05 else ""))
        return "\n".join(lines + [self.noise_line()])

    def save(self, folder: Path, meta: dict, plot: bool = True) -> list[Path]:
        folder.mkdir(parents=True, exist_ok=True)
        written = []
        data = {"meta": meta, "summary": self.summary(), "noise": self.noise(), "verdict": self.verdict(),
                "first_use_s": self.first_use_s, "layout_choice_s": self.layout_choice_s,
                "per_prompt": self.per_prompt(),
                "runs": [asdict(r) for r in self.runs]}
        (folder / "bench.json").write_text(json.dumps(data, indent=1))
        (folder / "bench.md").write_text(self.markdown() + "\n")
        written += [folder / "bench.json", folder / "bench.md"]
        png = folder / "bench.png"
        if plot and _plot(self.summary(), [e.label for e in self.entries], png):
            written.append(png)
        return written


def _quantile(values: list[float], q: float) -> float:
    """The q-quantile of sorted `values` (linear interpolation; 0.0 when empty)."""
    if not values:
        return 0.0
    pos = q * (len(values) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (pos - lo)


def _first_diff(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def _mean_first_divergence(runs: list[Run]) -> float | None:
    """Mean, over the prompts that differ from ar, of how many tokens matched before the first
    difference (turns in order; a prompt's equal turns count whole)."""
    by_prompt: dict[str, list[Run]] = {}
    for r in runs:
        by_prompt.setdefault(r.prompt, []).append(r)
    positions = []
    for turns in by_prompt.values():
        turns.sort(key=lambda r: r.turn)
        if any(r.equal is False for r in turns):
            before = 0
            for r in turns:
                if r.equal is False:
                    positions.append(before + (r.first_diff or 0))
                    break
                before += r.new_tokens
    return sum(positions) / len(positions) if positions else None


def _plot(summary: dict, labels: list[str], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no PNG written (pip install matplotlib)", file=sys.stderr)
        return False
    sets = list(summary)
    fig, axes = plt.subplots(1, 2, figsize=(max(8, 1.6 * len(sets) * 2), 4.5))
    width = 0.8 / max(len(labels), 1)
    for ax, key, title in [(axes[0], "speedup", "speedup over ar"), (axes[1], "tau", "tau (tokens per forward)")]:
        for i, label in enumerate(labels):
            vals = [summary[s].get(label, {}).get(key, 0.0) for s in sets]
            ax.bar([x + i * width for x in range(len(sets))], vals, width, label=label)
        ax.set_xticks([x + width * (len(labels) - 1) / 2 for x in range(len(sets))], sets)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_title(title)
    axes[1].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def _progress(total: int, enabled: bool) -> Callable[[int, str], None]:
    start = time.perf_counter()

    def update(done: int, what: str) -> None:
        if not enabled:
            return
        filled = int(30 * done / max(total, 1))
        elapsed = time.perf_counter() - start
        eta = elapsed / done * (total - done) if done else 0.0
        sys.stderr.write(f"\r[{'#' * filled}{'.' * (30 - filled)}] {done}/{total} {what[:30]:<30} "
                         f"{elapsed:5.0f} s, ~{eta:.0f} s left")
        if done == total:
            sys.stderr.write("\n")
        sys.stderr.flush()

    return update


def source_commit() -> str | None:
    """The commit of the checkout this package runs from (None for an installed wheel), with
    '+changes' when the working tree differs from it."""
    import subprocess

    root = Path(__file__).resolve().parents[3]
    if not (root / ".git").exists():
        return None
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return commit + ("+changes" if dirty else "")


def page(title: str, command: str, meta: dict, bench: Bench) -> str:
    """A results page for docs/: what produced it (command, commit, machine, date), the
    verdict and the table, as the run measured them."""
    m = meta.get("machine", {})
    when = time.strftime("%Y-%m-%d", time.gmtime())
    return "\n".join([
        f"# {title}", "",
        f"Written by `{command}` on {when}, from commit `{meta.get('commit') or 'unknown'}`, on "
        f"{m.get('processor', '?')} ({m.get('platform', '?')}), {m.get('threads', '?')} threads, torch "
        f"{m.get('torch', '?')}, transformers {m.get('transformers', '?')}; model {meta.get('model', '?')}, "
        f"{meta.get('prompts', '?')} prompts, {meta.get('max_new_tokens', '?')} new tokens, "
        f"{meta.get('rounds', 1)} interleaved rounds per prompt.", "",
        "Cells are tau / speedup over `ar` (the median of per-round paired ratios; its interquartile range in "
        "the next column); prefill and step times are per request and per decoding step, wall clock; tree is "
        "the mean number of verified nodes per step, root included.", "",
        "```", bench.verdict(), "```", "",
        bench.markdown(), ""])


def machine() -> dict:
    import transformers

    return {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "torch": torch.__version__, "transformers": transformers.__version__,
            "threads": torch.get_num_threads(), "python": platform.python_version()}
