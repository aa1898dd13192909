"""Expert-parallel dispatch and combine (``torch_bindings.ep``) across GPUs, one process per GPU:

    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \\
        torchrun --nproc-per-node 2 -m bench.bench_ep [--tokens 8192 --hidden 7168 --topk 8 --experts 64 256]

Per GPU, in one run: dispatch (mxfp8, bf16) and combine GB/s (bytes this rank sends, itself
included, / time; the slowest rank's time), next to a peer copy of the same bytes through the same
symmetric-memory mappings (``copy_`` to each rank's buffer in turn) and NCCL ``all_to_all_single``
of the same bytes; and the fused MXFP8 dispatch against the unfused chain it replaces (permute by
rank, a host read of the split sizes, bf16 ``all_to_all_single``, permute by expert,
``pad_and_quantize_mxfp8_2d``). Routing: k distinct uniform experts per token. Multicast stays off.
"""

from __future__ import annotations

import argparse
import os

for _name, _value in (
    ("NCCL_NVLS_ENABLE", "0"),
    ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
    ("NVSHMEM_DISABLE_NVLS", "1"),
):
    os.environ.setdefault(_name, _value)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

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


def _row(name: str, nbytes: int, seconds: float, copy_s: float) -> str:
    gbps = nbytes / seconds / 1e9
    return f"| {name} | {nbytes / 1e6:.1f} | {seconds * 1e6:.0f} | {gbps:.0f} | {copy_s / seconds:.2f} |"


def bench(tokens: int, hidden: int, topk: int, experts: int, alignment: int, iters: int) -> list[str]:
    rank = dist.get_rank()
    gen = torch.Generator(device="cuda").manual_seed(rank)
    x = torch.randn(tokens, hidden, device="cuda", generator=gen).bfloat16()
    ids = torch.rand(tokens, experts, device="cuda", generator=gen).topk(topk, dim=1).indices
    w = torch.rand(tokens, topk, device="cuda", generator=gen)
    pairs = tokens * topk
    mx_bytes = pairs * (hidden + hidden // 32 + 4)
    bf_bytes = pairs * (2 * hidden + 4)
    back_bytes = pairs * 2 * hidden
    res = ep.dispatch(x, ids, num_experts=experts)
    y = torch.randn(res.q.shape[0], hidden, device="cuda").bfloat16()
    timings = {
        "copy_mx": _time(_peer_copy(mx_bytes), iters),
        "nccl_mx": _time(_all_to_all(mx_bytes), iters),
        "dispatch_mx": _time(lambda: ep.dispatch(x, ids, num_experts=experts), iters),
        "copy_bf": _time(_peer_copy(bf_bytes), iters),
        "dispatch_bf": _time(lambda: ep.dispatch(x, ids, num_experts=experts, recipe="bf16"), iters),
        "copy_back": _time(_peer_copy(back_bytes), iters),
        "nccl_back": _time(_all_to_all(back_bytes), iters),
        "combine": _time(lambda: ep.combine(y, res, w), iters),
        "unfused": _time(_unfused_dispatch(x, ids, experts, alignment), iters),
    }
    graphed = {
        "dispatch_mx": _graph(lambda: ep.dispatch(x, ids, num_experts=experts)),
        "combine": _graph(lambda: ep.combine(y, res, w)),
    }
    for name, replay in graphed.items():
        timings[name + "_graph"] = _time(replay, iters) if replay is not None else float("nan")
    t = timings
    return [
        f"\n### T={tokens} D={hidden} k={topk} E={experts} "
        f"({dist.get_world_size()} ranks, {torch.cuda.get_device_name()})",
        "| op | MB sent / rank | time us | GB/s / GPU | ratio to peer copy |",
        "|---|---|---|---|---|",
        _row("peer copy (mxfp8 bytes)", mx_bytes, t["copy_mx"], t["copy_mx"]),
        _row("NCCL all_to_all_single (mxfp8 bytes)", mx_bytes, t["nccl_mx"], t["copy_mx"]),
        _row("dispatch mxfp8", mx_bytes, t["dispatch_mx"], t["copy_mx"]),
        _row("peer copy (bf16 bytes)", bf_bytes, t["copy_bf"], t["copy_bf"]),
        _row("dispatch bf16", bf_bytes, t["dispatch_bf"], t["copy_bf"]),
        _row("peer copy (combine bytes)", back_bytes, t["copy_back"], t["copy_back"]),
        _row("NCCL all_to_all_single (combine bytes)", back_bytes, t["nccl_back"], t["copy_back"]),
        _row("combine", back_bytes, t["combine"], t["copy_back"]),
        _row("dispatch mxfp8, CUDA graph replay", mx_bytes, t["dispatch_mx_graph"], t["copy_mx"]),
        _row("combine, CUDA graph replay", back_bytes, t["combine_graph"], t["copy_back"]),
        f"fused mxfp8 dispatch {t['dispatch_mx'] * 1e6:.0f} us vs unfused chain {t['unfused'] * 1e6:.0f} us: "
        f"{t['unfused'] / t['dispatch_mx']:.2f}x",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--hidden", type=int, default=7168)
    parser.add_argument("--topk", type=int, default=8)
    parser.add_argument("--experts", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--alignment", type=int, default=32)
    parser.add_argument("--iters", type=int, default=10)
    args = parser.parse_args()
    if "WORLD_SIZE" not in os.environ or not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        print("bench_ep: needs >= 2 GPUs, one process each: torchrun --nproc-per-node N -m bench.bench_ep")
        return
    dist.init_process_group("nccl")
    torch.cuda.set_device(dist.get_rank() % torch.cuda.device_count())
    for experts in args.experts:
        lines = bench(args.tokens, args.hidden, args.topk, experts, args.alignment, args.iters)
        if dist.get_rank() == 0:
            print("\n".join(lines), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
