"""Shared benchmark harness for the cute-kernels data-movement kernels.

Used by ``bench_swizzle``, ``bench_quantize_2d``, ``bench_quantize_3d`` and ``bench_pad``.

Conventions
-----------
* **Bytes moved = bytes read + bytes written**, counting each input byte once and each output
  byte once (the fewest bytes any implementation must move).
* **Copy baseline**: a device-to-device ``dst.copy_(src)`` of uint8 tensors that moves the same
  total number of bytes, i.e. it reads ``nbytes / 2`` and writes ``nbytes / 2``. It is timed with
  the same timer in the same run, so ``ratio to copy = copy_us / our_us`` is the fraction of the
  achievable memory bandwidth that a kernel reaches.
* **GB/s** are decimal: ``1 GB = 1e9 bytes``; **MB** in tables are ``1e6`` bytes.
* **Timing**: :func:`time_cuda` warms up, captures the calls into a CUDA graph and times graph
  replays with CUDA events (falling back to plain CUDA-event timing of eager calls when capture
  fails; which one was used is recorded). Each sample averages many calls; the result is the
  median of several samples, in microseconds per call. When the data fits in L2, callers rotate
  among several copies of the inputs (:func:`make_rotating_inputs`) so that every call reads
  from DRAM, as it does in a training step.

Everything here imports on a CPU-only machine; functions that need a GPU raise
:class:`CudaUnavailableError` with a clear message.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import platform
import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = [
    "BYTES_CONVENTION",
    "DEFAULT_L2_BYTES",
    "DEFAULT_MEMORY_CAP_BYTES",
    "RESULTS_DIR",
    "CudaUnavailableError",
    "Timing",
    "Column",
    "require_cuda",
    "l2_cache_bytes",
    "tensor_nbytes",
    "make_rotating_inputs",
    "time_cuda",
    "time_cuda_detailed",
    "timing_methods_used",
    "reset_timing_methods",
    "copy_baseline_us",
    "copy_baseline_detailed",
    "copy_baseline_best",
    "copy_bytes_each_way",
    "COPY_ALIGN",
    "gbps",
    "make_row",
    "format_value",
    "format_table",
    "run_metadata",
    "report",
    "make_parser",
    "add_common_args",
    "resolve_out_dir",
    "output_paths",
    "timing_kwargs",
    "progress",
    "add_bench_args",
    "short_error",
    "fmt_opt",
    "is_fail",
    "diff_bytes",
    "skewed_group_sizes",
    "skewed_group_ends",
    "block_group_ends",
    "cuda_or_none",
    "kernel_pending",
    "not_built_status",
    "RowLog",
    "measure_copy",
    "copy_suspect_note",
    "raise_recompile_limit",
    "progress_row",
    "finish",
]

BYTES_CONVENTION = (
    "bytes moved = bytes read + bytes written (each input byte once, each output byte once); "
    "the copy baseline is dst.copy_(src) of uint8 tensors moving the same total, i.e. it reads "
    "nbytes/2 and writes nbytes/2; GB/s = 1e9 bytes per second; MB = 1e6 bytes"
)

#: L2 size assumed when the device cannot be asked (H100: 50 MB, H200: 60 MB).
DEFAULT_L2_BYTES = 50 * 1024 * 1024
#: Upper bound on the memory spent on rotated input copies (and their outputs).
DEFAULT_MEMORY_CAP_BYTES = 4 * 1024**3
#: Default output folder for JSON/PNG results (git-ignored).
RESULTS_DIR = Path(__file__).resolve().parent / "results"

#: Copy baselines copy a multiple of this many bytes each way (see :func:`copy_baseline_best`).
COPY_ALIGN = 4096

GRAPH_METHOD = "cuda_graph"
EVENTS_METHOD = "cuda_events"

_METHODS_USED: dict[str, int] = {}


class CudaUnavailableError(RuntimeError):
    """Raised by the functions that need a CUDA GPU when none is available."""


# --------------------------------------------------------------------------------------------
# Device helpers
# --------------------------------------------------------------------------------------------


#: Table columns every kernel bench shows, as (row key, header): bytes moved, our time and rate, the
#: copy of the same bytes and the ratio; then the torchao baseline and the row status.
RATE_COLUMNS: list[tuple[str, str]] = [
    ("mb_moved", "MB moved"),
    ("us", "our us"),
    ("gbps", "our GB/s"),
    ("copy_gbps", "copy GB/s"),
    ("ratio_to_copy", "ratio to copy"),
]
BASELINE_COLUMNS: list[tuple[str, str]] = [
    ("baseline_us", "torchao us"),
    ("speedup", "speedup vs torchao"),
    ("status", "status"),
]
#: Plot series (row key, legend) every kernel bench draws first.
RATE_SERIES: tuple[tuple[str, str], ...] = (("gbps", "ours"), ("copy_gbps", "copy (same bytes)"))


def require_cuda(what: str = "this benchmark") -> torch.device:
    """Return the current CUDA device, or raise :class:`CudaUnavailableError` if there is none.

    Args:
        what: name of the caller, used in the error message.
    """
    if not torch.cuda.is_available():
        raise CudaUnavailableError(
            f"{what} needs a CUDA GPU, but torch.cuda.is_available() is False "
            f"(torch {torch.__version__}, CUDA build: {torch.version.cuda}). "
            "Run it on the GPU machine."
        )
    return torch.device("cuda", torch.cuda.current_device())


def l2_cache_bytes(device: torch.device | int | None = None) -> int:
    """L2 cache size of ``device`` in bytes (``DEFAULT_L2_BYTES`` when it cannot be read)."""
    if not torch.cuda.is_available():
        return DEFAULT_L2_BYTES
    props = torch.cuda.get_device_properties(device if device is not None else torch.cuda.current_device())
    size = int(getattr(props, "L2_cache_size", 0) or 0)
    return size if size > 0 else DEFAULT_L2_BYTES


def tensor_nbytes(obj: Any) -> int:
    """Total bytes of the tensors found in ``obj`` (a tensor or nested tuple/list/dict)."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, Mapping):
        return sum(tensor_nbytes(v) for v in obj.values())
    if isinstance(obj, (tuple, list)):
        return sum(tensor_nbytes(v) for v in obj)
    return 0


def _default_memory_cap() -> int:
    """``DEFAULT_MEMORY_CAP_BYTES``, or a quarter of the free device memory if that is less."""
    cap = DEFAULT_MEMORY_CAP_BYTES
    if torch.cuda.is_available():
        try:
            free, _total = torch.cuda.mem_get_info()
            cap = min(cap, free // 4)
        except RuntimeError:
            pass
    return max(int(cap), 1)


def make_rotating_inputs(
    make_fn: Callable[[], tuple[Any, ...]],
    *,
    min_bytes: int | None = None,
    bytes_per_set: int | None = None,
    max_sets: int = 256,
    memory_cap_bytes: int | None = None,
) -> list[tuple[Any, ...]]:
    """Build enough independent argument tuples that cycling through them defeats the L2 cache.

    ``make_fn()`` must return a *fresh* tuple of arguments (new tensors) on every call; tensors
    that are meant to be shared (offsets, say) may be the same object in every tuple.

    Args:
        make_fn: builds one argument tuple.
        min_bytes: total footprint to reach; default ``4 * L2`` of the current device.
        bytes_per_set: footprint of one set; default the bytes of the tensors ``make_fn``
            returns. Pass ``input + output`` bytes when the timed function allocates outputs
            (:func:`time_cuda` keeps one output alive per input set, so they rotate as well).
        max_sets: upper bound on the number of sets.
        memory_cap_bytes: upper bound on ``sets * bytes_per_set``; default the smaller of
            ``DEFAULT_MEMORY_CAP_BYTES`` and a quarter of the free device memory.

    Returns:
        A list of at least one argument tuple; a single tuple when one set is already larger
        than ``min_bytes``.
    """
    first = make_fn()
    if not isinstance(first, tuple):
        raise TypeError(f"make_fn must return a tuple of arguments, got {type(first).__name__}")
    per_set = int(bytes_per_set) if bytes_per_set is not None else tensor_nbytes(first)
    per_set = max(per_set, 1)
    target = int(min_bytes) if min_bytes is not None else 4 * l2_cache_bytes()
    cap = int(memory_cap_bytes) if memory_cap_bytes is not None else _default_memory_cap()
    n = math.ceil(target / per_set)
    n = min(n, max_sets, max(cap // per_set, 1))
    n = max(n, 1)
    sets = [first]
    for _ in range(n - 1):
        sets.append(make_fn())
    return sets


# --------------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------------


@dataclass
class Timing:
    """Result of :func:`time_cuda_detailed`.

    Attributes:
        us: median microseconds per call.
        method: ``"cuda_graph"`` (graph replays timed with CUDA events) or ``"cuda_events"``
            (eager calls timed with CUDA events).
        samples_us: per-call microseconds of each sample (the median is taken over these).
        calls_per_sample: calls averaged in one sample.
        input_sets: number of rotated argument tuples.
        fallback_reason: why graph capture was not used (``None`` when it was, or was not asked).
    """

    us: float
    method: str
    samples_us: list[float] = field(default_factory=list)
    calls_per_sample: int = 0
    input_sets: int = 1
    fallback_reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly view."""
        return asdict(self)


def _record_method(method: str) -> None:
    _METHODS_USED[method] = _METHODS_USED.get(method, 0) + 1


def timing_methods_used() -> dict[str, int]:
    """How many :func:`time_cuda` measurements used each method in this process."""
    return dict(_METHODS_USED)


def reset_timing_methods() -> None:
    """Forget the methods recorded so far (for tests)."""
    _METHODS_USED.clear()


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    n = len(ordered)
    mid = n // 2
    return ordered[mid] if n % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])


def _run_calls(
    fn: Callable[..., Any], inputs: Sequence[tuple[Any, ...]], ring: list[Any], start: int, count: int
) -> None:
    """Call ``fn`` ``count`` times, cycling through ``inputs``; keep one output per input set.

    Keeping the last output of each set alive makes outputs rotate through distinct memory just
    like the inputs (instead of reusing one L2-resident buffer).
    """
    n = len(inputs)
    for j in range(count):
        k = (start + j) % n
        ring[k] = fn(*inputs[k])


def time_cuda_detailed(
    fn: Callable[..., Any],
    inputs: Sequence[tuple[Any, ...]] | None = None,
    *,
    warmup: int = 10,
    iters: int = 100,
    reps: int = 7,
    use_graph: bool = True,
    graph_unroll: int = 32,
) -> Timing:
    """Time ``fn`` on the current CUDA stream; see :func:`time_cuda`.

    Args:
        fn: the callable to time; called as ``fn(*args)`` for ``args`` in ``inputs``.
        inputs: argument tuples to rotate among (default: one empty tuple, i.e. ``fn()``).
        warmup: eager warm-up calls before anything is timed (compilation, autotuning, caches).
        iters: at least this many calls per sample.
        reps: number of samples; the median is returned.
        use_graph: capture the calls into a CUDA graph and time its replays.
        graph_unroll: at least this many calls captured into one graph (rounded up to a whole
            number of passes over ``inputs``), so graph-launch gaps are amortized.
    """
    require_cuda("time_cuda")
    sets: list[tuple[Any, ...]] = list(inputs) if inputs is not None else [()]
    if not sets:
        raise ValueError("inputs must hold at least one argument tuple")
    n = len(sets)
    iters = max(int(iters), 1)
    reps = max(int(reps), 1)
    ring: list[Any] = [None] * n

    # Warm up on a side stream (recommended before graph capture), then join.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        _run_calls(fn, sets, ring, 0, max(int(warmup), 1))
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    ring = [None] * n  # free the warm-up outputs

    fallback_reason: str | None = None
    if use_graph:
        per_graph = n * max(1, math.ceil(min(iters, graph_unroll) / n))
        replays = max(1, math.ceil(iters / per_graph))
        graph = torch.cuda.CUDAGraph()
        graph_ring: list[Any] = [None] * n
        try:
            with warnings.catch_warnings():
                # A capture that fails part-way also warns "The CUDA Graph is empty": noise.
                warnings.filterwarnings("ignore", message=".*CUDA Graph is empty.*")
                with torch.cuda.graph(graph):
                    _run_calls(fn, sets, graph_ring, 0, per_graph)
            graph.replay()
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 - any capture failure means: time eagerly
            fallback_reason = f"graph capture failed: {type(exc).__name__}: {exc}".splitlines()[0][:300]
            del graph
            graph_ring = []
            try:
                torch.cuda.synchronize()
            except Exception:  # noqa: BLE001
                pass
        else:
            samples = []
            for _ in range(reps):
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(replays):
                    graph.replay()
                end.record()
                end.synchronize()
                samples.append(start.elapsed_time(end) * 1e3 / (per_graph * replays))
            del graph, graph_ring
            _record_method(GRAPH_METHOD)
            return Timing(
                us=_median(samples),
                method=GRAPH_METHOD,
                samples_us=samples,
                calls_per_sample=per_graph * replays,
                input_sets=n,
            )

    calls = n * max(1, math.ceil(iters / n))
    samples = []
    pos = 0
    for _ in range(reps):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        _run_calls(fn, sets, ring, pos, calls)
        end.record()
        end.synchronize()
        pos += calls
        samples.append(start.elapsed_time(end) * 1e3 / calls)
    _record_method(EVENTS_METHOD)
    return Timing(
        us=_median(samples),
        method=EVENTS_METHOD,
        samples_us=samples,
        calls_per_sample=calls,
        input_sets=n,
        fallback_reason=fallback_reason,
    )


def time_cuda(
    fn: Callable[..., Any],
    inputs: Sequence[tuple[Any, ...]] | None = None,
    *,
    warmup: int = 10,
    iters: int = 100,
    reps: int = 7,
    use_graph: bool = True,
) -> float:
    """Median microseconds per call of ``fn``.

    Warms up, then captures the calls into a ``torch.cuda.CUDAGraph`` replayed several times per
    sample and timed with CUDA events (falling back to CUDA-event timing of eager calls if capture
    fails; see :func:`timing_methods_used` / :func:`time_cuda_detailed` for which one ran). Each
    sample averages at least ``iters`` calls; the median of ``reps`` samples is returned.

    ``inputs`` is a list of argument tuples that the calls cycle through; build it with
    :func:`make_rotating_inputs` so the rotated data exceeds the L2 cache.
    """
    return time_cuda_detailed(fn, inputs, warmup=warmup, iters=iters, reps=reps, use_graph=use_graph).us


_COPY_CACHE: dict[tuple[Any, ...], Timing] = {}


def copy_baseline_detailed(
    nbytes: int,
    device: torch.device | str | int | None = None,
    *,
    warmup: int = 10,
    iters: int = 100,
    reps: int = 7,
    use_graph: bool = True,
    tries: int = 2,
) -> Timing:
    """The copy ceiling of ``nbytes`` moved: :func:`copy_baseline_best` (the fastest of the exact
    size and a slightly larger one, scaled), so that no bench compares against a slow driver path."""
    require_cuda("copy_baseline_detailed")
    kw = {"warmup": warmup, "iters": iters, "reps": reps, "use_graph": use_graph}
    return copy_baseline_best(nbytes, device, tries=tries, **kw)[0]


def _patterned_bytes(n: int, device: torch.device) -> torch.Tensor:
    """``n`` non-constant bytes on ``device``, without the CUDA RNG.

    (A CUDA-graph capture that fails part-way, e.g. a baseline that syncs, leaves the default
    CUDA generator unusable: ``torch.randint`` then raises "Offset increment outside graph capture
    encountered unexpectedly" for the rest of the process.)
    """
    out = torch.empty(n, dtype=torch.uint8, device=device)
    words = n // 4
    if words:
        out[: 4 * words].view(torch.int32).copy_(
            torch.arange(words, dtype=torch.int32, device=device).mul_(-1640531535)
        )
    out[4 * words :].fill_(0x5A)
    return out


def copy_bytes_each_way(nbytes: int, attempt: int = 0, step_bytes: int = 112 << 10) -> int:
    """Bytes each way of copy-baseline try ``attempt`` for ``nbytes`` moved (see :func:`copy_baseline_best`).

    ``nbytes / 2`` rounded up to a multiple of ``COPY_ALIGN`` (when that changes it by < 1%),
    plus ``attempt * step_bytes``.
    """
    half = max(int(nbytes) // 2, 1)
    if half >= 100 * COPY_ALIGN:
        half = COPY_ALIGN * math.ceil(half / COPY_ALIGN)
    return half + attempt * max(int(step_bytes), 0)


def _copy_device(device: torch.device | str | int | None) -> torch.device:
    """The CUDA device (with its index) a copy baseline runs on."""
    require_cuda("copy_baseline_us")
    dev = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
    if dev.type != "cuda":
        raise ValueError(f"copy_baseline_us: device must be a CUDA device, got {dev}")
    return dev if dev.index is not None else torch.device("cuda", torch.cuda.current_device())


def _timed_copy(
    key: tuple,
    dev: torch.device,
    make: Callable[[], tuple[torch.Tensor, torch.Tensor]],
    copy: Callable[[torch.Tensor, torch.Tensor], Any],
    bytes_per_set: int,
    cache: bool,
    **timing_kw: Any,
) -> Timing:
    """``copy(src, dst)`` timed on rotated ``make()`` buffers, cached under ``key``."""
    if cache and key in _COPY_CACHE:
        return _COPY_CACHE[key]
    with torch.cuda.device(dev):
        sets = make_rotating_inputs(make, bytes_per_set=bytes_per_set)
        timing = time_cuda_detailed(copy, sets, **timing_kw)
    del sets
    if cache:
        _COPY_CACHE[key] = timing
    return timing


def _copy_exact_detailed(
    nbytes: int,
    device: torch.device | str | int | None = None,
    *,
    warmup: int = 10,
    iters: int = 100,
    reps: int = 7,
    use_graph: bool = True,
    cache: bool = True,
) -> Timing:
    """Time ``dst.copy_(src)`` of uint8 tensors of ``nbytes // 2`` bytes each (see module doc)."""
    dev = _copy_device(device)
    half = max(int(nbytes) // 2, 1)

    def make() -> tuple[torch.Tensor, torch.Tensor]:
        return (_patterned_bytes(half, dev), torch.empty(half, dtype=torch.uint8, device=dev))

    timing_kw = {"warmup": warmup, "iters": iters, "reps": reps, "use_graph": use_graph}
    key = (half, dev.index, warmup, iters, reps, use_graph)
    return _timed_copy(key, dev, make, lambda src, dst: dst.copy_(src), 2 * half, cache, **timing_kw)


def _copy_kernel_detailed(
    nbytes: int,
    device: torch.device | str | int | None = None,
    *,
    warmup: int = 10,
    iters: int = 100,
    reps: int = 7,
    use_graph: bool = True,
) -> Timing:
    """Time an SM copy kernel (``torch.bitwise_and(src, -1, out=dst)`` on int32 views) of
    ``nbytes // 2`` bytes each way (rounded up to 4 bytes), cached per size like the memcpy."""
    dev = _copy_device(device)
    words = max(math.ceil(int(nbytes) // 2 / 4), 1)

    def make() -> tuple[torch.Tensor, torch.Tensor]:
        src = _patterned_bytes(4 * words, dev).view(torch.int32)
        return (src, torch.empty(words, dtype=torch.int32, device=dev))

    timing_kw = {"warmup": warmup, "iters": iters, "reps": reps, "use_graph": use_graph}
    key = ("kernel", words, dev.index, warmup, iters, reps, use_graph)
    timing = _timed_copy(
        key, dev, make, lambda src, dst: torch.bitwise_and(src, -1, out=dst), 8 * words, True, **timing_kw
    )
    f = (int(nbytes) // 2) / (4 * words)
    return replace(timing, us=timing.us * f, samples_us=[v * f for v in timing.samples_us])


def copy_baseline_us(
    nbytes: int,
    device: torch.device | str | int | None = None,
    *,
    warmup: int = 10,
    iters: int = 100,
    reps: int = 7,
    use_graph: bool = True,
) -> float:
    """Microseconds of a device-to-device copy that moves ``nbytes`` in total.

    Bytes moved = read + written, so the copy reads ``nbytes / 2`` and writes ``nbytes / 2``
    (``dst.copy_(src)`` of uint8 tensors), timed with :func:`time_cuda` (same method, rotated
    buffers when small). Results are cached per size within the process.
    """
    require_cuda("copy_baseline_us")
    return copy_baseline_detailed(
        nbytes, device, warmup=warmup, iters=iters, reps=reps, use_graph=use_graph
    ).us


def copy_baseline_best(
    nbytes: int,
    device: torch.device | str | int | None = None,
    *,
    tries: int = 2,
    step_bytes: int = 112 << 10,
    kernel_try: bool = True,
    warmup: int = 10,
    iters: int = 100,
    reps: int = 7,
    use_graph: bool = True,
) -> tuple[Timing, list[float]]:
    """The fastest of ``tries`` copy baselines of (nearly) ``nbytes``, scaled to exactly ``nbytes``.

    Try ``i`` copies :func:`copy_bytes_each_way` ``(nbytes, i)`` bytes each way: ``nbytes / 2``
    rounded up to a multiple of ``COPY_ALIGN`` (4 KiB), plus ``i * step_bytes``; its time is scaled
    by ``nbytes / bytes copied`` (a 2.8 GB copy grows by 8e-5). Why: a ``dst.copy_(src)`` (a
    device-to-device ``cudaMemcpyAsync``) captured in a CUDA graph becomes a memcpy node, and on
    an H200 (driver 580, CUDA 13.0) such a node ran at 2.75 TB/s instead of 4.1-4.3 TB/s
    (1) whenever the byte count was not a multiple of 64 (every bench_pad size: the int32 offsets
    add 8-12 bytes per group) and (2) at some aligned sizes (1358 MiB each way, the
    quantize_2d (131072, 7168) row), while eager copies and an SM copy kernel of the same sizes
    ran at 4.1-4.3 TB/s. The 4 KiB rounding and the second try, 112 KiB longer, avoid most slow
    sizes, but not all (1880887296 bytes each way and 112 KiB more were both slow), so with
    ``kernel_try`` a last try times an SM copy kernel of the same bytes (an int32
    ``bitwise_and(src, -1, out=dst)``: a kernel node, no driver memcpy path; 4.19-4.27 TB/s at
    every size measured). The ceiling is the fastest of them.

    Returns:
        ``(best timing, microseconds of every try, scaled)`` (the memcpy tries, then the kernel
        try); the best :class:`Timing` has its ``us`` and ``samples_us`` scaled too. Measurements
        are cached per size (as in :func:`_copy_exact_detailed`).
    """
    require_cuda("copy_baseline_best")
    kw = {"warmup": warmup, "iters": iters, "reps": reps, "use_graph": use_graph}
    nbytes = max(int(nbytes), 2)
    scaled: list[Timing] = []
    for i in range(max(int(tries), 1)):
        total = 2 * copy_bytes_each_way(nbytes, i, step_bytes)
        t = _copy_exact_detailed(total, device, **kw)
        f = nbytes / total
        scaled.append(replace(t, us=t.us * f, samples_us=[v * f for v in t.samples_us]))
    if kernel_try:
        scaled.append(_copy_kernel_detailed(nbytes, device, **kw))
    best = min(scaled, key=lambda t: t.us)
    return best, [t.us for t in scaled]


def gbps(nbytes: float, us: float) -> float:
    """Achieved bandwidth in GB/s (1e9 bytes per second) for ``nbytes`` moved in ``us`` microseconds."""
    if us is None or not us > 0:
        raise ValueError(f"gbps: time must be a positive number of microseconds, got {us!r}")
    return float(nbytes) / (float(us) * 1e3)


# --------------------------------------------------------------------------------------------
# Rows, tables and reports
# --------------------------------------------------------------------------------------------

Column = tuple[str, str]
"""``(row key, table header)``; a plain string ``key`` is shorthand for ``(key, key)``."""


def _positive(x: float | None) -> bool:
    return x is not None and isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def make_row(
    *,
    nbytes: int,
    us: float | None,
    copy_us: float | None,
    baseline_us: float | None = None,
    status: str = "ok",
    **fields: Any,
) -> dict[str, Any]:
    """Build one result row (a plain dict) with the derived bandwidth columns.

    Args:
        nbytes: bytes moved (read + written).
        us: our median microseconds (``None`` if it failed or was not timed).
        copy_us: the copy baseline's microseconds for the same ``nbytes``.
        baseline_us: another implementation's microseconds (torchao, say), or ``None``.
        status: ``"ok"``, or a short failure description starting with ``"FAIL"``.
        **fields: descriptive columns (layout, shape, G, ...), kept first and unchanged.

    Returns:
        ``fields`` plus ``nbytes``, ``mb_moved``, ``us``, ``gbps``, ``copy_us``, ``copy_gbps``,
        ``ratio_to_copy`` (= copy_us / us = our GB/s / copy GB/s), ``baseline_us``,
        ``baseline_gbps``, ``speedup`` (= baseline_us / us) and ``status``; values that cannot
        be computed are ``None``.
    """
    row: dict[str, Any] = dict(fields)
    row["nbytes"] = int(nbytes)
    row["mb_moved"] = nbytes / 1e6
    row["us"] = us if _positive(us) else None
    row["gbps"] = gbps(nbytes, us) if _positive(us) else None
    row["copy_us"] = copy_us if _positive(copy_us) else None
    row["copy_gbps"] = gbps(nbytes, copy_us) if _positive(copy_us) else None
    row["ratio_to_copy"] = copy_us / us if _positive(us) and _positive(copy_us) else None
    row["baseline_us"] = baseline_us if _positive(baseline_us) else None
    row["baseline_gbps"] = gbps(nbytes, baseline_us) if _positive(baseline_us) else None
    row["speedup"] = baseline_us / us if _positive(us) and _positive(baseline_us) else None
    row["status"] = status
    return row


def format_value(key: str, value: Any) -> str:
    """Table text for one cell: ``None`` -> ``n/a``; numbers by what the key measures."""
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return "n/a"
        if "speedup" in key:
            return f"{value:.2f}x"
        if "ratio" in key:
            return f"{value:.3f}"
        if key.startswith("mb") or key.endswith("_mb"):
            return f"{value:.2f}"
        if "gbps" in key:
            return f"{value:.1f}"
        return f"{value:.2f}" if abs(value) < 1000 else f"{value:.1f}"
    if isinstance(value, (tuple, list)):
        return "(" + ", ".join(str(v) for v in value) + ")"
    return str(value)


def _norm_columns(columns: Sequence[Column | str]) -> list[Column]:
    out: list[Column] = []
    for c in columns:
        if isinstance(c, str):
            out.append((c, c))
        else:
            key, header = c
            out.append((str(key), str(header)))
    return out


def format_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[Column | str]) -> str:
    """Render ``rows`` as a ``tabulate`` table (GitHub-markdown style) over ``columns``."""
    from tabulate import tabulate

    cols = _norm_columns(columns)
    body = [[format_value(k, row.get(k)) for k, _ in cols] for row in rows]
    return tabulate(body, headers=[h for _, h in cols], tablefmt="github", disable_numparse=True)


def _device_name() -> str:
    if torch.cuda.is_available():
        try:
            return torch.cuda.get_device_name()
        except RuntimeError as exc:
            return f"cuda (name unavailable: {exc})"
    return "cpu (no CUDA device)"


def run_metadata(extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Context for a results file: device, versions, timing methods, date, command line."""
    methods = timing_methods_used()
    meta: dict[str, Any] = {
        "device": _device_name(),
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "python_version": platform.python_version(),
        "timing_method": "+".join(sorted(methods)) if methods else "none",
        "timing_methods_used": methods,
        "timing_note": (
            "median of several samples; each sample = CUDA-event time of CUDA-graph replays "
            "(cuda_graph) or of eager calls (cuda_events) / calls; inputs rotated beyond L2"
        ),
        "bytes_convention": BYTES_CONVENTION,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "argv": list(sys.argv),
        "hostname": platform.node(),
    }
    if torch.cuda.is_available():
        try:
            props = torch.cuda.get_device_properties(torch.cuda.current_device())
            meta["sm_count"] = props.multi_processor_count
            meta["capability"] = f"{props.major}.{props.minor}"
            meta["l2_bytes"] = l2_cache_bytes()
        except RuntimeError:
            pass
    if extra:
        meta.update(extra)
    return meta


def _jsonable(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (str, int, bool)) or value is None:
        return value
    if isinstance(value, (torch.dtype, torch.device, Path)):
        return str(value)
    if hasattr(value, "item") and callable(value.item):
        try:
            return _jsonable(value.item())
        except (RuntimeError, ValueError):
            pass
    return str(value)


def _row_label(row: Mapping[str, Any], label_keys: Sequence[str]) -> str:
    parts = []
    for k in label_keys:
        v = row.get(k)
        if v is None or v == "" or v == "-":
            continue
        text = format_value(k, v)
        parts.append(f"{k}={text}" if k in ("G",) else text)
    return " ".join(parts)


def _plot(
    rows: Sequence[Mapping[str, Any]],
    title: str,
    png_path: Path,
    label_keys: Sequence[str],
    plot_series: Sequence[tuple[str, str]],
    panel_key: str | None = None,
) -> None:
    """Grouped bars of achieved GB/s per row, one panel per distinct ``row[panel_key]``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = [(k, name) for k, name in plot_series if any(_positive(r.get(k)) for r in rows)]
    panels: dict[str, list[Mapping[str, Any]]] = {}
    for r in rows:
        panels.setdefault(str(r.get(panel_key, "")) if panel_key else "", []).append(r)
    if not panels:
        panels[""] = []
    widest = max(len(p) for p in panels.values())
    ns = max(len(series), 1)
    width = min(max(8.0, 0.22 * widest * ns + 2.5), 26.0)
    fig, axes = plt.subplots(len(panels), 1, figsize=(width, 4.2 * len(panels)), squeeze=False)
    top = max((float(r[k]) for r in rows for k, _ in series if _positive(r.get(k))), default=1.0)
    bar_w = 0.8 / ns
    for ax, (panel, prow) in zip(axes[:, 0], panels.items(), strict=True):
        for i, (key, name) in enumerate(series):
            xs = [j + (i - (ns - 1) / 2) * bar_w for j in range(len(prow))]
            ys = [float(r[key]) if _positive(r.get(key)) else 0.0 for r in prow]
            ax.bar(xs, ys, width=bar_w, label=name)
        for j, r in enumerate(prow):
            if str(r.get("status", "ok")).upper().startswith("FAIL"):
                ax.text(j, top * 0.02, "FAIL", color="red", ha="center", va="bottom", rotation=90, fontsize=8)
        ax.set_xticks(list(range(len(prow))))
        keys = [k for k in label_keys if k != panel_key]
        ax.set_xticklabels([_row_label(r, keys) for r in prow], rotation=35, ha="right", fontsize=7)
        ax.set_xlim(-0.6, max(widest, 1) - 0.4)
        ax.set_ylabel("GB/s (read + written)")
        ax.set_title(f"{title}: {panel}" if panel else title, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
        ax.set_ylim(0, top * 1.2)
        if series:
            ax.legend(loc="upper left", ncols=len(series), fontsize=8)
    fig.tight_layout()
    png_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png_path, dpi=100)
    plt.close(fig)


DEFAULT_PLOT_SERIES: tuple[tuple[str, str], ...] = (
    ("gbps", "ours"),
    ("copy_gbps", "copy (same bytes)"),
    ("baseline_gbps", "baseline"),
)


def report(
    rows: Sequence[Mapping[str, Any]],
    columns: Sequence[Column | str],
    title: str,
    json_path: str | os.PathLike[str] | None = None,
    png_path: str | os.PathLike[str] | None = None,
    *,
    label_keys: Sequence[str] = ("layout", "shape", "G"),
    plot_series: Sequence[tuple[str, str]] = DEFAULT_PLOT_SERIES,
    panel_key: str | None = "layout",
    meta: Mapping[str, Any] | None = None,
    print_table: bool = True,
) -> str:
    """Print a table of ``rows`` and write it as JSON and as a PNG bar chart.

    Args:
        rows: result rows (see :func:`make_row`).
        columns: ``(key, header)`` pairs (or keys) shown in the table, in order.
        title: table/plot title.
        json_path: where to write ``{"title", "meta", "columns", "rows"}``; ``None``: no JSON.
        png_path: where to write the plot (achieved GB/s per row, one bar per series);
            ``None``: no plot.
        label_keys: row keys that make up a row's x-axis label.
        plot_series: ``(row key, legend name)`` bar series; series with no value are dropped.
        panel_key: one plot panel per distinct value of this row key (``None``: one panel).
        meta: extra metadata merged into :func:`run_metadata` (e.g. baseline names).
        print_table: print the title and the table to stdout.

    Returns:
        The table text.
    """
    table = format_table(rows, columns)
    if print_table:
        print(f"\n## {title}\n")
        print(table, flush=True)
    if json_path is not None:
        json_path = Path(json_path)
        json_path.parent.mkdir(parents=True, exist_ok=True)
        doc = {
            "title": title,
            "meta": run_metadata(meta),
            "columns": [{"key": k, "header": h} for k, h in _norm_columns(columns)],
            "rows": [_jsonable(dict(r)) for r in rows],
        }
        json_path.write_text(json.dumps(_jsonable(doc), indent=2) + "\n")
    if png_path is not None:
        _plot(rows, title, Path(png_path), label_keys, plot_series, panel_key)
    return table


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------


def add_common_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the options every benchmark script shares.

    ``--out DIR`` (default ``bench/results``), ``--quick`` (a few shapes), ``--iters N`` (calls
    per sample), ``--warmup N``, ``--reps N`` (samples; the median is reported) and
    ``--no-graph`` (time eager calls instead of CUDA-graph replays).
    """
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="DIR",
        help=f"folder for the JSON and PNG results (default: {RESULTS_DIR})",
    )
    parser.add_argument("--quick", action="store_true", help="run a few representative shapes only")
    parser.add_argument("--iters", type=int, default=100, help="calls per timing sample (default: 100)")
    parser.add_argument("--warmup", type=int, default=10, help="warm-up calls (default: 10)")
    parser.add_argument("--reps", type=int, default=7, help="timing samples; median reported (default: 7)")
    parser.add_argument(
        "--no-graph", dest="use_graph", action="store_false", help="time eager calls, not CUDA-graph replays"
    )
    parser.add_argument(
        "--copy-tries",
        type=int,
        default=2,
        help="copy baseline = fastest of this many sizes, each 112 KiB larger, scaled (default: 2)",
    )
    return parser


def add_bench_args(
    parser: argparse.ArgumentParser,
    *,
    op: str | None = None,
    torchao: bool = True,
    check: bool = True,
    backend: str | None = "cute",
) -> argparse.ArgumentParser:
    """Add the options the kernel benches share on top of :func:`add_common_args`.

    ``--no-torchao`` (when ``torchao``), ``--no-check`` (when ``check``) and ``--backend``
    (choices ``cute``/``auto``/``reference``, default ``backend``; omitted when ``backend`` is
    ``None``). ``op`` names the public function in the help text.
    """
    if torchao:
        parser.add_argument("--no-torchao", action="store_true", help="skip the torchao baseline")
    if check:
        parser.add_argument(
            "--no-check", action="store_true", help="skip the reference check (debugging only)"
        )
    if backend is not None:
        parser.add_argument(
            "--backend",
            default=backend,
            choices=("cute", "auto", "reference"),
            help=f"backend= passed to {op or 'our op'} (default: {backend}; cute times the kernel)",
        )
    return parser


def make_parser(description: str) -> argparse.ArgumentParser:
    """An ``ArgumentParser`` with :func:`add_common_args` already applied."""
    parser = argparse.ArgumentParser(description=description)
    return add_common_args(parser)


def resolve_out_dir(out: str | os.PathLike[str] | argparse.Namespace | None) -> Path:
    """The results folder (``--out`` or ``bench/results``), created if missing."""
    if isinstance(out, argparse.Namespace):
        out = getattr(out, "out", None)
    path = Path(out) if out is not None else RESULTS_DIR
    path.mkdir(parents=True, exist_ok=True)
    return path


def output_paths(out: str | os.PathLike[str] | argparse.Namespace | None, stem: str) -> tuple[Path, Path]:
    """``(DIR/stem.json, DIR/stem.png)`` for the results folder of :func:`resolve_out_dir`."""
    folder = resolve_out_dir(out)
    return folder / f"{stem}.json", folder / f"{stem}.png"


def timing_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """``warmup``/``iters``/``reps``/``use_graph`` from parsed common args, for :func:`time_cuda`."""
    return {
        "warmup": args.warmup,
        "iters": args.iters,
        "reps": args.reps,
        "use_graph": args.use_graph,
    }


def progress(message: str) -> None:
    """One progress line on stderr (flushed)."""
    print(message, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------
# Shared bench scaffolding (rows, checks, status lines, the end of a run)
# --------------------------------------------------------------------------------------------


def short_error(exc: BaseException, limit: int = 200) -> str:
    """``"Type: message"`` of ``exc``, first line only, at most ``limit`` characters."""
    return f"{type(exc).__name__}: {exc}".splitlines()[0][:limit]


def fmt_opt(value: float | None, spec: str) -> str:
    """``format(value, spec)``, or ``"n/a"`` for ``None``."""
    return "n/a" if value is None else format(value, spec)


def is_fail(row: Mapping[str, Any]) -> bool:
    """Whether a result row's status is a failure (starts with ``FAIL``)."""
    return str(row.get("status", "ok")).startswith("FAIL")


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


def skewed_group_sizes(total: int, num_groups: int, *, seed: int = 0) -> list[int]:
    """Deterministic, skewed, generally unaligned group sizes that sum to ``total``.

    Sizes follow a heavy-tailed (log-normal) split like a real router's token counts: a few big
    experts, many small ones, possibly some empty.
    """
    if num_groups <= 0:
        raise ValueError(f"num_groups must be positive, got {num_groups}")
    if total < 0:
        raise ValueError(f"total must be >= 0, got {total}")
    rng = np.random.default_rng(1234 + 7919 * seed + num_groups)
    weights = rng.lognormal(mean=0.0, sigma=1.0, size=num_groups)
    raw = weights / weights.sum() * total
    sizes = np.floor(raw).astype(np.int64)
    sizes[int(np.argmax(sizes))] += total - int(sizes.sum())
    return [int(s) for s in sizes]


def skewed_group_ends(total: int, num_groups: int, *, seed: int = 0) -> list[int]:
    """End offsets (cumulative sums) of :func:`skewed_group_sizes`; the last one is ``total``."""
    return [int(v) for v in np.cumsum(skewed_group_sizes(total, num_groups, seed=seed))]


def block_group_ends(rows: int, groups: int, device: torch.device | str = "cuda") -> torch.Tensor:
    """Int32 end offsets of ``groups`` uneven row groups (sizes growing as 1, 2, ..., G) of whole
    32-row blocks covering all ``rows`` (a multiple of 32), on ``device``."""
    blocks = rows // 32
    weights = torch.arange(1, groups + 1, dtype=torch.float64)
    sizes = (weights / weights.sum() * blocks).floor().long()
    sizes[-1] += blocks - int(sizes.sum())
    return (torch.cumsum(sizes, 0) * 32).to(torch.int32).to(device)


def cuda_or_none(what: str) -> torch.device | None:
    """The CUDA device, or ``None`` after printing ``error: <why>`` to stderr (callers exit 2)."""
    try:
        return require_cuda(what)
    except CudaUnavailableError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None


def kernel_pending(op: str) -> int | None:
    """The issue whose CuTeDSL kernel ``torch_bindings.<op>`` still waits for, or ``None`` if built.

    Reads ``torch_bindings.KERNEL_STATUS`` (an op it does not list counts as built).
    """
    import torch_bindings

    return getattr(torch_bindings, "KERNEL_STATUS", {}).get(op)


def not_built_status(op: str, issue: int | None = None) -> str:
    """Row status of an op whose kernel is not built yet (not a failure: nothing was wrong)."""
    issue = kernel_pending(op) if issue is None else issue
    return f"kernel not built (issue #{issue})" if issue is not None else "kernel not built"


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


#: Bytes past which a ratio to copy above ``SUSPECT_RATIO`` means the copy baseline misread.
SUSPECT_BYTES = 4 * 60e6
SUSPECT_RATIO = 1.05


def measure_copy(
    nbytes: int,
    device: torch.device,
    timing: Mapping[str, Any],
    tries: int,
    log: RowLog | None = None,
) -> tuple[float, list[float]]:
    """The copy baseline of ``nbytes`` moved (:func:`copy_baseline_best`): ``(us, us of each try)``.

    Empties the caching allocator first (so the copy buffers do not crowd the bench's own), and
    records the method in ``log`` under ``"copy"``.
    """
    torch.cuda.empty_cache()
    best, tried = copy_baseline_best(nbytes, device, tries=tries, **timing)
    if log is not None:
        log.methods["copy"] = best.method
    return best.us, tried


def copy_suspect_note(row: Mapping[str, Any], tries: Sequence[float]) -> str | None:
    """A note when a row beats the copy of its bytes by > 5% past the L2 (the copy misread)."""
    if (row.get("ratio_to_copy") or 0.0) > SUSPECT_RATIO and row.get("nbytes", 0) > SUSPECT_BYTES:
        return f"ratio to copy > 1 past the L2: copy baseline suspect (tries {[round(t, 2) for t in tries]})"
    return None


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


def raise_recompile_limit(limit: int = 64) -> None:
    """Let Dynamo keep a compile per (variant, static shape) of a baseline without falling back to
    eager (the compiled baselines see a few shapes each)."""
    cfg = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(cfg, name) and getattr(cfg, name) < limit:
            setattr(cfg, name, limit)
    if hasattr(cfg, "accumulated_recompile_limit") and cfg.accumulated_recompile_limit < 4 * limit:
        cfg.accumulated_recompile_limit = 4 * limit
