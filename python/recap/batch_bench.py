"""`recap bench --batch B ...`: throughput of batched decoding, RECAP against batched greedy.

For each batch size B the prompts (first turns, the sets interleaved so every batch mixes
them) are cut into full batches of B, left-padded as a tokenizer with padding_side="left"
does. Each batch runs under batched greedy `model.generate` and under RECAP's batched
`Decoder.generate` (budget="auto"), alternating which goes first, for `rounds` rounds. A
figure is committed tokens per second over all rows (a row's tokens end at its EOS);
the speedup is the median over rounds of RECAP's throughput over greedy's in the same round,
with its interquartile range. Batch-1 RECAP@auto, batch-1 prompt lookup and batch-1 greedy
run once over the same prompts as references. Peak memory is the most the process held above
what it held before the call (CUDA: allocated tensors; otherwise resident memory, sampled).
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from recap.config import RecapConfig
from recap.decoder import Decoder

TARGETS = {4: 1.25, 8: 1.15}  # RECAP@auto over batched greedy at these batch sizes
FLOOR = 0.97  # never below this at any batch size


class PeakMemory:
    """The most memory held above the starting level while the block runs (bytes)."""

    def __init__(self, device: torch.device) -> None:
        self.device, self.peak = device, 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @staticmethod
    def _rss() -> int:
        try:
            with open("/proc/self/statm") as f:
                return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            return 0

    def __enter__(self) -> PeakMemory:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self._base = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            return self
        self._base = self._rss()
        self.peak = 0

        def sample() -> None:
            while not self._stop.wait(0.002):
                self.peak = max(self.peak, self._rss() - self._base)

        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak = torch.cuda.max_memory_allocated(self.device) - self._base
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.peak = max(self.peak, self._rss() - self._base)


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
    peak: int = 0
    passes: int = 0

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
        self.cells: dict[tuple[int, str], Cell] = {}
        self.equal: dict[int, tuple[int, int]] = {}  # B -> (rows equal to batched greedy, rows)
        self.tau: dict[int, float] = {}
        self.reference: dict[str, float] = {}  # batch-1 method -> tokens per second

    # ---- the runs ---------------------------------------------------------------------------
    def _greedy(self, ids: torch.Tensor, mask: torch.Tensor, **extra: Any) -> torch.Tensor:
        with self.recap.verifying():  # the same linear layout as RECAP's passes
            return self.model.generate(input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
                                       do_sample=False, max_new_tokens=self.max_new, eos_token_id=sorted(self.eos),
                                       pad_token_id=self.pad_id, **extra)

    def _recap(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.recap.generate(ids.to(self.device), attention_mask=mask.to(self.device),
                                   max_new_tokens=self.max_new, eos_token_id=sorted(self.eos),
                                   pad_token_id=self.pad_id)

    def _timed(self, run: Callable[[], torch.Tensor], width: int) -> tuple[list[list[int]], float, int]:
        with PeakMemory(self.device) as peak:
            t = self.clock()
            out = run()
            seconds = self.clock() - t
        return [row[width:].tolist() for row in out.cpu()], seconds, peak.peak

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
            for r in range(self.rounds):
                tok = {"greedy": 0, "recap": 0}
                sec = {"greedy": 0.0, "recap": 0.0}
                for i, batch in enumerate(self.batches(b)):
                    ids, mask = left_pad(batch, self.pad_id)
                    order = ["greedy", "recap"] if (r + i) % 2 == 0 else ["recap", "greedy"]
                    outs = {}
                    for name in order:
                        run = (lambda: self._greedy(ids, mask)) if name == "greedy" else (lambda: self._recap(ids, mask))
                        outs[name], seconds, peak = self._timed(run, ids.shape[1])
                        cell = greedy if name == "greedy" else rec
                        cell.peak = max(cell.peak, peak)
                        tok[name] += sum(new_tokens(o, self.eos) for o in outs[name])
                        sec[name] += seconds
                        if name == "recap":
                            st = self.recap.last_stats
                            if st is not None:
                                steps, committed = steps + st.steps, committed + st.new_tokens - st.rows
                    if r == 0:
                        for g, c in zip(outs["greedy"], outs["recap"]):
                            n = new_tokens(g, self.eos)
                            equal += int(g[:n] == c[:n])
                            rows += 1
                for name, cell in (("greedy", greedy), ("recap", rec)):
                    cell.tokens.append(tok[name])
                    cell.seconds.append(sec[name])
                progress(f"B={b} round {r + 1}: greedy {greedy.rate(r):.1f} tok/s, recap {rec.rate(r):.1f} tok/s")
            self.equal[b] = (equal, rows)
            self.tau[b] = committed / steps if steps else 1.0

    def run_references(self, progress: Callable[[str], None] = lambda _s: None) -> None:
        """Batch-1 RECAP@auto, prompt lookup and greedy over the same prompts, once."""
        runs: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
            "recap@auto (batch 1)": lambda ids: self._recap(ids, torch.ones_like(ids)),
            "prompt lookup (batch 1)": lambda ids: self._greedy(ids, torch.ones_like(ids), prompt_lookup_num_tokens=10),
            "greedy (batch 1)": lambda ids: self._greedy(ids, torch.ones_like(ids)),
        }
        for label, run in runs.items():
            tokens, seconds = 0, 0.0
            for p in self.prompts:
                outs, s, _ = self._timed(lambda: run(p), p.shape[1])
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
                 "greedy | peak MB greedy / RECAP |", "|---|---|---|---|---|---|---|"]
        for b in sorted({b for b, _ in self.cells}):
            g, r = self.cells[(b, "greedy")], self.cells[(b, "recap")]
            lo, med, hi = _quantiles(self.ratios(b))
            eq, rows = self.equal.get(b, (0, 0))
            lines.append(f"| {b} | {g.median_rate:.1f} | {r.median_rate:.1f} | {med:.2f}x ({lo:.2f}-{hi:.2f}) | "
                         f"{self.tau.get(b, 1.0):.2f} | {eq}/{rows} | {g.peak / mb:.0f} / {r.peak / mb:.0f} |")
        if self.reference:
            lines += ["", "| batch-1 reference | tok/s |", "|---|---|"]
            lines += [f"| {k} | {v:.1f} |" for k, v in self.reference.items()]
        return "\n".join(lines)
