"""Per-op GPU time and bytes of the project's ops inside a larger step (an expert block's fwd + bwd).

:func:`trace_ops` runs ``step`` once with every public op of ``torch_bindings`` (each goes through
``KernelOp.dispatch``, notes/host-overhead.md) timed by CUDA events around its call. A sleep kernel
queued first holds the GPU while the host queues the whole step, so no event pair times a gap in
which the GPU waited for a launch (a warning says when the sleep ended first). Bytes per call are
the op's tensor arguments (read) plus its tensor results (written): what a pass that reads its
inputs once and writes its outputs once moves.
:func:`op_rows` sets each op's time against a device copy of the same bytes (per call), so the ratio
is the op's own "fraction of copy" as it runs in the step (warm or cold L2 as the step leaves it).
Ops called from inside another op are counted in the outer one; traces do not nest.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from bench.common.baselines import copy_baseline_best
from torch_bindings.op import KernelOp

_ORIGINAL_DISPATCH = KernelOp.dispatch

#: Cycles of the sleep kernel queued before the step; a warning says when the host took longer to
#: queue the step.
_HOLD_CYCLES = 100_000_000


def tensor_bytes(obj: Any) -> int:
    """Bytes of every tensor in ``obj`` (a tensor, or tuples / lists of them; other values 0)."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, (tuple, list)):
        return sum(tensor_bytes(o) for o in obj)
    return 0


@dataclass
class OpTotals:
    """One op's calls in a step: GPU microseconds (summed) and the bytes of each call."""

    us: float = 0.0
    call_bytes: list[int] = field(default_factory=list)
    events: list = field(default_factory=list, repr=False)

    @property
    def calls(self) -> int:
        return len(self.call_bytes)

    @property
    def nbytes(self) -> int:
        return sum(self.call_bytes)


def trace_ops(step: Callable[[], Any]) -> tuple[dict[str, OpTotals], float]:
    """``({op name: totals}, step GPU us)`` of one call of ``step`` (module docstring)."""
    original = KernelOp.dispatch
    totals: dict[str, OpTotals] = {}
    depth = [0]

    def traced(self: KernelOp, backend: str, *args: Any) -> Any:
        if depth[0]:
            return original(self, backend, *args)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        depth[0] += 1
        try:
            start.record()
            out = original(self, backend, *args)
            end.record()
        finally:
            depth[0] -= 1
        entry = totals.setdefault(self.name, OpTotals())
        entry.call_bytes.append(tensor_bytes(args) + tensor_bytes(out))
        entry.events.append((start, end))
        return out

    if KernelOp.dispatch is not _ORIGINAL_DISPATCH:
        raise RuntimeError("trace_ops: a trace is already running (traces do not nest)")
    first, last = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    torch.cuda._sleep(_HOLD_CYCLES)
    first.record()
    KernelOp.dispatch = traced
    try:
        step()
        queued_in_time = not first.query()  # the sleep still held the GPU when the step was queued
        last.record()
    finally:
        KernelOp.dispatch = original
    torch.cuda.synchronize()
    if not queued_in_time:
        warnings.warn(
            "trace_ops: the host queued the step slower than the sleep held the GPU, so some op times "
            "include launch gaps; raise bench.common.op_trace._HOLD_CYCLES",
            stacklevel=2,
        )
    for entry in totals.values():
        entry.us = sum(s.elapsed_time(e) * 1e3 for s, e in entry.events)
        entry.events.clear()
    return totals, first.elapsed_time(last) * 1e3


def op_rows(totals: dict[str, OpTotals], step_us: float) -> list[dict]:
    """Rows of a per-op table, largest time first: calls, GPU us, MB moved, GB/s and the ratio to a
    device copy of each call's bytes; a last row for the rest of the step (GEMMs, PyTorch ops)."""
    rows = []
    device = torch.device("cuda")
    for name, t in sorted(totals.items(), key=lambda kv: -kv[1].us):
        copy_us = sum(copy_baseline_best(max(b, 2), device)[0].us for b in t.call_bytes)  # cached by size
        us = max(t.us, 1e-3)  # an op that launched nothing
        rows.append(
            {
                "op": name,
                "calls": t.calls,
                "us": t.us,
                "MB": t.nbytes / 1e6,
                "GB/s": t.nbytes / us / 1e3,
                "of copy": copy_us / us,
            }
        )
    rest = step_us - sum(t.us for t in totals.values())
    rows.append({"op": "rest of the step (GEMMs, PyTorch ops)", "calls": "", "us": rest})
    return rows


def print_op_table(title: str, rows: list[dict]) -> None:
    """``op_rows``' rows as a markdown table under ``title``."""
    print(f"\n### {title}\n\n| op | calls | us | MB | GB/s | of copy |\n|---|---|---|---|---|---|")
    for r in rows:
        if r["calls"] == "":
            print(f"| {r['op']} | | {r['us']:.1f} | | | |")
            continue
        moved = f"{r['MB']:.0f} | {r['GB/s']:.0f} | {r['of copy']:.2f}"
        print(f"| `{r['op']}` | {r['calls']} | {r['us']:.1f} | {moved} |")


__all__ = ["OpTotals", "op_rows", "print_op_table", "tensor_bytes", "trace_ops"]
