"""Expert-parallel dispatch and combine (``torch_bindings.ep``) across GPUs, one process per GPU:

    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \\
        torchrun --nproc-per-node 2 -m bench.bench_ep [--tokens 8192 --hidden 7168 --topk 8 --experts 64 256]

Per GPU, in one run: dispatch (mxfp8, fp8_rowwise, bf16) and combine GB/s (bytes this rank sends,
itself included, / time; the slowest rank's time), as ratios to a peer copy of the same bytes
through the same symmetric-memory mappings (``copy_`` to each rank's buffer in turn) and to NCCL
``all_to_all_single`` of the same bytes, eager and CUDA-graph replayed, with the host time per
eager call; the fused MXFP8 dispatch against the unfused chain it replaces (permute by rank, a host
read of the split sizes, bf16 ``all_to_all_single``, permute by expert,
``pad_and_quantize_mxfp8_2d``); and the MoE layer (``MoELayer``: router, dispatch, experts,
combine) forward + backward per recipe against the bf16 chain with the same router and weights
(bench/common/moe_chain.py), with peak memory. Routing: k distinct uniform experts per token
(transfers), the layer's router (layer rows). Multicast stays off. ``--host-profile CALLS``: also
rank 0's host time per step of CALLS eager dispatch + combine calls (where the host time goes).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

for _name, _value in (
    ("NCCL_NVLS_ENABLE", "0"),
    ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
    ("NVSHMEM_DISABLE_NVLS", "1"),
):
    os.environ.setdefault(_name, _value)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from bench.bench_overhead import back_to_back_rounds, floor_of  # noqa: E402
from torch_bindings import ep, pad_and_quantize_mxfp8_2d  # noqa: E402


def _time(fn, iters: int) -> float:
    """Median seconds per call over ``iters`` calls, each started together on every rank (a
    barrier before it), the slowest rank's median."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(iters):
        dist.barrier()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    med = torch.tensor(sorted(times)[len(times) // 2], device="cuda")
    dist.all_reduce(med, op=dist.ReduceOp.MAX)
    return float(med)


def _graph(fn):
    """``fn`` captured once in a CUDA graph (every step is sync-free): replay time is GPU time, no
    host launch gaps. None when capture fails (the error is printed)."""
    try:
        fn()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        return graph.replay
    except Exception as err:  # noqa: BLE001 - report and go on
        print(f"rank {dist.get_rank()}: graph capture failed: {err}", flush=True)
        return None


def _peer_copy(nbytes: int):
    """A copy of ``nbytes`` from this rank, an equal share to every rank's symmetric buffer."""
    import torch.distributed._symmetric_memory as symm_mem

    ranks, rank = dist.get_world_size(), dist.get_rank()
    share = nbytes // ranks // 16 * 16
    buf = symm_mem.empty(share * ranks, dtype=torch.uint8, device="cuda")
    handle = symm_mem.rendezvous(buf, dist.group.WORLD)
    src = torch.randint(0, 255, (share * ranks,), dtype=torch.uint8, device="cuda")
    peers = [handle.get_buffer(p, (share * ranks,), torch.uint8) for p in range(ranks)]

    def run():
        for i in range(ranks):
            p = (rank + i) % ranks
            peers[p][rank * share : (rank + 1) * share].copy_(src[p * share : (p + 1) * share])
        handle.barrier(channel=0)

    return run


def _all_to_all(nbytes: int):
    ranks = dist.get_world_size()
    n = nbytes // ranks * ranks
    src = torch.randint(0, 255, (n,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return lambda: dist.all_to_all_single(dst, src)


def _unfused_dispatch(x, ids, experts: int, alignment: int):
    """The chain the fused dispatch replaces (one host read of the split sizes, as torchao's)."""
    ranks = dist.get_world_size()
    local = experts // ranks
    tokens, topk = ids.shape

    def run():
        e = ids.reshape(-1)
        order = torch.sort(e // local, stable=True).indices
        send = x.index_select(0, order // topk)
        counts = torch.zeros(ranks, dtype=torch.int64, device=x.device).index_add_(
            0, e // local, torch.ones_like(e)
        )
        recv_counts = torch.empty_like(counts)
        dist.all_to_all_single(recv_counts, counts)
        splits_in, splits_out = counts.tolist(), recv_counts.tolist()  # the host sync
        recv = x.new_empty((sum(splits_out), x.shape[1]))
        dist.all_to_all_single(recv, send, splits_out, splits_in)
        recv_e = torch.empty(sum(splits_out), dtype=e.dtype, device=e.device)
        dist.all_to_all_single(recv_e, e[order].contiguous(), splits_out, splits_in)
        by_expert = torch.sort(recv_e % local, stable=True)
        grouped = recv.index_select(0, by_expert.indices)
        sizes = torch.zeros(local, dtype=torch.int32, device=x.device).index_add_(
            0, by_expert.values, torch.ones_like(by_expert.values, dtype=torch.int32)
        )
        return pad_and_quantize_mxfp8_2d(
            grouped, torch.cumsum(sizes, 0, dtype=torch.int32), alignment=alignment
        )

    return run


def _row(
    name: str, nbytes: int, seconds: float, copy_s: float, nccl_s: float | None = None, host=None
) -> str:
    """A table row; ``host``: (after a sync, back to back, floor) host seconds per call, or None."""
    gbps = nbytes / seconds / 1e9
    nccl = f"{nccl_s / seconds:.2f}" if nccl_s is not None else "-"
    hosts = " | ".join(f"{h * 1e6:.0f}" for h in host) if host is not None else "- | - | -"
    return (
        f"| {name} | {nbytes / 1e6:.1f} | {seconds * 1e6:.0f} | {gbps:.0f} | {copy_s / seconds:.2f} | {nccl} "
        f"| {hosts} |"
    )


def _host_seconds(fn, calls: int = 20) -> float:
    """Median host time of one call with a sync after each (no synchronization inside: what the
    caller's thread spends; the thread idles in the sync before each call)."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
        torch.cuda.synchronize()
    return sorted(times)[len(times) // 2]


def _back_to_back(fns: tuple, calls: int = 16, rounds: int = 5) -> list[float]:
    """Host seconds per call of each of ``fns``, each called ``calls`` times back to back with no
    sync between (the thread stays busy, as in a training step), the rounds of the functions in
    turn (``bench_overhead.back_to_back_rounds``); the median round of each."""
    return [sorted(times)[len(times) // 2] for times in back_to_back_rounds(fns, calls, rounds)]


def _host_times(fn, pool) -> tuple[float, float, float]:
    """(after a sync, back to back, floor) host seconds per call of the EP op ``fn``. The floor
    is what no binding avoids: a bare TVM-FFI call of each kernel the op launches, with the
    arguments of a real call (``bench_overhead.floor_of``), and the op's two barriers of the
    symmetric pool. Its replays write into the slot ``floor_of`` recorded and post that call's
    (stale) ticket; the ranks stay in step because every rank makes the same calls and the floor,
    like the op, passes two barriers per call."""
    floor = floor_of(fn, torch.device("cuda", torch.cuda.current_device()))

    def floor_with_barriers() -> None:
        floor()
        pool.barrier()
        pool.barrier()

    cold = _host_seconds(fn)
    warm, floor_s = _back_to_back((fn, floor_with_barriers))
    return cold, warm, floor_s


#: The steps of an eager dispatch and combine whose host time ``host_profile`` reports: module
#: functions of ``torch_bindings.moe.ep`` and methods of its symmetric pool. ``_mark_filled``,
#: ``post_counts`` and ``received_counts`` run on the PyTorch routing's path only (more than
#: ``EP_MAX_EXPERTS`` experts): on the kernels' path a step that is not called has no row, and the
#: ticket flag's ``_assert_async`` counts as ``other``.
_HOST_STEPS = (
    "route",
    "layout",
    "send_dispatch",
    "zero_padding",
    "_mark_filled",
    "finish_dispatch",
    "send_combine",
    "finish_combine",
)
#: The count exchange is timed by its parts (its barrier under ``barrier``), so that no timed step
#: calls another.
_POOL_STEPS = ("acquire", "post_counts", "received_counts", "barrier")


def _timed(fn, name: str, spent: dict):
    """``fn`` adding its host seconds to ``spent[name]``."""

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[name] = spent.get(name, 0.0) + time.perf_counter() - start

    return wrapper


def host_profile(tokens: int, hidden: int, topk: int, experts: int, alignment: int, calls: int) -> str:
    """Where eager dispatch and combine spend host time: ``calls`` mxfp8 dispatches and combines on
    every rank (the same calls everywhere: the ranks must stay in step), a sync after each, with
    each step of ``_HOST_STEPS`` / ``_POOL_STEPS`` timed on the host; returns rank 0's table of host
    us per call by step, the rest (autograd, checks, allocation) as ``other``. It times the
    symmetric pool's steps, so it needs two ranks or more (one line saying so otherwise)."""
    from torch_bindings.moe import ep as ep_module

    if dist.get_world_size() < 2:
        return "\nhost profile: needs 2 or more ranks (the symmetric pool's steps)"
    gen = torch.Generator(device="cuda").manual_seed(dist.get_rank())
    x = torch.randn(tokens, hidden, device="cuda", generator=gen).bfloat16()
    ids = torch.rand(tokens, experts, device="cuda", generator=gen).topk(topk, dim=1).indices
    w = torch.rand(tokens, topk, device="cuda", generator=gen)
    res = ep.dispatch(x, ids, num_experts=experts, alignment=alignment)
    y = torch.randn(res.q.shape[0], hidden, device="cuda").bfloat16()
    ep.combine(y, res, w)
    torch.cuda.synchronize()
    pool = res.pool
    spent: dict[str, float] = {}
    # The steps call each other through the module's globals and the pool's attributes, so the
    # wrappers set here are what they call; no timed step calls another (``other`` is the rest).
    saved = {name: getattr(ep_module, name) for name in _HOST_STEPS}
    for name, fn in saved.items():
        setattr(ep_module, name, _timed(fn, name, spent))
    for name in _POOL_STEPS:
        setattr(pool, name, _timed(getattr(pool, name), f"pool.{name}", spent))
    try:
        for _ in range(calls):
            del res
            start = time.perf_counter()
            res = ep.dispatch(x, ids, num_experts=experts, alignment=alignment)
            middle = time.perf_counter()
            ep.combine(y, res, w)
            end = time.perf_counter()
            spent["dispatch total"] = spent.get("dispatch total", 0.0) + middle - start
            spent["combine total"] = spent.get("combine total", 0.0) + end - middle
            torch.cuda.synchronize()
    finally:
        for name, fn in saved.items():
            setattr(ep_module, name, fn)
        for name in _POOL_STEPS:
            delattr(pool, name)
    steps = sum(v for k, v in spent.items() if not k.endswith("total"))
    spent["other (autograd, checks, allocation)"] = spent["dispatch total"] + spent["combine total"] - steps
    lines = [
        f"\n### host us per call by step: {calls} x (dispatch mxfp8 + combine), T={tokens} E={experts}",
        "| step | host us per call |",
        "|---|---|",
    ]
    for name, seconds in sorted(spent.items(), key=lambda kv: -kv[1]):
        lines.append(f"| {name} | {seconds / calls * 1e6:.1f} |")
    return "\n".join(lines)


def transfer_rows(tokens: int, hidden: int, topk: int, experts: int, alignment: int, iters: int) -> list[str]:
    """Dispatch (each recipe) and combine against a peer copy and NCCL ``all_to_all_single`` of the
    same bytes, eager and graph-replayed, with the host time per call."""
    rank = dist.get_rank()
    gen = torch.Generator(device="cuda").manual_seed(rank)
    x = torch.randn(tokens, hidden, device="cuda", generator=gen).bfloat16()
    ids = torch.rand(tokens, experts, device="cuda", generator=gen).topk(topk, dim=1).indices
    w = torch.rand(tokens, topk, device="cuda", generator=gen)
    pairs = tokens * topk
    sizes = {
        "mxfp8": pairs * (hidden + hidden // 32 + 4),
        "fp8_rowwise": pairs * (hidden + 8),
        "bf16": pairs * (2 * hidden + 4),
        "combine": pairs * 2 * hidden,
    }
    res = ep.dispatch(x, ids, num_experts=experts)
    y = torch.randn(res.q.shape[0], hidden, device="cuda").bfloat16()
    calls = {
        r: (lambda r=r: ep.dispatch(x, ids, num_experts=experts, recipe=r, alignment=alignment))
        for r in ("mxfp8", "fp8_rowwise", "bf16")
    }
    calls["combine"] = lambda: ep.combine(y, res, w)
    lines = [
        f"\n### T={tokens} D={hidden} k={topk} E={experts} ({dist.get_world_size()} ranks, "
        f"{torch.cuda.get_device_name()})",
        "| op | MB sent / rank | time us | GB/s / GPU | ratio to peer copy | ratio to NCCL "
        "| host us, after a sync | host us, back to back | host floor us |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, nbytes in sizes.items():
        copy_s, nccl_s = _time(_peer_copy(nbytes), iters), _time(_all_to_all(nbytes), iters)
        op = "combine" if name == "combine" else f"dispatch {name}"
        lines.append(_row(f"peer copy ({name} bytes)", nbytes, copy_s, copy_s))
        lines.append(_row(f"NCCL all_to_all_single ({name} bytes)", nbytes, nccl_s, copy_s, nccl_s))
        eager = _time(calls[name], iters)
        lines.append(_row(op, nbytes, eager, copy_s, nccl_s, _host_times(calls[name], res.pool)))
        replay = _graph(calls[name])
        if replay is not None:
            lines.append(_row(f"{op}, CUDA graph replay", nbytes, _time(replay, iters), copy_s, nccl_s))
    unfused = _time(_unfused_dispatch(x, ids, experts, alignment), iters)
    fused = _time(calls["mxfp8"], iters)
    lines.append(
        f"fused mxfp8 dispatch {fused * 1e6:.0f} us vs unfused chain {unfused * 1e6:.0f} us: "
        f"{unfused / fused:.2f}x"
    )
    return lines


def _peak_gib(step) -> float:
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - held) / 2**30


def layer_rows(
    tokens: int, hidden: int, expert_hidden: int, topk: int, experts: int, iters: int
) -> list[str]:
    """``MoELayer`` forward + backward per recipe against the bf16 chain (bench/common/moe_chain.py)
    with the same router and expert weights, and each step's peak memory."""
    from bench.common.moe_chain import bf16_chain
    from torch_bindings import MoELayer

    rank = dist.get_rank()
    torch.manual_seed(1000 + rank)  # each rank's experts differ; the router is broadcast below
    layers = {
        r: MoELayer(hidden, expert_hidden, experts, topk, recipe=r, group=dist.group.WORLD, device="cuda")
        for r in ("bf16", "fp8_rowwise")
    }
    dist.broadcast(layers["bf16"].router.weight.data, 0)
    for layer in layers.values():
        layer.load_state_dict(layers["bf16"].state_dict())
    x = torch.randn(tokens, hidden, device="cuda").bfloat16().requires_grad_()
    g = torch.randn(tokens, hidden, device="cuda").bfloat16()

    def step(forward, layer):
        def run():
            layer.zero_grad(set_to_none=True)
            x.grad = None
            forward(x).backward(g)

        return run

    steps = {
        "bf16 chain (all_to_all_single, permute, bf16 experts)": step(
            lambda a: bf16_chain(layers["bf16"], a), layers["bf16"]
        ),
        "MoELayer bf16": step(layers["bf16"], layers["bf16"]),
        "MoELayer fp8_rowwise": step(layers["fp8_rowwise"], layers["fp8_rowwise"]),
    }
    timed = {name: _time(run, iters) for name, run in steps.items()}
    peaks = {name: _peak_gib(run) for name, run in steps.items()}
    base = timed[next(iter(steps))]
    lines = [
        f"\n### MoE layer fwd+bwd: T={tokens}/rank D={hidden} H={expert_hidden} k={topk} E={experts} "
        f"({dist.get_world_size()} ranks, {torch.cuda.get_device_name()})",
        "| layer | ms | vs bf16 chain | peak GiB (rank 0) |",
        "|---|---|---|---|",
    ]
    for name, seconds in timed.items():
        lines.append(f"| {name} | {seconds * 1e3:.2f} | {base / seconds:.2f} | {peaks[name]:.1f} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--hidden", type=int, default=7168)
    parser.add_argument("--topk", type=int, default=8)
    parser.add_argument("--experts", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--alignment", type=int, default=32)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--expert-hidden", type=int, default=2048, help="H of the MoE layer rows")
    parser.add_argument("--layer-experts", type=int, default=64, help="E of the MoE layer rows (0: none)")
    parser.add_argument(
        "--host-profile",
        type=int,
        default=0,
        metavar="CALLS",
        help="also time the host steps of CALLS eager calls",
    )
    args = parser.parse_args(argv)
    if "WORLD_SIZE" not in os.environ or not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        print(
            "error: bench_ep needs >= 2 CUDA GPUs, one process each: "
            "torchrun --nproc-per-node N -m bench.bench_ep",
            file=sys.stderr,
        )
        return 2
    dist.init_process_group("nccl")
    torch.cuda.set_device(dist.get_rank() % torch.cuda.device_count())
    for experts in args.experts:
        lines = transfer_rows(args.tokens, args.hidden, args.topk, experts, args.alignment, args.iters)
        if dist.get_rank() == 0:
            print("\n".join(lines), flush=True)
    if args.host_profile:
        text = host_profile(
            args.tokens, args.hidden, args.topk, args.experts[0], args.alignment, args.host_profile
        )
        if dist.get_rank() == 0:
            print(text, flush=True)
    if args.layer_experts:
        lines = layer_rows(
            args.tokens, args.hidden, args.expert_hidden, args.topk, args.layer_experts, args.iters
        )
        if dist.get_rank() == 0:
            print("\n".join(lines), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
