"""Baselines every bench compares against: the device copy of the same bytes, and torch.compile.

**Copy baseline**: a device-to-device ``dst.copy_(src)`` of uint8 tensors that moves the same
total number of bytes, i.e. it reads ``nbytes / 2`` and writes ``nbytes / 2``. It is timed with
the same timer in the same run, so ``ratio to copy = copy_us / our_us`` is the fraction of the
achievable memory bandwidth that a kernel reaches. :func:`copy_baseline_best` takes the fastest of
a few memcpy sizes and an SM copy kernel (notes/copy-baseline.md); :func:`measure_copy` is what a
bench row calls, and :func:`copy_suspect_note` flags a row that beats the copy past the L2.
:func:`raise_recompile_limit` lets the ``torch.compile`` baselines keep one compile per shape.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch

from bench.common.device import require_cuda
from bench.common.timing import Timing, make_rotating_inputs, time_cuda_detailed

if TYPE_CHECKING:
    from bench.common.rowlog import RowLog

#: Copy baselines copy a multiple of this many bytes each way (see :func:`copy_baseline_best`).
COPY_ALIGN = 4096

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


def raise_recompile_limit(limit: int = 64) -> None:
    """Let Dynamo keep a compile per (variant, static shape) of a baseline without falling back to
    eager (the compiled baselines see a few shapes each)."""
    cfg = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(cfg, name) and getattr(cfg, name) < limit:
            setattr(cfg, name, limit)
    if hasattr(cfg, "accumulated_recompile_limit") and cfg.accumulated_recompile_limit < 4 * limit:
        cfg.accumulated_recompile_limit = 4 * limit
