"""Host time of expert-parallel routing and layout (``torch_bindings.ep``) on one GPU, before and
after the routing kernels (``cute_kernels.ep_route``, notes/ep-routing-kernel.md):

    python -m bench.bench_ep_route [--tokens 8192 --hidden 7168 --topk 8 --experts 64 256]

R = 1 (no process group), mxfp8, alignment 32, k distinct uniform experts per token. Per E and
path, the eager host microseconds per call (median of single calls, the GPU drained between
rounds so no call waits on a full launch queue) of

- ``routing``: the routing steps of one dispatch on already-allocated buffers: ``route``, the count
  exchange (R = 1: a view), ``layout`` and the zero fill of the q, scale and tag buffers;
- ``dispatch``: a whole ``ep.dispatch`` call (the routing, the quantization, the row scatters, the
  scale swizzle).

and ``routing GPU``: the GPU microseconds of the routing steps (20 of them captured in one CUDA
graph, replays timed with events: no launch gaps).

"before" runs the PyTorch routing, layout and row-scatter zero fill (the kernels switched off by
``EP_MAX_EXPERTS = 0``: the path the bindings take for more experts than the kernels' tables);
"after" the kernels. Both paths' routing outputs are compared first (they must be equal, bit for
bit). The goal (notes/ep-routing-kernel.md): <= 50 us of host time for the routing steps. Exits 2
with a one-line message where no GPU runs the kernels.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from collections.abc import Callable

import torch

from torch_bindings import ep


def _kernels_here() -> str | None:
    """None where the kernels run on the current GPU, else why not (one line)."""
    if not torch.cuda.is_available():
        return "bench_ep_route needs a CUDA GPU (torch.cuda.is_available() is False)"
    from torch_bindings.backend import kernel_arch

    arch, why = kernel_arch(torch.device("cuda"))
    return None if arch is not None else f"bench_ep_route: the kernels do not run here ({why})"


@contextlib.contextmanager
def _pytorch_routing():
    """The PyTorch routing, layout and zero fill (the path before the kernels)."""
    saved = ep.EP_MAX_EXPERTS
    ep.EP_MAX_EXPERTS = 0
    try:
        yield
    finally:
        ep.EP_MAX_EXPERTS = saved


def host_us(fn: Callable[[], object], calls: int = 20, rounds: int = 15) -> float:
    """Median host microseconds of one call of ``fn``: ``rounds`` rounds of ``calls`` single timed
    calls, the GPU drained before each round (few enough calls that none waits on the queue)."""
    for _ in range(5):
        fn()
    samples = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        for _ in range(calls):
            start = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - start)
    torch.cuda.synchronize()
    return statistics.median(samples) * 1e6


def gpu_us(fn: Callable[[], object], per_graph: int = 20, replays: int = 10) -> float:
    """GPU microseconds of one call of ``fn``: ``per_graph`` calls captured in one CUDA graph, the
    median of ``replays`` timed replays, divided by ``per_graph``."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(per_graph):
            fn()
    graph.replay()
    samples = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / per_graph)
    return statistics.median(samples)


class _Case:
    """One shape: x (T, D) bf16, ids (T, k) int64 of k distinct uniform experts, the buffers of one
    R = 1 dispatch (allocated once: the routing rows time no allocation of them)."""

    def __init__(self, tokens: int, hidden: int, topk: int, experts: int) -> None:
        gen = torch.Generator(device="cuda").manual_seed(experts)
        self.experts = experts
        self.x = torch.randn(tokens, hidden, device="cuda", generator=gen).bfloat16()
        scores = torch.rand(tokens, experts, device="cuda", generator=gen)
        self.ids = scores.topk(topk, dim=1).indices
        self.shape = ep.EpShape(1, tokens, hidden, topk, experts, 32, "mxfp8")
        self.pool = ep.LocalPool(1, torch.device("cuda"))
        self.slot = self.pool.acquire(("bench", self.shape), ep._dispatch_kinds(self.shape))

    def routing(self) -> ep.Layout:
        routing = ep.route(self.ids, self.experts, self.slot.index)
        all_counts = self.pool.exchange_counts(routing, self.slot)
        lay = ep.layout(routing, all_counts, 0, self.shape, self.slot.filled)
        ep.zero_padding(lay, self.slot.views[0])
        return lay

    def dispatch(self) -> object:
        return ep.dispatch(self.x, self.ids, num_experts=self.experts, recipe="mxfp8")


def _same_layout(a: ep.Layout, b: ep.Layout) -> bool:
    return all(
        torch.equal(x, y)
        for x, y in zip(
            (a.dst_index, a.padded_start, a.padded_end, a.sizes),
            (b.dst_index, b.padded_start, b.padded_end, b.sizes),
            strict=True,
        )
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--hidden", type=int, default=7168)
    parser.add_argument("--topk", type=int, default=8)
    parser.add_argument("--experts", type=int, nargs="+", default=[64, 256])
    args = parser.parse_args(argv)
    why = _kernels_here()
    if why is not None:
        print(f"error: {why}", file=sys.stderr)
        return 2
    print(f"device: {torch.cuda.get_device_name()}; T {args.tokens}, D {args.hidden}, k {args.topk}, R 1")
    print(f"{'E':>5s} {'step':>11s} {'before us':>10s} {'after us':>9s} {'ratio':>6s}")
    for experts in args.experts:
        case = _Case(args.tokens, args.hidden, args.topk, experts)
        with _pytorch_routing():
            want = case.routing()
        if not _same_layout(case.routing(), want):
            print(f"error: E = {experts}: the kernels' layout differs from PyTorch's", file=sys.stderr)
            return 1
        for step, fn, timer in (
            ("routing", case.routing, host_us),
            ("dispatch", case.dispatch, host_us),
            ("routing GPU", case.routing, gpu_us),
        ):
            with _pytorch_routing():
                before = timer(fn)
            after = timer(fn)
            print(f"{experts:5d} {step:>11s} {before:10.1f} {after:9.1f} {before / after:6.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
