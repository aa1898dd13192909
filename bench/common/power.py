"""A call in a sustained loop, with the SM clock and board power the GPU runs it at.

A GEMM that runs for seconds reaches the board's power limit, and there the clock falls until the
limit holds (notes/grouped-gemm-sm90.md, "Power-bound"). :func:`sustained` runs a call for some
seconds while ``nvidia-smi`` samples the device's SM clock and power draw, and reports the median
of each over the steady part of the run beside the time per call. The calls are eager, with a host
sync every ``batch`` of them: their times are not those of graph replays (``timing.time_cuda``).
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

#: Dense tensor-core FLOPs per SM per clock on sm_90 (H100 / H200): e4m3 wgmma and bf16 wgmma.
SM90_DENSE_FLOPS_PER_CLOCK = {"fp8": 8192, "bf16": 4096}

#: The first part of a run's samples is left out of the medians (the clock still settling).
SETTLE_FRACTION = 1 / 3


@dataclass(frozen=True)
class SustainedRun:
    """One sustained run: microseconds per call, and the medians of the SM clock (MHz) and the
    board's power draw (W) over the run's steady part; ``samples`` the count they are taken from."""

    us: float
    sm_mhz: float
    watts: float
    samples: int


def parse_samples(text: str) -> list[tuple[float, float]]:
    """``(MHz, W)`` pairs of ``nvidia-smi --query-gpu=clocks.sm,power.draw
    --format=csv,noheader,nounits`` output, one per line; lines that do not hold two numbers
    (a "[N/A]", a partial last line) are skipped."""
    pairs = []
    for line in text.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 2:
            continue
        try:
            pairs.append((float(fields[0]), float(fields[1])))
        except ValueError:
            continue
    return pairs


def steady_medians(pairs: list[tuple[float, float]]) -> tuple[float, float, int]:
    """(median MHz, median W, count) of the samples after the first :data:`SETTLE_FRACTION`;
    ``ValueError`` when there are none."""
    steady = pairs[int(len(pairs) * SETTLE_FRACTION) :]
    if not steady:
        raise ValueError("no clock / power samples: nvidia-smi printed nothing usable")
    return statistics.median(p[0] for p in steady), statistics.median(p[1] for p in steady), len(steady)


def _sampler_query(smi: str, device_index: int) -> list[str]:
    """The ``nvidia-smi`` command that samples CUDA device ``device_index`` every 50 ms, named by
    its UUID (``nvidia-smi`` numbers GPUs its own way, ignoring ``CUDA_VISIBLE_DEVICES``)."""
    import torch

    uuid = torch.cuda.get_device_properties(device_index).uuid
    return [smi, "-i", f"GPU-{uuid}", "--query-gpu=clocks.sm,power.draw",
            "--format=csv,noheader,nounits", "-lms", "50"]  # fmt: skip


def _run_loop(fn: Callable[[], object], seconds: float, batch: int) -> tuple[float, int]:
    """(milliseconds, calls) of the timed part of the loop: a third of ``seconds`` to let the clock
    settle, then at least one batch and until ``seconds`` are over, timed with CUDA events."""
    import torch

    settle_until = time.monotonic() + seconds * SETTLE_FRACTION
    while time.monotonic() < settle_until:
        for _ in range(batch):
            fn()
        torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    end_at = time.monotonic() + seconds * (1 - SETTLE_FRACTION)
    calls = 0
    start.record()
    while calls == 0 or time.monotonic() < end_at:
        for _ in range(batch):
            fn()
        calls += batch
        torch.cuda.synchronize()
    stop.record()
    torch.cuda.synchronize()
    return start.elapsed_time(stop), calls


def sustained(
    fn: Callable[[], object], device_index: int, seconds: float = 3.0, batch: int = 20
) -> SustainedRun:
    """Run ``fn`` (queued on the current CUDA stream) for about ``seconds`` (``_run_loop``) while
    ``nvidia-smi`` samples CUDA device ``device_index`` into a temporary file. ``ValueError`` for a
    non-positive ``seconds`` or ``batch``; ``RuntimeError`` without ``nvidia-smi`` or when it
    printed no usable sample (its exit code and message in the error)."""
    if seconds <= 0 or batch <= 0:
        raise ValueError(f"seconds ({seconds}) and batch ({batch}) must be positive")
    smi = shutil.which("nvidia-smi")
    if smi is None:
        raise RuntimeError("--power needs nvidia-smi on the PATH (it samples the clock and power)")
    with tempfile.TemporaryFile("w+") as samples, tempfile.TemporaryFile("w+") as errors:
        sampler = subprocess.Popen(
            _sampler_query(smi, device_index), stdout=samples, stderr=errors, text=True
        )
        try:
            ms, calls = _run_loop(fn, seconds, batch)
        finally:
            sampler.terminate()
            try:
                sampler.wait(timeout=5)
            except subprocess.TimeoutExpired:
                sampler.kill()
                sampler.wait()
        samples.seek(0)
        errors.seek(0)
        text, message = samples.read(), errors.read().strip()
    try:
        mhz, watts, count = steady_medians(parse_samples(text))
    except ValueError as exc:
        raise RuntimeError(f"nvidia-smi (exit {sampler.returncode}): {message or text[:200]!r}") from exc
    return SustainedRun(ms * 1e3 / calls, mhz, watts, count)
