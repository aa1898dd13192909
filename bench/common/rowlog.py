"""Measuring one row and ending a run: :class:`RowLog`, the check against the reference, the summary.

A row's :class:`RowLog` collects its status, notes and the timing method of each timing;
:func:`diff_bytes` compares an output with the reference bit for bit; :func:`progress_row` prints
a finished row on stderr and :func:`finish` prints the failures and the result paths at the end.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from bench.common.cli import progress
from bench.common.rows import fmt_opt, is_fail
from bench.common.timing import time_cuda_detailed


def short_error(exc: BaseException, limit: int = 200) -> str:
    """``"Type: message"`` of ``exc``, first line only, at most ``limit`` characters."""
    return f"{type(exc).__name__}: {exc}".splitlines()[0][:limit]


def diff_bytes(
    out: torch.Tensor, ref: torch.Tensor, expected_shape: Sequence[int] | None = None
) -> str | None:
    """``None`` if ``out`` and ``ref`` hold the same bits (and ``out`` has ``expected_shape``), else why.

    Elements are compared as integers of their size (so NaN payloads count), in logical order
    (``.contiguous()`` of each). Same-numel tensors of other shapes are compared flat when no
    shape is expected (baselines may return other views of the same layout).
    """
    if expected_shape is not None and tuple(out.shape) != tuple(expected_shape):
        return f"shape {tuple(out.shape)} != expected {tuple(expected_shape)}"
    if out.element_size() != ref.element_size() or out.numel() != ref.numel():
        return f"{out.dtype}{tuple(out.shape)} vs reference {ref.dtype}{tuple(ref.shape)}"
    bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[out.element_size()]
    a = out.contiguous().view(bits).reshape(-1)
    b = ref.to(out.device).contiguous().view(bits).reshape(-1)
    if torch.equal(a, b):
        return None
    return f"{int((a != b).sum().item())} of {a.numel()} elements differ"


class RowLog:
    """What happened while one row was measured: status, notes and the timing method of each timing.

    ``status`` stays ``"ok"`` until :meth:`fail` (or a failed ``fatal`` timing) sets
    ``"FAIL: <why>"``; other problems are notes, joined by :meth:`note_text`.
    """

    def __init__(self) -> None:
        self.status = "ok"
        self.notes: list[str] = []
        self.methods: dict[str, str] = {}
        self.spreads: dict[str, dict[str, Any]] = {}

    def fail(self, why: str) -> None:
        """Mark the row failed (the first failure is kept)."""
        if not is_fail({"status": self.status}):
            self.status = f"FAIL: {why}"

    def note(self, text: str) -> None:
        """Add a note."""
        self.notes.append(text)

    def time(
        self,
        key: str,
        fn: Callable[..., Any],
        inputs: Sequence[tuple[Any, ...]],
        timing: Mapping[str, Any],
        *,
        fatal: bool = False,
    ) -> float | None:
        """:func:`time_cuda_detailed` of ``fn``; microseconds, or ``None`` if it raised.

        Records the method under ``key``, a graph-capture fallback as a note, and a failure as a
        FAIL status (``fatal``: our own op) or as a ``"<key> n/a: ..."`` note (a baseline).
        """
        try:
            t = time_cuda_detailed(fn, inputs, **timing)
        except Exception as exc:  # noqa: BLE001 - a failed timing is reported in the row
            if fatal:
                self.fail(f"timing raised {short_error(exc)}")
                import traceback

                traceback.print_exc(file=sys.stderr)
            else:
                self.note(f"{key} n/a: {short_error(exc)}")
            return None
        self.methods[key] = t.method
        self.spreads[key] = {
            "min": min(t.samples_us),
            "max": max(t.samples_us),
            "input_sets": t.input_sets,
            "calls_per_sample": t.calls_per_sample,
        }
        if t.fallback_reason:
            self.note(f"{key}: {t.fallback_reason}")
        return t.us

    def note_text(self) -> str:
        """The notes joined with ``"; "``."""
        return "; ".join(self.notes)

    def fill(self, row: dict[str, Any]) -> dict[str, Any]:
        """Store the methods, spreads and notes in ``row`` (``timing_methods``, ``us_spread``,
        ``note``) and return it."""
        row["timing_methods"] = dict(self.methods)
        row["us_spread"] = dict(self.spreads)
        row["note"] = self.note_text()
        return row


def progress_row(
    row: Mapping[str, Any], extras: Sequence[tuple[str, str]] = (("torchao", "baseline_us"),)
) -> None:
    """One stderr line for a finished row: status, our us, GB/s, ratio to copy, then ``extras``
    (``(label, row key)`` of other microsecond columns) and the note."""
    tail = "".join(f", {label} {fmt_opt(row.get(key), '.2f')} us" for label, key in extras)
    note = row.get("note")
    ours = f"ours {fmt_opt(row.get('us'), '.2f')} us ({fmt_opt(row.get('gbps'), '.0f')} GB/s"
    copy = f"{fmt_opt(row.get('ratio_to_copy'), '.3f')} of copy {fmt_opt(row.get('copy_gbps'), '.0f')} GB/s"
    progress(f"    {row.get('status')}: {ours}, {copy})" + tail + (f"  [{note}]" if note else ""))


def finish(
    rows: Sequence[Mapping[str, Any]],
    describe: Callable[[Mapping[str, Any]], str],
    lines: Sequence[str],
    paths: Sequence[Path | None],
) -> int:
    """The end of a bench run: print ``lines`` (goals), one ``FAIL <row>: <status>`` line per failed
    row (``describe(row)`` names it) and the result paths; return 1 if any row failed, else 0."""
    print()
    for line in lines:
        print(line)
    fails = [r for r in rows if is_fail(r)]
    for r in fails:
        print(f"FAIL {describe(r)}: {r['status']}")
    print("results: " + " ".join(str(p) for p in paths if p is not None))
    return 1 if fails else 0
