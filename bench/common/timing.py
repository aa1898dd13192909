"""CUDA timing: :func:`time_cuda` / :func:`time_cuda_detailed`, and inputs rotated past the L2.

:func:`time_cuda_detailed` warms up, captures the calls into a CUDA graph and times graph replays
with CUDA events (falling back to CUDA-event timing of eager calls when capture fails; which one
was used is recorded, see :func:`timing_methods_used`). Each sample averages many calls; the
result is the median of several samples, in microseconds per call. When the data fits in L2,
callers rotate among several copies of the inputs (:func:`make_rotating_inputs`) so that every
call reads from DRAM, as it does in a training step.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from bench.common.device import l2_cache_bytes, require_cuda

#: Upper bound on the memory spent on rotated input copies (and their outputs).
DEFAULT_MEMORY_CAP_BYTES = 4 * 1024**3

GRAPH_METHOD = "cuda_graph"
EVENTS_METHOD = "cuda_events"

_METHODS_USED: dict[str, int] = {}


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
