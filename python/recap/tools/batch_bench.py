"""`recap bench --batch B ...`: throughput of batched decoding, RECAP against batched greedy.

For each batch size B the prompts (first turns, the sets interleaved so every batch mixes
them) are cut into full batches of B, left-padded as a tokenizer with padding_side="left"
does. Each batch runs under batched greedy `model.generate` and under RECAP's batched
`Decoder.generate` (budget="auto"), alternating which goes first, for `rounds` rounds. A
figure is committed tokens per second over all rows (a row's tokens end at its EOS);
the speedup is the median over rounds of RECAP's throughput over greedy's in the same round,
with its interquartile range. Batch-1 RECAP@auto, batch-1 prompt lookup and batch-1 greedy
run once over the same prompts as references. Memory: the KV cache each method holds at its
largest (greedy's grows to B x the padded sequence; RECAP's is allocated once for the
longest row, its tree and the new tokens), and on CUDA the peak of allocated tensors above
the starting level.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from recap.decoding.config import RecapConfig
from recap.decoding.decoder import Decoder

TARGETS = {4: 1.25, 8: 1.15}  # RECAP@auto over batched greedy at these batch sizes
FLOOR = 0.97  # never below this at any batch size


class PeakMemory:
    """On CUDA, the most tensor memory allocated above the starting level while the block
    runs (bytes); elsewhere None (a CPU allocator keeps no such count)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.peak: int | None = None

    def __enter__(self) -> PeakMemory:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self._base = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        return self

    def __exit__(self, *_exc: object) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak = torch.cuda.max_memory_allocated(self.device) - self._base


def kv_bytes_per_token(model: Any) -> int:
    """Key and value bytes one token holds in every layer's cache."""
    cfg = model.config.get_text_config(decoder=True) if hasattr(model.config, "get_text_config") else model.config
    heads = int(getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads)
    head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
    elem = next(model.parameters()).element_size()
    return 2 * int(cfg.num_hidden_layers) * heads * head_dim * elem


def left_pad(rows: list[torch.Tensor], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[1, L_i] prompts as one [B, max L] batch padded on the left, and its attention mask."""
    width = max(r.shape[-1] for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, width - r.shape[-1]:] = r.reshape(-1)
        mask[i, width - r.shape[-1]:] = 1
    return ids, mask


def new_tokens(row: list[int], eos: set[int]) -> int:
    """A row's committed tokens: up to and including its first EOS."""
    for i, t in enumerate(row):
        if t in eos:
            return i + 1
    return len(row)


@dataclass
class Cell:
    """One method at one batch size: per round, tokens and seconds over all its batches."""

    tokens: list[int] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    peak: int | None = None  # CUDA: allocated above the start
    kv: int = 0  # KV cache bytes at the largest

    def rate(self, r: int) -> float:
        return self.tokens[r] / self.seconds[r] if self.seconds[r] > 0 else 0.0

    @property
    def median_rate(self) -> float:
        return statistics.median(self.rate(r) for r in range(len(self.seconds)))


def _quantiles(values: list[float]) -> tuple[float, float, float]:
    if len(values) == 1:
        return values[0], values[0], values[0]
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], statistics.median(values), q[2]


class BatchBench:
    def __init__(self, model: Any, prompts: list[torch.Tensor], *, pad_id: int, eos: set[int],
                 max_new_tokens: int = 128, rounds: int = 3, clock: Callable[[], float] = time.perf_counter) -> None:
        if rounds < 1:
            raise ValueError(f"rounds: expected an int >= 1, got {rounds!r}")
        self.model, self.prompts = model, prompts
        self.pad_id, self.eos, self.max_new, self.rounds, self.clock = pad_id, eos, max_new_tokens, rounds, clock
        self.recap = Decoder(model, RecapConfig(budget="auto"))
        self.device = next(model.parameters()).device
        self.kv_token = kv_bytes_per_token(model)
        self.cells: dict[tuple[int, str], Cell] = {}
        self.equal: dict[int, tuple[int, int]] = {}  # B -> (rows equal to batched greedy, rows)
        self.tau: dict[int, float] = {}
        self.prefill: dict[int, tuple[float, float]] = {}  # B -> (greedy's, RECAP's) prefill seconds, round 1
        self.reference: dict[str, float] = {}  # batch-1 method -> tokens per second

    # ---- the runs ---------------------------------------------------------------------------
    def _greedy(self, ids: torch.Tensor, mask: torch.Tensor, **extra: Any) -> torch.Tensor:
        kw = dict(do_sample=False, max_new_tokens=self.max_new, eos_token_id=sorted(self.eos), pad_token_id=self.pad_id)
        with self.recap.verifying():  # the same linear layout as RECAP's passes
            return self.model.generate(input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
                                       **{**kw, **extra})

    def _recap(self, ids: torch.Tensor, mask: torch.Tensor, **_extra: Any) -> torch.Tensor:
        return self.recap.generate(ids.to(self.device), attention_mask=mask.to(self.device),
                                   max_new_tokens=self.max_new, eos_token_id=sorted(self.eos),
                                   pad_token_id=self.pad_id)

    def _timed(self, run: Callable[..., torch.Tensor], *args: Any,
               **kw: Any) -> tuple[list[list[int]], float, int | None, int]:
        """(each row's new tokens, seconds, CUDA peak bytes, the sequences' length)."""
        width = args[0].shape[1]
        with PeakMemory(self.device) as peak:
            t = self.clock()
            out = run(*args, **kw)
            seconds = self.clock() - t
        return [row[width:].tolist() for row in out.cpu()], seconds, peak.peak, out.shape[1]

    def warm_up(self) -> None:
        ids, mask = left_pad(self.prompts[:2], self.pad_id)
        self._greedy(ids, mask)
        self._recap(ids, mask)

    def batches(self, b: int) -> list[list[torch.Tensor]]:
        n = len(self.prompts) // b
        return [self.prompts[i * b:(i + 1) * b] for i in range(n)]

    def run(self, sizes: list[int], progress: Callable[[str], None] = lambda _s: None) -> None:
        for b in sizes:
            if not self.batches(b):
                raise ValueError(f"--batch {b}: expected at least {b} prompts, got {len(self.prompts)}")
        for b in sizes:
            greedy, rec = self.cells.setdefault((b, "greedy"), Cell()), self.cells.setdefault((b, "recap"), Cell())
            equal = rows = 0
            steps = committed = 0
            prefill = [0.0, 0.0]
            for r in range(self.rounds):
                tok = {"greedy": 0, "recap": 0}
                sec = {"greedy": 0.0, "recap": 0.0}
                for i, batch in enumerate(self.batches(b)):
                    ids, mask = left_pad(batch, self.pad_id)
                    order = ["greedy", "recap"] if (r + i) % 2 == 0 else ["recap", "greedy"]
                    outs = {}
                    for name in order:
                        run = self._greedy if name == "greedy" else self._recap
                        outs[name], seconds, peak, length = self._timed(run, ids, mask)
                        cell = greedy if name == "greedy" else rec
                        if peak is not None:
                            cell.peak = max(cell.peak or 0, peak)
                        if name == "greedy":
                            cell.kv = max(cell.kv, len(batch) * length * self.kv_token)
                        tok[name] += sum(new_tokens(o, self.eos) for o in outs[name])
                        sec[name] += seconds
                        if name == "recap":
                            st = self.recap.last_stats
                            if st is not None:
                                rec.kv = max(rec.kv, st.kv_bytes)
                                steps, committed = steps + st.steps, committed + st.new_tokens - st.rows
                                prefill[1] += st.prefill_s if r == 0 else 0.0
                    if r == 0:  # greedy's prefill: the same call for one new token
                        t = self.clock()
                        self._greedy(ids, mask, max_new_tokens=1)
                        prefill[0] += self.clock() - t
                        for g, c in zip(outs["greedy"], outs["recap"], strict=True):
                            n = new_tokens(g, self.eos)
                            equal += int(g[:n] == c[:n])
                            rows += 1
                for name, cell in (("greedy", greedy), ("recap", rec)):
                    cell.tokens.append(tok[name])
                    cell.seconds.append(sec[name])
                progress(f"B={b} round {r + 1}: greedy {greedy.rate(r):.1f} tok/s, recap {rec.rate(r):.1f} tok/s")
            self.equal[b] = (equal, rows)
            self.prefill[b] = (prefill[0], prefill[1])
            self.tau[b] = committed / steps if steps else 1.0

    def run_references(self, progress: Callable[[str], None] = lambda _s: None) -> None:
        """Batch-1 RECAP@auto, prompt lookup and greedy over the same prompts, once."""
        runs: dict[str, tuple[Callable[..., torch.Tensor], dict]] = {
            "recap@auto (batch 1)": (self._recap, {}),
            "prompt lookup (batch 1)": (self._greedy, {"prompt_lookup_num_tokens": 10}),
            "greedy (batch 1)": (self._greedy, {}),
        }
        for label, (run, extra) in runs.items():
            tokens, seconds = 0, 0.0
            for p in self.prompts:
                outs, s, _, _ = self._timed(run, p, torch.ones_like(p), **extra)
                tokens += new_tokens(outs[0], self.eos)
                seconds += s
            self.reference[label] = tokens / seconds
            progress(f"{label}: {self.reference[label]:.1f} tok/s")

    # ---- the report -------------------------------------------------------------------------
    def ratios(self, b: int) -> list[float]:
        g, r = self.cells[(b, "greedy")], self.cells[(b, "recap")]
        return [r.rate(i) / g.rate(i) for i in range(len(g.seconds)) if g.rate(i) > 0]

    def verdict(self) -> str:
        parts = []
        for b in sorted({b for b, _ in self.cells}):
            lo, med, hi = _quantiles(self.ratios(b))
            target = TARGETS.get(b)
            goal = f"target >= {target:.2f}x: {'met' if med >= target else 'NOT met'}" if target else ""
            floor = "" if med >= FLOOR else f"below the {FLOOR:.2f}x floor"
            note = "; ".join(x for x in (goal, floor) if x)
            parts.append(f"B={b}: RECAP@auto {med:.2f}x batched greedy (IQR {lo:.2f}-{hi:.2f}x)"
                         + (f" ({note})" if note else ""))
        return "\n".join(parts)

    def markdown(self) -> str:
        mb = 1 << 20
        lines = ["| B | batched greedy tok/s | RECAP@auto batched tok/s | speedup (IQR) | tau | rows equal to "
                 "greedy | prefill s greedy / RECAP | KV cache MB greedy / RECAP |",
                 "|---|---|---|---|---|---|---|---|"]
        for b in sorted({b for b, _ in self.cells}):
            g, r = self.cells[(b, "greedy")], self.cells[(b, "recap")]
            lo, med, hi = _quantiles(self.ratios(b))
            eq, rows = self.equal.get(b, (0, 0))
            pg, pr = self.prefill.get(b, (0.0, 0.0))
            peaks = "" if g.peak is None or r.peak is None else f" (CUDA peak {g.peak / mb:.0f} / {r.peak / mb:.0f})"
            lines.append(f"| {b} | {g.median_rate:.1f} | {r.median_rate:.1f} | {med:.2f}x ({lo:.2f}-{hi:.2f}) | "
                         f"{self.tau.get(b, 1.0):.2f} | {eq}/{rows} | {pg:.2f} / {pr:.2f} | "
                         f"{g.kv / mb:.0f} / {r.kv / mb:.0f}{peaks} |")
        if self.reference:
            lines += ["", "| batch-1 reference | tok/s |", "|---|---|"]
            lines += [f"| {k} | {v:.1f} |" for k, v in self.reference.items()]
        return "\n".join(lines)
